// Command kubelet-grpc plays kubelet on steward's node-local gRPC wires,
// with kubelet's own generated Go code (k8s.io/kubelet) and grpc-go, dialing
// the way kubelet 1.3x dials:
//
//	kubelet-grpc deviceplugin -dir D [-podresources-socket S] -devices N -namespace NS -pod P [-prestart]
//	    kubelet's device manager: serves Registration on D/kubelet.sock, takes
//	    the plugin's Register, dials its endpoint, follows ListAndWatch until
//	    N healthy devices, GetPreferredAllocation (when the plugin offers
//	    it), Allocate, PreStartContainer (when required); with -podresources-socket
//	    also serves kubelet's pod resources v1 with what it allocated, the
//	    way kubelet reports it. Keeps serving until stdin closes.
//	kubelet-grpc podresources -socket S [-namespace NS -pod P]
//	    a pod resources v1 client: List, Get, GetAllocatableResources.
//	kubelet-grpc podresources-server -socket S [-cpus 0,1,...]
//	    kubelet's pod resources v1 server with no pod: GetAllocatableResources
//	    lists -cpus as cpu_ids, as kubelet's CPU manager answers it (none
//	    with policy none; its allocatable CPUs with policy static). Keeps
//	    serving until stdin closes.
//	kubelet-grpc dra -registration-socket R [-driver D] [-register] [-prepare|-unprepare] -claim NS/NAME/UID...
//	    kubelet's plugin watcher and DRA manager: GetInfo,
//	    NotifyRegistrationStatus, NodePrepareResources, NodeUnprepareResources.
//
// Every step prints one JSON line on stdout ({"event": ..., ...}); a
// protocol violation — an answer kubelet would refuse — prints
// {"event":"violation","message":...} and exits 2; a failed call exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	reg "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	pr "k8s.io/kubelet/pkg/apis/podresources/v1"
)

var out = json.NewEncoder(os.Stdout)
var outMu sync.Mutex

func emit(event string, fields map[string]interface{}) {
	if fields == nil {
		fields = map[string]interface{}{}
	}
	fields["event"] = event
	outMu.Lock()
	defer outMu.Unlock()
	_ = out.Encode(fields)
}

func violation(format string, args ...interface{}) {
	msg := fmt.Sprintf(format, args...)
	emit("violation", map[string]interface{}{"message": msg})
	fmt.Fprintln(os.Stderr, "protocol violation:", msg)
	os.Exit(2)
}

func fail(what string, err error) {
	emit("error", map[string]interface{}{"step": what, "message": err.Error()})
	fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
	os.Exit(1)
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kubelet-grpc deviceplugin|podresources|podresources-server|dra [flags]")
		os.Exit(64)
	}
	switch os.Args[1] {
	case "deviceplugin":
		devicePlugin(os.Args[2:])
	case "podresources":
		podResources(os.Args[2:])
	case "podresources-server":
		podResourcesServer(os.Args[2:])
	case "dra":
		dra(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n", os.Args[1])
		os.Exit(64)
	}
}

