// Command scheduler-extender is kube-scheduler's side of the extender
// protocol, for tests: it schedules the pods of a scenario through one
// HTTP extender the way kube-scheduler's HTTPExtender and
// findNodesThatPassExtenders / prioritizeNodes (pkg/scheduler/schedule_one.go)
// do, with the request bytes
// encoding/json writes for kube-scheduler's own types
// (k8s.io/kube-scheduler/extender/v1, see types.go) and k8s.io/api's Pod,
// Node and NodeList, quantities parsed by resource.ParseQuantity.
//
// It prints one JSON line per call (filter, prioritize, reserve,
// unreserve) and one per pod ("schedule": the chosen node or why none),
// and exits 1 if the extender broke the protocol (non-200, an answer that
// does not decode or has keys kube-scheduler drops, a node outside the
// input, an answer in a form kube-scheduler does not read), 2 on a bad
// scenario.
//
// With a "race" in the scenario it runs kube-scheduler replicas against
// extender replicas at once and prints a summary instead (race.go).
//
// Usage:
//
//	scheduler-extender -scenario file.json   ("-": standard input)
//	scheduler-extender -url http://host:port -pod default/p1 -uid U \
//	    -ask steward.dev/cam=1 -nodes n1,n2,n3 [-node-cache-capable=false]
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Scenario is what the test asks for.
type Scenario struct {
	Extender ExtenderConfig `json:"extender"`
	// Nodes: every node the scheduler knows (the Node objects sent when
	// not nodeCacheCapable). A pod's candidates are a subset.
	Nodes []NodeSpec `json:"nodes"`
	Pods  []PodCase  `json:"pods"`
	// Concurrency: pods scheduled at once (several scheduler replicas or
	// profiles); 1 (the default) is one scheduler's queue.
	Concurrency int `json:"concurrency"`
	// Race: run the pods as a race of Concurrency schedulers (race.go).
	Race *RaceConfig `json:"race"`
}

// NodeSpec is a Node the scheduler has in its cache.
type NodeSpec struct {
	Name        string            `json:"name"`
	Allocatable map[string]string `json:"allocatable"`
}

// ContainerAsk is a container's resources, quantities as strings ("1",
// "1k", "1e3", "500m", "2Gi").
type ContainerAsk struct {
	Name     string            `json:"name"`
	Requests map[string]string `json:"requests"`
	Limits   map[string]string `json:"limits"`
}

// PodCase is one pod to schedule.
type PodCase struct {
	Namespace      string         `json:"namespace"`
	Name           string         `json:"name"`
	UID            string         `json:"uid"`
	Containers     []ContainerAsk `json:"containers"`
	InitContainers []ContainerAsk `json:"initContainers"`
	// Candidates: the nodes the in-tree plugins left feasible (default:
	// every scenario node).
	Candidates []string `json:"candidates"`
	// AlwaysPrioritize: call Prioritize even when one node is feasible
	// (kube-scheduler skips scoring then).
	AlwaysPrioritize bool `json:"alwaysPrioritize"`
	// Reserve: after choosing a node, POST /reserve as a scheduler plugin
	// would (steward's own verb, not kube-scheduler's); a refusal is
	// followed by /unreserve, as the framework does.
	Reserve bool `json:"reserve"`
	// Unreserve: POST /unreserve with this reason after scheduling (a
	// later plugin failed).
	Unreserve string `json:"unreserve"`
}

// Line is one line of output.
type Line struct {
	Pod  string `json:"pod"`
	Call string `json:"call"`
	// Sent: false when the extender is not interested in the pod.
	Sent       bool    `json:"sent,omitempty"`
	Status     int     `json:"status,omitempty"`
	LatencyMS  float64 `json:"latencyMs,omitempty"`
	RequestLen int     `json:"requestBytes,omitempty"`
	// Filter.
	Passed                     []string          `json:"passed,omitempty"`
	FailedNodes                map[string]string `json:"failedNodes,omitempty"`
	FailedAndUnresolvableNodes map[string]string `json:"failedAndUnresolvableNodes,omitempty"`
	// Prioritize: the extender's scores and what they add to each node's
	// total (score * weight * MaxNodeScore / MaxExtenderPriority).
	Scores map[string]int64 `json:"scores,omitempty"`
	Totals map[string]int64 `json:"totals,omitempty"`
	// Schedule.
	Node      string            `json:"node,omitempty"`
	Feasible  []string          `json:"feasible,omitempty"`
	Diagnosis map[string]string `json:"diagnosis,omitempty"`
	// Skipped: an ignorable extender's error skipped it.
	Skipped bool `json:"skipped,omitempty"`
	// Reserve / unreserve: the answer's text.
	Message string `json:"message,omitempty"`
	// Error: what the call or the scheduling attempt failed with.
	Error string `json:"error,omitempty"`
	// Violation: the extender broke the protocol (also in Error).
	Violation string `json:"violation,omitempty"`
	// Body: the answer as it came, when it was a violation.
	Body string `json:"body,omitempty"`
}

