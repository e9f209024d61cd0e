package main

// kube-scheduler's HTTPExtender (upstream kubernetes pkg/scheduler/extender.go;
// the Extender interface is pkg/scheduler/framework/extender.go), the
// parts a filter/prioritize extender meets: how a request is written and
// sent, how the answer is read, which answers it rejects. Where upstream
// silently drops something a broken extender sends (a misnamed key, a
// score for a host it did not ask about), this peer also records it as a
// protocol violation so the test can see it.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/sets"
)

// ExtenderConfig is the part of kube-scheduler's Extender configuration
// (KubeSchedulerConfiguration.extenders[]) this peer honours.
type ExtenderConfig struct {
	URLPrefix        string   `json:"urlPrefix"`
	FilterVerb       string   `json:"filterVerb"`
	PrioritizeVerb   string   `json:"prioritizeVerb"`
	Weight           int64    `json:"weight"`
	NodeCacheCapable bool     `json:"nodeCacheCapable"`
	Ignorable        bool     `json:"ignorable"`
	ManagedResources []string `json:"managedResources"`
	// HTTPTimeoutSeconds: the client's timeout (upstream's httpTimeout).
	HTTPTimeoutSeconds float64 `json:"httpTimeoutSeconds"`
}

// HTTPExtender calls an extender the way kube-scheduler does.
type HTTPExtender struct {
	extenderURL      string
	filterVerb       string
	prioritizeVerb   string
	weight           int64
	client           *http.Client
	nodeCacheCapable bool
	managedResources sets.Set[string]
	ignorable        bool
}

// maxNodeScore is the scheduler framework's MaxNodeScore; extender scores
// are scaled by MaxNodeScore / MaxExtenderPriority.
const maxNodeScore int64 = 100

// ProtocolError is an answer kube-scheduler could not use as the extender
// meant it: a non-200 status, a body that does not decode, a node that was
// not in the input, a key it does not know.
type ProtocolError struct{ msg string }

func (e *ProtocolError) Error() string { return e.msg }

func violation(format string, a ...interface{}) error {
	return &ProtocolError{msg: fmt.Sprintf(format, a...)}
}

// NewHTTPExtender builds the client as upstream's NewHTTPExtender does.
func NewHTTPExtender(c ExtenderConfig) *HTTPExtender {
	timeout := time.Duration(c.HTTPTimeoutSeconds * float64(time.Second))
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	transport := utilnet.SetTransportDefaults(&http.Transport{})
	managed := sets.New[string](c.ManagedResources...)
	return &HTTPExtender{
		extenderURL:      c.URLPrefix,
		filterVerb:       c.FilterVerb,
		prioritizeVerb:   c.PrioritizeVerb,
		weight:           c.Weight,
		client:           &http.Client{Transport: transport, Timeout: timeout},
		nodeCacheCapable: c.NodeCacheCapable,
		managedResources: managed,
		ignorable:        c.Ignorable,
	}
}

// IsInterested is upstream's: with managedResources configured, only a
// pod whose containers or init containers request or limit one of them is
// sent to the extender.
func (h *HTTPExtender) IsInterested(pod *v1.Pod) bool {
	if h.managedResources.Len() == 0 {
		return true
	}
	if h.hasManagedResources(pod.Spec.Containers) {
		return true
	}
	if h.hasManagedResources(pod.Spec.InitContainers) {
		return true
	}
	return false
}

func (h *HTTPExtender) hasManagedResources(containers []v1.Container) bool {
	for i := range containers {
		container := &containers[i]
		for resourceName := range container.Resources.Requests {
			if h.managedResources.Has(string(resourceName)) {
				return true
			}
		}
		for resourceName := range container.Resources.Limits {
			if h.managedResources.Has(string(resourceName)) {
				return true
			}
		}
	}
	return false
}

// IsIgnorable: an error of an ignorable extender skips it.
func (h *HTTPExtender) IsIgnorable() bool { return h.ignorable }