// dialUnix dials a plugin socket the way kubelet's device manager
// (devicemanager/plugin/v1beta1/client.go) and plugin watcher
// (pluginmanager/operationexecutor) do: a bare path as target (the
// passthrough resolver), a unix context dialer, blocking until connected,
// and `:authority: localhost`, which kubelet sets since grpc-go started
// sending the socket path as the authority.
func dialUnix(path string, timeout time.Duration) (*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	//nolint:staticcheck // kubelet still uses DialContext + WithBlock here.
	return grpc.DialContext(ctx, path,
		grpc.WithAuthority("localhost"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

func listenUnix(path string) net.Listener {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fail("mkdir", err)
	}
	_ = os.Remove(path)
	l, err := net.Listen("unix", path)
	if err != nil {
		fail("listen "+path, err)
	}
	return l
}

// ---- device plugin ---------------------------------------------------------

type registration struct {
	dp.UnimplementedRegistrationServer
	requests chan *dp.RegisterRequest
}

// Register validates as kubelet's device manager does
// (ManagerImpl.Register / isVersionCompatibleWithPlugin and the extended
// resource name check) and hands the request on.
func (r *registration) Register(ctx context.Context, req *dp.RegisterRequest) (*dp.Empty, error) {
	ok := false
	for _, v := range dp.SupportedVersions {
		if req.Version == v {
			ok = true
		}
	}
	if !ok {
		return nil, fmt.Errorf("requested API version %q is not supported by kubelet. Supported versions are %q", req.Version, dp.SupportedVersions)
	}
	if !isExtendedResourceName(req.ResourceName) {
		return nil, fmt.Errorf("invalid name of device plugin socket: %q is not an extended resource name", req.ResourceName)
	}
	if req.Endpoint == "" || filepath.Base(req.Endpoint) != req.Endpoint {
		return nil, fmt.Errorf("invalid endpoint %q: a socket name in the device plugin directory", req.Endpoint)
	}
	select {
	case r.requests <- req:
	default:
		// Re-registrations after the first are accepted and ignored here.
	}
	return &dp.Empty{}, nil
}

// isExtendedResourceName: a qualified name with a domain outside
// kubernetes.io (kubelet's v1helper.IsExtendedResourceName).
func isExtendedResourceName(name string) bool {
	i := strings.Index(name, "/")
	if i <= 0 || i == len(name)-1 || strings.Count(name, "/") != 1 {
		return false
	}
	domain := name[:i]
	return domain != "kubernetes.io" && !strings.HasSuffix(domain, ".kubernetes.io") && !strings.HasPrefix(name, "requests.")
}

// allocations is what this kubelet allocated, served on its pod resources
// socket the way kubelet's podresources v1 server reports it.
type allocations struct {
	pr.UnimplementedPodResourcesListerServer
	mu          sync.Mutex
	pods        map[[2]string]map[string]map[string][]string // (ns, name) -> container -> resource -> ids
	allocatable map[string][]string                          // resource -> healthy ids
	cpus        []int64                                      // the CPU manager's allocatable CPUs
}

func (a *allocations) podResources(key [2]string) *pr.PodResources {
	p := &pr.PodResources{Namespace: key[0], Name: key[1]}
	containers := a.pods[key]
	names := make([]string, 0, len(containers))
	for c := range containers {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		cr := &pr.ContainerResources{Name: c}
		for res, ids := range containers[c] {
			cr.Devices = append(cr.Devices, &pr.ContainerDevices{ResourceName: res, DeviceIds: ids})
		}
		p.Containers = append(p.Containers, cr)
	}
	return p
}

func (a *allocations) List(ctx context.Context, req *pr.ListPodResourcesRequest) (*pr.ListPodResourcesResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &pr.ListPodResourcesResponse{}
	for key := range a.pods {
		resp.PodResources = append(resp.PodResources, a.podResources(key))
	}
	return resp, nil
}

func (a *allocations) Get(ctx context.Context, req *pr.GetPodResourcesRequest) (*pr.GetPodResourcesResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := [2]string{req.PodNamespace, req.PodName}
	if _, ok := a.pods[key]; !ok {
		return nil, fmt.Errorf("pod %s not found in namespace %s", req.PodName, req.PodNamespace)
	}
	return &pr.GetPodResourcesResponse{PodResources: a.podResources(key)}, nil
}

func (a *allocations) GetAllocatableResources(ctx context.Context, req *pr.AllocatableResourcesRequest) (*pr.AllocatableResourcesResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	resp := &pr.AllocatableResourcesResponse{CpuIds: a.cpus}
	for res, ids := range a.allocatable {
		resp.Devices = append(resp.Devices, &pr.ContainerDevices{ResourceName: res, DeviceIds: ids})
	}
	return resp, nil
}

func podResourcesServer(args []string) {
	fs := flag.NewFlagSet("podresources-server", flag.ExitOnError)
	socket := fs.String("socket", "", "serve kubelet's pod resources v1 here")
	cpus := fs.String("cpus", "", "comma separated CPU ids GetAllocatableResources lists")
	_ = fs.Parse(args)
	if *socket == "" {
		fail("flags", errors.New("-socket is required"))
	}
	state := &allocations{pods: map[[2]string]map[string]map[string][]string{}, allocatable: map[string][]string{}}
	for _, c := range strings.Split(*cpus, ",") {
		if c == "" {
			continue
		}
		n, err := strconv.ParseInt(c, 10, 64)
		if err != nil {
			fail("flags", err)
		}
		state.cpus = append(state.cpus, n)
	}
	srv := grpc.NewServer()
	pr.RegisterPodResourcesListerServer(srv, state)
	l := listenUnix(*socket)
	go func() { _ = srv.Serve(l) }()
	emit("listening", map[string]interface{}{"socket": *socket, "cpus": state.cpus})
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func devicePlugin(args []string) {
	fs := flag.NewFlagSet("deviceplugin", flag.ExitOnError)
	dir := fs.String("dir", "", "the device plugin directory (kubelet.sock is served here)")
	podres := fs.String("podresources-socket", "", "serve kubelet's pod resources v1 here")
	want := fs.Int("devices", 1, "wait until ListAndWatch lists this many healthy devices")
	ns := fs.String("namespace", "default", "namespace of the pod the device is allocated to")
	pod := fs.String("pod", "web", "name of the pod the device is allocated to")
	container := fs.String("container", "main", "container the device is allocated to")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	prestart := fs.Bool("prestart", false, "call PreStartContainer even when the plugin does not require it (kubelet calls it only when required)")
	_ = fs.Parse(args)
	if *dir == "" {
		fail("flags", errors.New("-dir is required"))
	}
	deadline := time.Now().Add(*timeout)
	go func() {
		time.Sleep(time.Until(deadline))
		emit("timeout", nil)
		os.Exit(3)
	}()

	state := &allocations{pods: map[[2]string]map[string]map[string][]string{}, allocatable: map[string][]string{}}
	if *podres != "" {
		srv := grpc.NewServer()
		pr.RegisterPodResourcesListerServer(srv, state)
		l := listenUnix(*podres)
		go func() { _ = srv.Serve(l) }()
	}
	regSrv := &registration{requests: make(chan *dp.RegisterRequest, 1)}
	srv := grpc.NewServer()
	dp.RegisterRegistrationServer(srv, regSrv)
	l := listenUnix(filepath.Join(*dir, "kubelet.sock"))
	go func() { _ = srv.Serve(l) }()
	emit("listening", map[string]interface{}{"socket": filepath.Join(*dir, "kubelet.sock")})

	req := <-regSrv.requests
	opts := req.Options
	if opts == nil {
		opts = &dp.DevicePluginOptions{}
	}
	emit("registered", map[string]interface{}{
		"version": req.Version, "endpoint": req.Endpoint, "resource": req.ResourceName,
		"pre_start_required": opts.PreStartRequired, "preferred_allocation": opts.GetPreferredAllocationAvailable,
	})
	resource := req.ResourceName

	// kubelet dials the plugin right after Register returns
	// (ManagerImpl.registerEndpoint → newEndpointImpl → dial).
	conn, err := dialUnix(filepath.Join(*dir, req.Endpoint), 10*time.Second)
	if err != nil {
		fail("dial plugin", err)
	}
	client := dp.NewDevicePluginClient(conn)
	// kubelet uses the options sent with Register; a plugin must answer
	// GetDevicePluginOptions with the same.
	got, err := client.GetDevicePluginOptions(context.Background(), &dp.Empty{})
	if err != nil {
		fail("GetDevicePluginOptions", err)
	}
	if got.PreStartRequired != opts.PreStartRequired || got.GetPreferredAllocationAvailable != opts.GetPreferredAllocationAvailable {
		violation("GetDevicePluginOptions %v differs from the options sent with Register %v", got, opts)
	}

	stream, err := client.ListAndWatch(context.Background(), &dp.Empty{})
	if err != nil {
		fail("ListAndWatch", err)
	}
	healthyCh := make(chan []string, 16)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				if err == io.EOF || status.Code(err) == codes.Canceled || status.Code(err) == codes.Unavailable {
					emit("stream-closed", map[string]interface{}{"message": fmt.Sprint(err)})
					return
				}
				fail("ListAndWatch recv", err)
			}
			var devices []map[string]interface{}
			var healthy []string
			seen := map[string]bool{}
			for _, d := range resp.Devices {
				if d.ID == "" {
					violation("ListAndWatch sent a device without an ID")
				}
				if seen[d.ID] {
					violation("ListAndWatch sent device %q twice", d.ID)
				}
				seen[d.ID] = true
				if d.Health != dp.Healthy && d.Health != dp.Unhealthy {
					violation("device %q has health %q, not %q or %q", d.ID, d.Health, dp.Healthy, dp.Unhealthy)
				}
				if d.Health == dp.Healthy {
					healthy = append(healthy, d.ID)
				}
				devices = append(devices, map[string]interface{}{"id": d.ID, "health": d.Health})
			}
			sort.Strings(healthy)
			state.mu.Lock()
			state.allocatable[resource] = healthy
			state.mu.Unlock()
			emit("devices", map[string]interface{}{"resource": resource, "devices": devices})
			healthyCh <- healthy
		}
	}()
	var healthy []string
	for len(healthy) < *want {
		healthy = <-healthyCh
	}
	go func() {
		for range healthyCh {
		}
	}()

	// One container asking for one device, as the device manager's
	// devicesToAllocate does.
	chosen := []string{healthy[0]}
	if opts.GetPreferredAllocationAvailable {
		resp, err := client.GetPreferredAllocation(context.Background(), &dp.PreferredAllocationRequest{
			ContainerRequests: []*dp.ContainerPreferredAllocationRequest{{
				AvailableDeviceIDs: healthy, AllocationSize: 1,
			}},
		})
		if err != nil {
			fail("GetPreferredAllocation", err)
		}
		if len(resp.ContainerResponses) != 1 {
			violation("GetPreferredAllocation answered %d container responses for 1 request", len(resp.ContainerResponses))
		}
		pref := resp.ContainerResponses[0].DeviceIDs
		emit("preferred", map[string]interface{}{"available": healthy, "preferred": pref})
		for _, id := range pref {
			if !contains(healthy, id) {
				violation("GetPreferredAllocation preferred %q, not among the available %v", id, healthy)
			}
		}
		// kubelet uses the preference only when it has the asked size.
		if len(pref) == 1 {
			chosen = pref
		}
	}

	areq := &dp.AllocateRequest{ContainerRequests: []*dp.ContainerAllocateRequest{{DevicesIDs: chosen}}}
	aresp, err := client.Allocate(context.Background(), areq)
	if err != nil {
		fail("Allocate", err)
	}
	// kubelet: "no containers return in allocation response" and one
	// response per container request.
	if len(aresp.ContainerResponses) != len(areq.ContainerRequests) {
		violation("Allocate answered %d container responses for %d container requests", len(aresp.ContainerResponses), len(areq.ContainerRequests))
	}
	cr := aresp.ContainerResponses[0]
	var cdi []string
	for _, d := range cr.CDIDevices {
		if !strings.Contains(d.Name, "=") {
			violation("CDI device %q is not a fully qualified CDI name", d.Name)
		}
		cdi = append(cdi, d.Name)
	}
	var mounts, devs []string
	for _, m := range cr.Mounts {
		mounts = append(mounts, m.HostPath+":"+m.ContainerPath)
	}
	for _, d := range cr.Devices {
		devs = append(devs, d.HostPath+":"+d.ContainerPath)
	}
	emit("allocated", map[string]interface{}{
		"resource": resource, "devices": chosen, "envs": cr.Envs, "annotations": cr.Annotations,
		"cdi_devices": cdi, "mounts": mounts, "device_specs": devs,
	})
	// kubelet records the allocation (checkpoint, then pod resources).
	state.mu.Lock()
	state.pods[[2]string{*ns, *pod}] = map[string]map[string][]string{*container: {resource: chosen}}
	state.mu.Unlock()

	if opts.PreStartRequired || *prestart {
		if _, err := client.PreStartContainer(context.Background(), &dp.PreStartContainerRequest{DevicesIDs: chosen}); err != nil {
			fail("PreStartContainer", err)
		}
		emit("prestarted", map[string]interface{}{"devices": chosen, "required": opts.PreStartRequired})
	}
	emit("ready", nil)
	// Serve (pod resources, the ListAndWatch stream) until the test closes stdin.
	_, _ = io.Copy(io.Discard, os.Stdin)
	emit("done", nil)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ---- pod resources -----------------------------------------------------------

func podResources(args []string) {
	fs := flag.NewFlagSet("podresources", flag.ExitOnError)
	socket := fs.String("socket", "", "the pod resources socket")
	ns := fs.String("namespace", "", "Get this pod's resources (with -pod)")
	pod := fs.String("pod", "", "Get this pod's resources")
	_ = fs.Parse(args)
	// kubelet's podresources.GetV1Client: "unix://" path through
	// util.GetAddressAndDialer — the bare path as passthrough target, a unix
	// dialer, a connection timeout and a 16 MiB receive limit.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	//nolint:staticcheck // as kubelet's client.
	conn, err := grpc.DialContext(ctx, strings.TrimPrefix(*socket, "unix://"),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16*1024*1024)),
	)
	if err != nil {
		fail("dial", err)
	}
	client := pr.NewPodResourcesListerClient(conn)

	list, err := client.List(ctx, &pr.ListPodResourcesRequest{})
	if err != nil {
		fail("List", err)
	}
	var pods []interface{}
	for _, p := range list.PodResources {
		if p == nil || p.Name == "" || p.Namespace == "" {
			violation("List answered a pod without name or namespace: %v", p)
		}
		pods = append(pods, podJSON(p))
	}
	emit("list", map[string]interface{}{"pods": pods})

	if *pod != "" {
		got, err := client.Get(ctx, &pr.GetPodResourcesRequest{PodName: *pod, PodNamespace: *ns})
		if err != nil {
			emit("get-error", map[string]interface{}{"code": status.Code(err).String(), "message": status.Convert(err).Message()})
		} else {
			p := got.PodResources
			if p == nil || p.Name != *pod || p.Namespace != *ns {
				violation("Get(%s/%s) answered another pod: %v", *ns, *pod, p)
			}
			emit("get", map[string]interface{}{"pod": podJSON(p)})
		}
	}

	alloc, err := client.GetAllocatableResources(ctx, &pr.AllocatableResourcesRequest{})
	if err != nil {
		fail("GetAllocatableResources", err)
	}
	var devices []interface{}
	for _, d := range alloc.Devices {
		if d.ResourceName == "" {
			violation("GetAllocatableResources answered devices without a resource name: %v", d)
		}
		devices = append(devices, map[string]interface{}{"resource": d.ResourceName, "ids": d.DeviceIds})
	}
	emit("allocatable", map[string]interface{}{"devices": devices})
}