var (
	outMu      sync.Mutex
	violations int
	// quiet: print only the lines that record a failed call (a race
	// prints its summary instead of one line per call).
	quiet bool
)

func emit(l Line) {
	outMu.Lock()
	defer outMu.Unlock()
	if l.Violation != "" {
		violations++
	}
	if quiet && l.Violation == "" && (l.Error == "" || l.Call == "schedule") {
		return
	}
	writeLine(l)
}

// writeLine prints v as one JSON line; the caller holds outMu.
func writeLine(v interface{}) {
	b, err := json.Marshal(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "encoding a line: %v\n", err)
		os.Exit(2)
	}
	os.Stdout.Write(append(b, '\n'))
}

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "scheduler-extender: "+format+"\n", a...)
	os.Exit(2)
}

func main() {
	scenarioPath := flag.String("scenario", "", "scenario JSON file (- for standard input)")
	url := flag.String("url", "", "the extender's urlPrefix (overrides the scenario's)")
	podRef := flag.String("pod", "", "namespace/name of one pod to schedule (without -scenario)")
	uid := flag.String("uid", "", "the pod's uid")
	var asks multiFlag
	flag.Var(&asks, "ask", "resource=quantity the pod's container limits (repeatable)")
	nodes := flag.String("nodes", "", "comma-separated candidate nodes")
	cacheCapable := flag.Bool("node-cache-capable", true, "send node names only")
	ignorable := flag.Bool("ignorable", false, "an extender error skips the extender")
	weight := flag.Int64("weight", 5, "the extender's weight")
	managed := flag.String("managed-resources", "", "comma-separated managedResources (empty: every pod is sent)")
	reserve := flag.Bool("reserve", false, "POST /reserve with the chosen node")
	flag.Parse()

	var sc Scenario
	switch {
	case *scenarioPath != "":
		var raw []byte
		var err error
		if *scenarioPath == "-" {
			raw, err = io.ReadAll(os.Stdin)
		} else {
			raw, err = os.ReadFile(*scenarioPath)
		}
		if err != nil {
			fail("reading the scenario: %v", err)
		}
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&sc); err != nil {
			fail("the scenario: %v", err)
		}
	case *podRef != "":
		ns, name, ok := strings.Cut(*podRef, "/")
		if !ok {
			fail("-pod takes namespace/name")
		}
		limits := map[string]string{}
		for _, a := range asks {
			k, v, ok := strings.Cut(a, "=")
			if !ok {
				fail("-ask takes resource=quantity")
			}
			limits[k] = v
		}
		sc.Extender = ExtenderConfig{
			FilterVerb: "filter", PrioritizeVerb: "prioritize", Weight: *weight,
			NodeCacheCapable: *cacheCapable, Ignorable: *ignorable,
			ManagedResources: splitList(*managed),
		}
		for _, n := range splitList(*nodes) {
			sc.Nodes = append(sc.Nodes, NodeSpec{Name: n})
		}
		sc.Pods = []PodCase{{
			Namespace: ns, Name: name, UID: *uid, Reserve: *reserve,
			Containers: []ContainerAsk{{Name: "main", Limits: limits}},
		}}
	default:
		fail("give -scenario or -pod")
	}
	if *url != "" {
		sc.Extender.URLPrefix = *url
	}
	if sc.Extender.URLPrefix == "" && (sc.Race == nil || len(sc.Race.URLPrefixes) == 0) {
		fail("no extender urlPrefix")
	}

	nodeByName := map[string]*v1.Node{}
	var all []string
	for _, n := range sc.Nodes {
		node, err := buildNode(n)
		if err != nil {
			fail("node %s: %v", n.Name, err)
		}
		nodeByName[n.Name] = node
		all = append(all, n.Name)
	}
	pods := make([]*v1.Pod, len(sc.Pods))
	for i, pc := range sc.Pods {
		pod, err := buildPod(pc)
		if err != nil {
			fail("pod %s: %v", pc.Name, err)
		}
		pods[i] = pod
		for _, c := range pc.Candidates {
			if nodeByName[c] == nil {
				fail("pod %s: candidate %s is not a scenario node", pc.Name, c)
			}
		}
	}

	// nodesOf: the nodes the in-tree plugins left feasible for a pod.
	nodesOf := func(pc PodCase) []*v1.Node {
		cands := pc.Candidates
		if len(cands) == 0 {
			cands = all
		}
		nodes := make([]*v1.Node, 0, len(cands))
		for _, c := range cands {
			nodes = append(nodes, nodeByName[c])
		}
		return nodes
	}
	workers := sc.Concurrency
	if workers < 1 {
		workers = 1
	}
	if sc.Race != nil {
		runRace(sc, workers, pods, nodesOf)
	} else {
		ext := NewHTTPExtender(sc.Extender)
		work := make(chan int)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range work {
					schedule(ext, sc.Pods[i], pods[i], nodesOf(sc.Pods[i]), nil)
				}
			}()
		}
		for i := range pods {
			work <- i
		}
		close(work)
		wg.Wait()
	}
	if violations > 0 {
		fmt.Fprintf(os.Stderr, "scheduler-extender: %d protocol violation(s) by the extender\n", violations)
		os.Exit(1)
	}
}

