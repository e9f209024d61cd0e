// Command cri-client drives a CRI endpoint with kubelet's own CRI client
// library (k8s.io/cri-client: RemoteRuntimeService and RemoteImageService,
// the code kubelet dials its container runtime with) through one pod's life:
// image status, sandbox, an exclusive-CPU container (Guaranteed QoS, whole
// CPUs, as kubelet builds it for the cgroupfs driver), exec, the streaming
// URLs, stats, update, stop and removal.
//
// Every call prints one JSON line on stdout:
//
//	{"call":"ExecSync","ok":true,"cpus_allowed_list":"1",...}
//
// The first failing call prints {"ok":false,"error":...} and the program
// exits 1. With -hold it prints {"call":"Hold",...} once the container runs
// and waits for a line on stdin before it updates, stops and removes it, so
// the caller can look at the node meanwhile.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	criclient "k8s.io/cri-client/pkg"
)

// kubelet's runtimeRequestTimeout default.
const requestTimeout = 2 * time.Minute

// kubelet's pod and container labels (pkg/kubelet/types).
const (
	labelPodName       = "io.kubernetes.pod.name"
	labelPodNamespace  = "io.kubernetes.pod.namespace"
	labelPodUID        = "io.kubernetes.pod.uid"
	labelContainerName = "io.kubernetes.container.name"
)

type options struct {
	endpoint   string
	image      string
	cgroupRoot string
	namespace  string
	name       string
	uid        string
	container  string
	cpus       int64
	memory     int64
	labels     string
	hold       bool
	streaming  bool
}

type printer struct {
	out *json.Encoder
}

func (p *printer) ok(call string, fields map[string]interface{}) {
	line := map[string]interface{}{"call": call, "ok": true}
	for k, v := range fields {
		line[k] = v
	}
	_ = p.out.Encode(line)
}

func (p *printer) fail(call string, err error) {
	_ = p.out.Encode(map[string]interface{}{"call": call, "ok": false, "error": err.Error()})
	os.Exit(1)
}

func main() {
	var o options
	flag.StringVar(&o.endpoint, "endpoint", "", "CRI endpoint, e.g. unix:///run/cri.sock")
	flag.StringVar(&o.image, "image", "", "image of the container (must be present)")
	flag.StringVar(&o.cgroupRoot, "cgroup-root", "/", "kubelet's --cgroup-root; the pod goes under <root>/kubepods/pod<uid>")
	flag.StringVar(&o.namespace, "namespace", "default", "pod namespace")
	flag.StringVar(&o.name, "name", "cri-client", "pod name")
	flag.StringVar(&o.uid, "uid", "", "pod uid (default: derived from the name)")
	flag.StringVar(&o.container, "container", "main", "container name")
	flag.Int64Var(&o.cpus, "cpus", 1, "whole CPUs requested and limited (Guaranteed QoS)")
	flag.Int64Var(&o.memory, "memory", 64<<20, "memory requested and limited, bytes")
	flag.StringVar(&o.labels, "labels", "", "extra pod labels, k=v[,k=v]")
	flag.BoolVar(&o.hold, "hold", false, "wait for a line on stdin once the container runs")
	flag.BoolVar(&o.streaming, "list-streaming", false, "use the streaming list rpcs (CRIListStreaming) with their unary fallback")
	flag.Parse()
	p := &printer{out: json.NewEncoder(os.Stdout)}
	if o.endpoint == "" || o.image == "" {
		p.fail("Flags", fmt.Errorf("-endpoint and -image are required"))
	}
	if o.uid == "" {
		o.uid = "uid-" + o.name
	}
	if err := run(context.Background(), o, p); err != nil {
		p.fail("Scenario", err)
	}
	p.ok("Done", nil)
}

func check(p *printer, call string, err error) {
	if err != nil {
		p.fail(call, err)
	}
}

func expect(p *printer, call string, cond bool, format string, args ...interface{}) {
	if !cond {
		p.fail(call, fmt.Errorf(format, args...))
	}
}