func podJSON(p *pr.PodResources) map[string]interface{} {
	var containers []interface{}
	for _, c := range p.Containers {
		var devices []interface{}
		for _, d := range c.Devices {
			devices = append(devices, map[string]interface{}{"resource": d.ResourceName, "ids": d.DeviceIds})
		}
		containers = append(containers, map[string]interface{}{"name": c.Name, "devices": devices})
	}
	return map[string]interface{}{"namespace": p.Namespace, "name": p.Name, "containers": containers}
}

// ---- DRA -----------------------------------------------------------------------

// The v1 DRAPlugin service. k8s.io/kubelet ships no Go package for DRA v1
// here, but its messages are wire-identical to v1beta1's (same fields, same
// numbers; v1 only adds Device.share_id = 5, which v1beta1's decoder skips),
// so the v1 methods are invoked by name with the v1beta1 message types.
const draV1Service = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/"

// The service name a DRA plugin lists in its supported versions for v1
// (kubelet's drapbv1.DRAPluginService).
const draV1Version = "v1.DRAPlugin"

type claimFlags []string

func (c *claimFlags) String() string     { return strings.Join(*c, ",") }
func (c *claimFlags) Set(v string) error { *c = append(*c, v); return nil }

func dra(args []string) {
	fs := flag.NewFlagSet("dra", flag.ExitOnError)
	regSocket := fs.String("registration-socket", "", "the plugin's <name>-reg.sock in plugins_registry")
	driver := fs.String("driver", "", "expected driver name")
	register := fs.Bool("register", false, "GetInfo + NotifyRegistrationStatus, as the plugin watcher")
	prepare := fs.Bool("prepare", false, "NodePrepareResources for the claims")
	unprepare := fs.Bool("unprepare", false, "NodeUnprepareResources for the claims")
	var claims claimFlags
	fs.Var(&claims, "claim", "NAMESPACE/NAME/UID (repeatable)")
	_ = fs.Parse(args)

	conn, err := dialUnix(*regSocket, 10*time.Second)
	if err != nil {
		fail("dial registration", err)
	}
	regClient := reg.NewRegistrationClient(conn)
	info, err := regClient.GetInfo(context.Background(), &reg.InfoRequest{})
	if err != nil {
		fail("GetInfo", err)
	}
	emit("info", map[string]interface{}{"type": info.Type, "name": info.Name, "endpoint": info.Endpoint, "versions": info.SupportedVersions})
	// The plugin watcher's checks (operationexecutor.RegisterPlugin and the
	// DRA handler's ValidatePlugin).
	if info.Type != reg.DRAPlugin {
		if *register {
			_, _ = regClient.NotifyRegistrationStatus(context.Background(), &reg.RegistrationStatus{
				PluginRegistered: false, Error: fmt.Sprintf("no handler registered for plugin type: %s", info.Type),
			})
		}
		violation("GetInfo type %q, want %q", info.Type, reg.DRAPlugin)
	}
	if *driver != "" && info.Name != *driver {
		violation("GetInfo name %q, want %q", info.Name, *driver)
	}
	if !contains(info.SupportedVersions, draV1Version) {
		violation("GetInfo supported versions %q lack %q", info.SupportedVersions, draV1Version)
	}
	endpoint := info.Endpoint
	if endpoint == "" {
		endpoint = *regSocket
	}
	if *register {
		if _, err := regClient.NotifyRegistrationStatus(context.Background(), &reg.RegistrationStatus{PluginRegistered: true}); err != nil {
			fail("NotifyRegistrationStatus", err)
		}
		emit("registration-notified", map[string]interface{}{"registered": true})
	}
	_ = conn.Close()
	if !*prepare && !*unprepare {
		return
	}

	var wire []*drapb.Claim
	for _, c := range claims {
		parts := strings.SplitN(c, "/", 3)
		if len(parts) != 3 {
			fail("flags", fmt.Errorf("-claim %q is not NAMESPACE/NAME/UID", c))
		}
		wire = append(wire, &drapb.Claim{Namespace: parts[0], Name: parts[1], UID: parts[2]})
	}
	// kubelet's DRA plugin client (cm/dra/plugin): grpc.Dial of the
	// endpoint path with a unix context dialer, no authority override.
	//nolint:staticcheck // as kubelet.
	pconn, err := grpc.Dial(endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, target string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", target)
		}),
	)
	if err != nil {
		fail("dial plugin", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	if *prepare {
		resp := &drapb.NodePrepareResourcesResponse{}
		if err := pconn.Invoke(ctx, draV1Service+"NodePrepareResources", &drapb.NodePrepareResourcesRequest{Claims: wire}, resp); err != nil {
			fail("NodePrepareResources", err)
		}
		checkResults("NodePrepareResources", wire, len(resp.Claims), func(uid string) bool { _, ok := resp.Claims[uid]; return ok }, keys(resp.Claims))
		results := map[string]interface{}{}
		for _, c := range wire {
			// A map entry without a value is the default message (gogo
			// decodes it as nil); kubelet reads it with nil-safe getters.
			r := resp.Claims[c.UID]
			var devices []interface{}
			for _, d := range r.GetDevices() {
				if r.GetError() == "" && (d.PoolName == "" || d.DeviceName == "") {
					violation("claim %s: prepared device without pool or name: %v", c.UID, d)
				}
				devices = append(devices, map[string]interface{}{
					"requests": d.RequestNames, "pool": d.PoolName, "device": d.DeviceName, "cdi": d.CDIDeviceIDs,
				})
			}
			results[c.UID] = map[string]interface{}{"error": r.GetError(), "devices": devices}
		}
		emit("prepared", map[string]interface{}{"claims": results})
	}
	if *unprepare {
		resp := &drapb.NodeUnprepareResourcesResponse{}
		if err := pconn.Invoke(ctx, draV1Service+"NodeUnprepareResources", &drapb.NodeUnprepareResourcesRequest{Claims: wire}, resp); err != nil {
			fail("NodeUnprepareResources", err)
		}
		checkResults("NodeUnprepareResources", wire, len(resp.Claims), func(uid string) bool { _, ok := resp.Claims[uid]; return ok }, keys(resp.Claims))
		results := map[string]interface{}{}
		for _, c := range wire {
			results[c.UID] = map[string]interface{}{"error": resp.Claims[c.UID].GetError()}
		}
		emit("unprepared", map[string]interface{}{"claims": results})
	}
}

// checkResults: kubelet's DRA manager refuses a result for a claim it did
// not ask about ("returned result for unknown claim UID") and a response
// that leaves claims out ("left out N claims").
func checkResults(call string, asked []*drapb.Claim, n int, has func(string) bool, got []string) {
	for _, uid := range got {
		known := false
		for _, c := range asked {
			if c.UID == uid {
				known = true
			}
		}
		if !known {
			violation("%s returned result for unknown claim UID %s", call, uid)
		}
	}
	for _, c := range asked {
		if !has(c.UID) {
			violation("%s answered no result for claim %s/%s (UID %s); left out %d claims", call, c.Namespace, c.Name, c.UID, len(asked)-n)
		}
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