// schedule runs one scheduling attempt of pod over the feasible nodes
// (those the in-tree plugins passed), as kube-scheduler's schedulePod does
// with one extender, and returns its "schedule" line. afterFilter (if not
// nil) is given the Filter's outcome as soon as it is answered.
func schedule(ext *HTTPExtender, pc PodCase, pod *v1.Pod, feasible []*v1.Node, afterFilter func(FilterOutcome)) (result Line) {
	who := pod.Namespace + "/" + pod.Name
	result = Line{Pod: who, Call: "schedule", Diagnosis: map[string]string{}}
	defer func() { emit(result) }()

	// findNodesThatPassExtenders.
	interested := ext.IsInterested(pod)
	if interested && len(feasible) > 0 {
		o := ext.Filter(pod, feasible)
		if afterFilter != nil {
			afterFilter(o)
		}
		l := Line{
			Pod: who, Call: "filter", Sent: true, Status: o.Status, LatencyMS: o.LatencyMS,
			Passed: o.Passed, FailedNodes: o.FailedNodes,
			FailedAndUnresolvableNodes: o.FailedAndUnresolvableNodes,
		}
		if o.Err != nil {
			note(&l, o.Err, o.Body)
			emit(l)
			if !ext.IsIgnorable() {
				result.Error = l.Error
				return
			}
			result.Skipped = true
		} else {
			emit(l)
			for name, msg := range o.FailedAndUnresolvableNodes {
				result.Diagnosis[name] = "UnschedulableAndUnresolvable: " + msg
			}
			for name, msg := range o.FailedNodes {
				if _, found := o.FailedAndUnresolvableNodes[name]; found {
					continue
				}
				result.Diagnosis[name] = "Unschedulable: " + msg
			}
			byName := map[string]*v1.Node{}
			for _, n := range feasible {
				byName[n.Name] = n
			}
			feasible = feasible[:0:0]
			for _, name := range o.Passed {
				feasible = append(feasible, byName[name])
			}
		}
	} else if !interested {
		emit(Line{Pod: who, Call: "filter", Sent: false})
	}
	for _, n := range feasible {
		result.Feasible = append(result.Feasible, n.Name)
	}
	if len(feasible) == 0 {
		result.Error = fmt.Sprintf("0/%d nodes are available", len(result.Diagnosis))
		return
	}
	// "When only one node after predicate, just use it."
	chosen := feasible[0].Name
	if len(feasible) > 1 || pc.AlwaysPrioritize {
		chosen = prioritize(ext, who, pod, feasible, interested)
	}
	result.Node = chosen

	if pc.Reserve {
		st, msg, err := podVerb(ext, "reserve", podVerbBody{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Node: chosen})
		emitVerb(who, "reserve", st, msg, err, []int{http.StatusOK, http.StatusConflict})
		if err != nil || st != http.StatusOK {
			result.Error = fmt.Sprintf("reserve refused (%d): %s", st, msg)
			result.Node = ""
			st, msg, err := podVerb(ext, "unreserve", podVerbBody{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Reason: "reserve refused"})
			emitVerb(who, "unreserve", st, msg, err, []int{http.StatusOK})
			return
		}
	}
	if pc.Unreserve != "" {
		st, msg, err := podVerb(ext, "unreserve", podVerbBody{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Reason: pc.Unreserve})
		emitVerb(who, "unreserve", st, msg, err, []int{http.StatusOK})
	}
	return
}

// prioritize is prioritizeNodes with one extender and no score plugins:
// each node's total is its extender score * weight * (MaxNodeScore /
// MaxExtenderPriority); hosts outside the input add nothing; an error
// gives no score. The highest total wins; upstream breaks ties at random,
// this peer takes the first in candidate order.
func prioritize(ext *HTTPExtender, who string, pod *v1.Pod, feasible []*v1.Node, interested bool) string {
	totals := map[string]int64{}
	if interested {
		o := ext.Prioritize(pod, feasible)
		l := Line{Pod: who, Call: "prioritize", Sent: true, Status: o.Status, LatencyMS: o.LatencyMS}
		if o.Err != nil {
			note(&l, o.Err, o.Body)
		} else {
			l.Scores = map[string]int64{}
			for _, hp := range o.Scores {
				l.Scores[hp.Host] = hp.Score
				totals[hp.Host] += hp.Score * o.Weight * (maxNodeScore / MaxExtenderPriority)
			}
			l.Totals = totals
		}
		emit(l)
	}
	best, bestScore := feasible[0].Name, int64(-1)
	for _, n := range feasible {
		if s := totals[n.Name]; s > bestScore {
			best, bestScore = n.Name, s
		}
	}
	return best
}