// args builds ExtenderArgs as upstream's Filter and Prioritize do: names
// only for a node-cache-capable extender, else a NodeList of the objects.
func (h *HTTPExtender) args(pod *v1.Pod, nodes []*v1.Node) *ExtenderArgs {
	var (
		nodeList  *v1.NodeList
		nodeNames *[]string
	)
	if h.nodeCacheCapable {
		nodeNameSlice := make([]string, 0, len(nodes))
		for _, node := range nodes {
			nodeNameSlice = append(nodeNameSlice, node.Name)
		}
		nodeNames = &nodeNameSlice
	} else {
		nodeList = &v1.NodeList{}
		for _, node := range nodes {
			nodeList.Items = append(nodeList.Items, *node)
		}
	}
	return &ExtenderArgs{Pod: pod, Nodes: nodeList, NodeNames: nodeNames}
}

// Exchange is what one call sent and got, for the report.
type Exchange struct {
	Status    int
	LatencyMS float64
	Body      []byte
	// Dropped: why the answer does not decode strictly (a key
	// kube-scheduler ignores); checked after what kube-scheduler checks.
	Dropped error
}

// send is upstream's HTTPExtender.send: json.Marshal the args, POST them
// to <urlPrefix>/<verb> with Content-Type application/json, non-200 is an
// error, the body is decoded with json.NewDecoder into result. Beyond
// upstream, the body is kept and also decoded strictly into strict: a key
// kube-scheduler would drop is recorded in Exchange.Dropped.
func (h *HTTPExtender) send(action string, args interface{}, result interface{}, strict interface{}) (Exchange, error) {
	var ex Exchange
	out, err := json.Marshal(args)
	if err != nil {
		return ex, err
	}
	url := strings.TrimRight(h.extenderURL, "/") + "/" + action
	req, err := http.NewRequest("POST", url, bytes.NewReader(out))
	if err != nil {
		return ex, err
	}
	req.Header.Set("Content-Type", "application/json")
	started := time.Now()
	resp, err := h.client.Do(req)
	if err != nil {
		ex.LatencyMS = ms(time.Since(started))
		return ex, violation("no answer from the extender: %v", err)
	}
	defer resp.Body.Close()
	ex.Body, err = io.ReadAll(resp.Body)
	ex.LatencyMS = ms(time.Since(started))
	ex.Status = resp.StatusCode
	if err != nil {
		return ex, violation("reading the answer: %v", err)
	}
	if resp.StatusCode != http.StatusOK {
		return ex, violation("failed %v with extender at URL %v, code %v: %s", action, url, resp.StatusCode, bytes.TrimSpace(ex.Body))
	}
	if err := json.NewDecoder(bytes.NewReader(ex.Body)).Decode(result); err != nil {
		return ex, violation("the answer does not decode as kube-scheduler decodes it: %v", err)
	}
	d := json.NewDecoder(bytes.NewReader(ex.Body))
	d.DisallowUnknownFields()
	if err := d.Decode(strict); err != nil {
		ex.Dropped = violation("the answer has a key kube-scheduler drops: %v", err)
	}
	return ex, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// FilterOutcome is upstream Filter's return, plus the exchange.
type FilterOutcome struct {
	Exchange
	Passed                     []string
	FailedNodes                FailedNodesMap
	FailedAndUnresolvableNodes FailedNodesMap
	// Err: what upstream's Filter returns as its error (the extender's
	// Error, or a protocol violation).
	Err error
}

// Filter is upstream's HTTPExtender.Filter: the filtered list must be a
// subset of the input, else the whole call is an error. Checks beyond
// upstream (each a protocol violation): an answer in the form the
// scheduler does not read for this configuration, a failed node that was
// not in the input, a node both passed and failed.
func (h *HTTPExtender) Filter(pod *v1.Pod, nodes []*v1.Node) FilterOutcome {
	var (
		result ExtenderFilterResult
		strict ExtenderFilterResult
		o      FilterOutcome
	)
	fromNodeName := make(map[string]*v1.Node)
	for _, n := range nodes {
		fromNodeName[n.Name] = n
	}
	if h.filterVerb == "" {
		for _, n := range nodes {
			o.Passed = append(o.Passed, n.Name)
		}
		return o
	}
	o.Exchange, o.Err = h.send(h.filterVerb, h.args(pod, nodes), &result, &strict)
	if o.Err != nil {
		return o
	}
	h.checkFilter(&o, &result, fromNodeName)
	if o.Err == nil && o.Dropped != nil {
		o.Err = o.Dropped
	}
	if o.Err != nil {
		o.Passed, o.FailedNodes, o.FailedAndUnresolvableNodes = nil, nil, nil
	}
	return o
}

// checkFilter applies upstream's checks, then this peer's, to a decoded
// filter answer.
func (h *HTTPExtender) checkFilter(o *FilterOutcome, result *ExtenderFilterResult, fromNodeName map[string]*v1.Node) {
	if result.Error != "" {
		o.Err = errors.New(result.Error)
		return
	}
	o.Passed = []string{}
	if h.nodeCacheCapable && result.NodeNames != nil {
		for _, nodeName := range *result.NodeNames {
			if _, ok := fromNodeName[nodeName]; !ok {
				o.Err = violation("extender %q claims a filtered node %q which is not found in the input node list", h.extenderURL, nodeName)
				return
			}
			o.Passed = append(o.Passed, nodeName)
		}
	} else if result.Nodes != nil {
		for i := range result.Nodes.Items {
			name := result.Nodes.Items[i].Name
			// Upstream takes the objects as they come; a node it did not
			// send would be scheduled onto all the same.
			if _, ok := fromNodeName[name]; !ok {
				o.Err = violation("extender %q answers a node %q which is not found in the input node list", h.extenderURL, name)
				return
			}
			o.Passed = append(o.Passed, name)
		}
	} else {
		// Upstream reads neither and sees no feasible node.
		o.Err = violation("extender %q answers neither %s: kube-scheduler sees no feasible node", h.extenderURL, map[bool]string{true: "NodeNames nor Nodes", false: "Nodes (NodeNames is not read without nodeCacheCapable)"}[h.nodeCacheCapable])
		return
	}
	if !h.nodeCacheCapable && result.NodeNames != nil {
		o.Err = violation("extender %q answers NodeNames to a Nodes request: kube-scheduler does not read them", h.extenderURL)
		return
	}
	passed := sets.New[string](o.Passed...)
	for _, m := range []FailedNodesMap{result.FailedNodes, result.FailedAndUnresolvableNodes} {
		for name := range m {
			if _, ok := fromNodeName[name]; !ok {
				o.Err = violation("extender %q fails a node %q which is not found in the input node list", h.extenderURL, name)
				return
			}
			if passed.Has(name) {
				o.Err = violation("extender %q both passes and fails node %q", h.extenderURL, name)
				return
			}
		}
	}
	o.FailedNodes = result.FailedNodes
	o.FailedAndUnresolvableNodes = result.FailedAndUnresolvableNodes
}

// PrioritizeOutcome is upstream Prioritize's return, plus the exchange.
type PrioritizeOutcome struct {
	Exchange
	Scores HostPriorityList
	Weight int64
	Err    error
}

// Prioritize is upstream's HTTPExtender.Prioritize. Beyond upstream (which
// ignores hosts it did not ask about and trusts the range): a host outside
// the input, a host twice, or a score outside [0, MaxExtenderPriority] is a
// violation.
func (h *HTTPExtender) Prioritize(pod *v1.Pod, nodes []*v1.Node) PrioritizeOutcome {
	var (
		result HostPriorityList
		strict HostPriorityList
		o      PrioritizeOutcome
	)
	if h.prioritizeVerb == "" {
		for _, node := range nodes {
			o.Scores = append(o.Scores, HostPriority{Host: node.Name, Score: 0})
		}
		return o
	}
	o.Exchange, o.Err = h.send(h.prioritizeVerb, h.args(pod, nodes), &result, &strict)
	if o.Err != nil {
		return o
	}
	input := sets.New[string]()
	for _, n := range nodes {
		input.Insert(n.Name)
	}
	seen := sets.New[string]()
	for _, hp := range result {
		switch {
		case !input.Has(hp.Host):
			o.Err = violation("extender %q scores a host %q which is not found in the input node list", h.extenderURL, hp.Host)
		case seen.Has(hp.Host):
			o.Err = violation("extender %q scores host %q twice", h.extenderURL, hp.Host)
		case hp.Score < MinExtenderPriority || hp.Score > MaxExtenderPriority:
			o.Err = violation("extender %q scores host %q %d, outside [%d, %d]", h.extenderURL, hp.Host, hp.Score, MinExtenderPriority, MaxExtenderPriority)
		}
		if o.Err != nil {
			return o
		}
		seen.Insert(hp.Host)
	}
	if o.Dropped != nil {
		o.Err = o.Dropped
		return o
	}
	o.Scores = result
	o.Weight = h.weight
	return o
}