func podLabels(o options) (map[string]string, error) {
	labels := map[string]string{
		labelPodName:      o.name,
		labelPodNamespace: o.namespace,
		labelPodUID:       o.uid,
	}
	if o.labels == "" {
		return labels, nil
	}
	for _, kv := range strings.Split(o.labels, ",") {
		k, v, found := strings.Cut(kv, "=")
		if !found || k == "" {
			return nil, fmt.Errorf("label %q is not k=v", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

// sandboxConfig is what kubelet's generatePodSandboxConfig makes of a
// host-network pod with the cgroupfs driver: a Guaranteed pod's cgroup is
// <cgroup-root>/kubepods/pod<uid>.
func sandboxConfig(o options, labels map[string]string) *runtimeapi.PodSandboxConfig {
	root := strings.TrimSuffix(o.cgroupRoot, "/")
	return &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{
			Name:      o.name,
			Namespace: o.namespace,
			Uid:       o.uid,
			Attempt:   0,
		},
		Labels: labels,
		Annotations: map[string]string{
			"kubernetes.io/config.source": "api",
		},
		DnsConfig: &runtimeapi.DNSConfig{},
		Linux: &runtimeapi.LinuxPodSandboxConfig{
			CgroupParent: root + "/kubepods/pod" + o.uid,
			SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{
					Network: runtimeapi.NamespaceMode_NODE,
					Pid:     runtimeapi.NamespaceMode_CONTAINER,
					Ipc:     runtimeapi.NamespaceMode_POD,
				},
			},
			Resources: &runtimeapi.LinuxContainerResources{
				CpuShares:          o.cpus * 1024,
				CpuQuota:           o.cpus * 100000,
				CpuPeriod:          100000,
				MemoryLimitInBytes: o.memory,
			},
		},
	}
}

// containerResources is kubelet's generateLinuxContainerResources for a
// Guaranteed container of o.cpus whole CPUs and o.memory bytes (cgroup v1,
// CFS quota enforced, the Guaranteed OOM score).
func containerResources(o options) *runtimeapi.LinuxContainerResources {
	return &runtimeapi.LinuxContainerResources{
		CpuShares:          o.cpus * 1024,
		CpuQuota:           o.cpus * 100000,
		CpuPeriod:          100000,
		MemoryLimitInBytes: o.memory,
		OomScoreAdj:        -997,
	}
}

func containerConfig(o options, imageRef string, sandbox *runtimeapi.PodSandboxConfig) *runtimeapi.ContainerConfig {
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: o.container, Attempt: 0},
		Image:    &runtimeapi.ImageSpec{Image: imageRef, UserSpecifiedImage: o.image},
		Command:  []string{"sleep", "3600"},
		Labels: map[string]string{
			labelPodName:       o.name,
			labelPodNamespace:  o.namespace,
			labelPodUID:        o.uid,
			labelContainerName: o.container,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.restartCount":           "0",
			"io.kubernetes.container.terminationMessagePath": "/dev/termination-log",
		},
		Linux: &runtimeapi.LinuxContainerConfig{
			Resources: containerResources(o),
			SecurityContext: &runtimeapi.LinuxContainerSecurityContext{
				NamespaceOptions: sandbox.Linux.SecurityContext.NamespaceOptions,
			},
		},
	}
}

func statusField(status, field string) (string, bool) {
	for _, line := range strings.Split(status, "\n") {
		if rest, found := strings.CutPrefix(line, field+":"); found {
			return strings.TrimSpace(rest), true
		}
	}
	return "", false
}

func cpusAllowed(ctx context.Context, rt internalapi.RuntimeService, id string) (string, error) {
	stdout, stderr, err := rt.ExecSync(ctx, id, []string{"cat", "/proc/self/status"}, 10*time.Second)
	if err != nil {
		return "", fmt.Errorf("%w (stderr %q)", err, stderr)
	}
	cpus, found := statusField(string(stdout), "Cpus_allowed_list")
	if !found {
		return "", fmt.Errorf("no Cpus_allowed_list in %q", stdout)
	}
	return cpus, nil
}

func containerState(ctx context.Context, rt internalapi.RuntimeService, id string) (*runtimeapi.ContainerStatus, error) {
	resp, err := rt.ContainerStatus(ctx, id, false)
	if err != nil {
		return nil, err
	}
	if resp.GetStatus() == nil {
		return nil, fmt.Errorf("no status for %s", id)
	}
	return resp.GetStatus(), nil
}