// note records err on l; a ProtocolError is also a violation.
func note(l *Line, err error, body []byte) {
	l.Error = err.Error()
	var pe *ProtocolError
	if errors.As(err, &pe) {
		l.Violation = pe.Error()
		l.Body = string(body)
	}
}

// podVerbBody is steward's /reserve and /unreserve body (a scheduler
// plugin's call; kube-scheduler's extender protocol has no such verbs).
type podVerbBody struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Node      string `json:"node,omitempty"`
	Reason    string `json:"reason,omitempty"`
}

func podVerb(ext *HTTPExtender, verb string, body podVerbBody) (int, string, error) {
	out, err := json.Marshal(body)
	if err != nil {
		return 0, "", err
	}
	url := strings.TrimRight(ext.extenderURL, "/") + "/" + verb
	req, err := http.NewRequest("POST", url, bytes.NewReader(out))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := ext.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	msg, err := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(msg)), err
}

func emitVerb(who, verb string, status int, msg string, err error, ok []int) {
	l := Line{Pod: who, Call: verb, Sent: true, Status: status, Message: msg}
	if err != nil {
		l.Error = err.Error()
		l.Violation = "no answer to " + verb + ": " + err.Error()
	} else if !containsInt(ok, status) {
		l.Error = fmt.Sprintf("%s answered %d: %s", verb, status, msg)
		l.Violation = l.Error
	}
	emit(l)
}

func containsInt(list []int, v int) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// buildNode is a Node as the scheduler's cache holds it (an informer's
// object: no kind or apiVersion).
func buildNode(n NodeSpec) (*v1.Node, error) {
	alloc := map[string]string{"cpu": "4", "memory": "8Gi", "pods": "110"}
	for k, v := range n.Allocatable {
		alloc[k] = v
	}
	rl, err := resourceList(alloc)
	if err != nil {
		return nil, err
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:              n.Name,
			UID:               types.UID("node-" + n.Name),
			ResourceVersion:   "1",
			CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
			Labels:            map[string]string{"kubernetes.io/hostname": n.Name, "kubernetes.io/os": "linux"},
		},
		Status: v1.NodeStatus{
			Capacity:        rl,
			Allocatable:     rl,
			Conditions:      []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
			DaemonEndpoints: v1.NodeDaemonEndpoints{KubeletEndpoint: v1.DaemonEndpoint{Port: 10250}},
		},
	}, nil
}

// buildPod is a pending pod as the scheduler's queue holds it.
func buildPod(pc PodCase) (*v1.Pod, error) {
	ns := pc.Namespace
	if ns == "" {
		ns = "default"
	}
	containers := func(asks []ContainerAsk) ([]v1.Container, error) {
		var out []v1.Container
		for i, a := range asks {
			name := a.Name
			if name == "" {
				name = fmt.Sprintf("c%d", i)
			}
			c := v1.Container{Name: name, Image: "busybox"}
			var err error
			if c.Resources.Requests, err = resourceList(a.Requests); err != nil {
				return nil, err
			}
			if c.Resources.Limits, err = resourceList(a.Limits); err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		return out, nil
	}
	cs, err := containers(pc.Containers)
	if err != nil {
		return nil, err
	}
	ics, err := containers(pc.InitContainers)
	if err != nil {
		return nil, err
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:              pc.Name,
			Namespace:         ns,
			UID:               types.UID(pc.UID),
			ResourceVersion:   "1",
			CreationTimestamp: metav1.NewTime(time.Now().UTC().Truncate(time.Second)),
		},
		Spec: v1.PodSpec{
			Containers:         cs,
			InitContainers:     ics,
			SchedulerName:      v1.DefaultSchedulerName,
			RestartPolicy:      v1.RestartPolicyAlways,
			DNSPolicy:          v1.DNSClusterFirst,
			ServiceAccountName: "default",
		},
		Status: v1.PodStatus{Phase: v1.PodPending},
	}, nil
}

func resourceList(m map[string]string) (v1.ResourceList, error) {
	if len(m) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	rl := v1.ResourceList{}
	for _, k := range keys {
		q, err := resource.ParseQuantity(m[k])
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %v", k, m[k], err)
		}
		rl[v1.ResourceName(k)] = q
	}
	return rl, nil
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