func checkURL(p *printer, call, url string) {
	expect(p, call, strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://"),
		"%s answered no streaming URL: %q", call, url)
	p.ok(call, map[string]interface{}{"url": url})
}

func run(ctx context.Context, o options, p *printer) error {
	rt, err := criclient.NewRemoteRuntimeService(ctx, o.endpoint, requestTimeout, nil, o.streaming)
	check(p, "NewRemoteRuntimeService", err)
	defer rt.Close(ctx)
	img, err := criclient.NewRemoteImageService(ctx, o.endpoint, requestTimeout, nil, o.streaming)
	check(p, "NewRemoteImageService", err)
	defer img.Close(ctx)

	version, err := rt.Version(ctx, "v1")
	check(p, "Version", err)
	p.ok("Version", map[string]interface{}{
		"runtime_name":        version.RuntimeName,
		"runtime_version":     version.RuntimeVersion,
		"runtime_api_version": version.RuntimeApiVersion,
	})

	imageStatus, err := img.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: o.image}, false)
	check(p, "ImageStatus", err)
	expect(p, "ImageStatus", imageStatus.GetImage() != nil, "image %s is not present", o.image)
	imageRef := imageStatus.GetImage().GetId()
	p.ok("ImageStatus", map[string]interface{}{"id": imageRef, "repo_tags": imageStatus.GetImage().GetRepoTags()})

	labels, err := podLabels(o)
	check(p, "Flags", err)
	sandbox := sandboxConfig(o, labels)
	sandboxID, err := rt.RunPodSandbox(ctx, sandbox, "")
	check(p, "RunPodSandbox", err)
	p.ok("RunPodSandbox", map[string]interface{}{"id": sandboxID, "cgroup_parent": sandbox.Linux.CgroupParent})

	sbStatus, err := rt.PodSandboxStatus(ctx, sandboxID, false)
	check(p, "PodSandboxStatus", err)
	expect(p, "PodSandboxStatus", sbStatus.GetStatus().GetState() == runtimeapi.PodSandboxState_SANDBOX_READY,
		"sandbox %s is %s", sandboxID, sbStatus.GetStatus().GetState())
	p.ok("PodSandboxStatus", map[string]interface{}{"state": sbStatus.GetStatus().GetState().String()})

	sandboxes, err := rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{labelPodUID: o.uid},
	})
	check(p, "ListPodSandbox", err)
	expect(p, "ListPodSandbox", len(sandboxes) == 1 && sandboxes[0].Id == sandboxID,
		"the pod's uid selects %d sandboxes, not just %s", len(sandboxes), sandboxID)
	p.ok("ListPodSandbox", map[string]interface{}{"count": len(sandboxes)})

	containerID, err := rt.CreateContainer(ctx, sandboxID, containerConfig(o, imageRef, sandbox), sandbox)
	check(p, "CreateContainer", err)
	p.ok("CreateContainer", map[string]interface{}{"id": containerID})

	check(p, "StartContainer", rt.StartContainer(ctx, containerID))
	p.ok("StartContainer", nil)

	cs, err := containerState(ctx, rt, containerID)
	check(p, "ContainerStatus", err)
	expect(p, "ContainerStatus", cs.State == runtimeapi.ContainerState_CONTAINER_RUNNING,
		"container %s is %s", containerID, cs.State)
	p.ok("ContainerStatus", map[string]interface{}{
		"state":       cs.State.String(),
		"cpuset_cpus": cs.GetResources().GetLinux().GetCpusetCpus(),
	})

	containers, err := rt.ListContainers(ctx, &runtimeapi.ContainerFilter{
		PodSandboxId:  sandboxID,
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{labelContainerName: o.container},
	})
	check(p, "ListContainers", err)
	expect(p, "ListContainers", len(containers) == 1 && containers[0].Id == containerID,
		"the filter selects %d containers, not just %s", len(containers), containerID)
	p.ok("ListContainers", map[string]interface{}{"count": len(containers)})

	cpus, err := cpusAllowed(ctx, rt, containerID)
	check(p, "ExecSync", err)
	p.ok("ExecSync", map[string]interface{}{"cpus_allowed_list": cpus})

	if o.hold {
		p.ok("Hold", map[string]interface{}{"container_id": containerID, "sandbox_id": sandboxID})
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			p.fail("Hold", fmt.Errorf("reading stdin: %w", err))
		}
	}

	// kubelet resizing in place sends the container's whole resources again.
	check(p, "UpdateContainerResources", rt.UpdateContainerResources(ctx, containerID,
		&runtimeapi.ContainerResources{Linux: containerResources(o)}))
	cpus, err = cpusAllowed(ctx, rt, containerID)
	check(p, "UpdateContainerResources", err)
	p.ok("UpdateContainerResources", map[string]interface{}{"cpus_allowed_list": cpus})

	exec, err := rt.Exec(ctx, &runtimeapi.ExecRequest{
		ContainerId: containerID, Cmd: []string{"sh"}, Stdin: true, Stdout: true, Stderr: true,
	})
	check(p, "Exec", err)
	checkURL(p, "Exec", exec.GetUrl())
	attach, err := rt.Attach(ctx, &runtimeapi.AttachRequest{
		ContainerId: containerID, Stdout: true, Stderr: true,
	})
	check(p, "Attach", err)
	checkURL(p, "Attach", attach.GetUrl())
	forward, err := rt.PortForward(ctx, &runtimeapi.PortForwardRequest{PodSandboxId: sandboxID, Port: []int32{8080}})
	check(p, "PortForward", err)
	checkURL(p, "PortForward", forward.GetUrl())

	stats, err := rt.ContainerStats(ctx, containerID)
	check(p, "ContainerStats", err)
	expect(p, "ContainerStats", stats.GetAttributes().GetId() == containerID,
		"stats of %q, not %s", stats.GetAttributes().GetId(), containerID)
	expect(p, "ContainerStats", stats.GetCpu() != nil && stats.GetMemory() != nil, "no CPU or memory stats")
	p.ok("ContainerStats", map[string]interface{}{"memory_working_set_bytes": stats.GetMemory().GetWorkingSetBytes().GetValue()})
	allStats, err := rt.ListContainerStats(ctx, &runtimeapi.ContainerStatsFilter{PodSandboxId: sandboxID})
	check(p, "ListContainerStats", err)
	expect(p, "ListContainerStats", len(allStats) == 1 && allStats[0].GetAttributes().GetId() == containerID,
		"%d stats for the pod, not just %s", len(allStats), containerID)
	p.ok("ListContainerStats", map[string]interface{}{"count": len(allStats)})

	check(p, "StopContainer", rt.StopContainer(ctx, containerID, 10))
	cs, err = containerState(ctx, rt, containerID)
	check(p, "StopContainer", err)
	expect(p, "StopContainer", cs.State == runtimeapi.ContainerState_CONTAINER_EXITED,
		"container %s is %s after StopContainer", containerID, cs.State)
	p.ok("StopContainer", map[string]interface{}{"state": cs.State.String()})

	check(p, "RemoveContainer", rt.RemoveContainer(ctx, containerID))
	_, err = rt.ContainerStatus(ctx, containerID, false)
	expect(p, "RemoveContainer", status.Code(err) == codes.NotFound,
		"ContainerStatus of the removed container answered %v", err)
	p.ok("RemoveContainer", nil)

	check(p, "StopPodSandbox", rt.StopPodSandbox(ctx, sandboxID))
	sbStatus, err = rt.PodSandboxStatus(ctx, sandboxID, false)
	check(p, "StopPodSandbox", err)
	expect(p, "StopPodSandbox", sbStatus.GetStatus().GetState() == runtimeapi.PodSandboxState_SANDBOX_NOTREADY,
		"sandbox %s is %s after StopPodSandbox", sandboxID, sbStatus.GetStatus().GetState())
	p.ok("StopPodSandbox", map[string]interface{}{"state": sbStatus.GetStatus().GetState().String()})

	check(p, "RemovePodSandbox", rt.RemovePodSandbox(ctx, sandboxID))
	sandboxes, err = rt.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{labelPodUID: o.uid},
	})
	check(p, "RemovePodSandbox", err)
	expect(p, "RemovePodSandbox", len(sandboxes) == 0, "%d sandboxes left for the pod", len(sandboxes))
	p.ok("RemovePodSandbox", nil)
	return nil
}
