package main

// The race: several kube-scheduler replicas scheduling at once, each
// through its own extender replica, binding what they place; beside them
// an unmanaged "floor" pod filtered over and over, so the same run gives
// the latency of a Filter the extender has nothing to decide for; midway,
// optionally, a line that tells the driver to kill the leading controller
// while the schedulers go on. It ends with one summary line.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RaceConfig is the scenario's "race".
type RaceConfig struct {
	// URLPrefixes: the extender replicas. Scheduler w (of the scenario's
	// concurrency) calls URLPrefixes[w % len] only, as each kube-scheduler
	// replica is configured with one extender address. Empty: the
	// extender's urlPrefix.
	URLPrefixes []string `json:"urlPrefixes"`
	// Floor: a pod asking for no managed resource, filtered over and over
	// while the race runs, round robin over the replicas. kube-scheduler
	// would not send it (managedResources); it is sent anyway, as the same
	// Filter call with nothing for the extender to decide. Absent: no
	// floor.
	Floor *PodCase `json:"floor"`
	// FloorIntervalMS: the pause after each floor Filter (default 2).
	FloorIntervalMS int `json:"floorIntervalMs"`
	// KillAfter: once this many managed Filters are answered, the leading
	// controller is to be killed while the schedulers go on. Without
	// KillHook the line {"event":"kill",...} is printed then, and the
	// driver kills on reading it. 0: no kill.
	KillAfter int `json:"killAfter"`
	// KillHook: a URL POSTed (empty body) once KillAfter is reached; the
	// driver answers 2xx once the leader is dead, and that answer is the
	// kill's time (the kill line is printed then). The schedulers do not
	// wait for it.
	KillHook string `json:"killHook"`
	// BindURL: the API server's URL; each placed pod is bound there as
	// kube-scheduler's DefaultBinder binds it (a v1.Binding POSTed to the
	// pod's binding subresource, in JSON where kube-scheduler would send
	// protobuf). Empty: nothing is bound.
	BindURL string `json:"bindUrl"`
	// Verbose: print every call's line as the other modes do. Default:
	// only the lines of failed calls, the kill event and the summary.
	Verbose bool `json:"verbose"`
}

// RaceKill is the line of the kill: asking the driver for it (no hook),
// or saying when the hook answered (or why it failed).
type RaceKill struct {
	Event string `json:"event"` // "kill"
	// Answered: managed Filters answered so far.
	Answered int     `json:"answered"`
	AtMS     float64 `json:"atMs"`
	Error    string  `json:"error,omitempty"`
}

// RaceSummary is the last line of a race.
type RaceSummary struct {
	Event      string `json:"event"` // "summary"
	Schedulers int    `json:"schedulers"`
	Extenders  int    `json:"extenders"`
	Pods       int    `json:"pods"`
	// Filters: managed Filters sent (each answered or failed).
	Filters int `json:"filters"`
	// FilterErrors: managed Filters that failed, by kind in
	// FilterErrorsByKind: "transport" (no answer), "status" (not 200),
	// "answer" (an answer kube-scheduler cannot use: it does not decode,
	// is cut short, names a node outside the input, has a key
	// kube-scheduler drops), "extender" (the answer's Error).
	FilterErrors       int            `json:"filterErrors"`
	FilterErrorsByKind map[string]int `json:"filterErrorsByKind"`
	ManagedP50MS       float64        `json:"managedP50Ms"`
	ManagedP99MS       float64        `json:"managedP99Ms"`
	ManagedMaxMS       float64        `json:"managedMaxMs"`
	// Passing: of the managed Filters, those that passed a node (the
	// others are rejections, which an extender may answer cheaply).
	Passing      int     `json:"passing"`
	PassingP50MS float64 `json:"passingP50Ms"`
	PassingP99MS float64 `json:"passingP99Ms"`
	FloorSamples int     `json:"floorSamples"`
	FloorP50MS   float64 `json:"floorP50Ms"`
	FloorP99MS   float64 `json:"floorP99Ms"`
	// FloorErrors: floor Filters that failed (any kind); FloorShort: floor
	// answers that did not pass every node.
	FloorErrors int `json:"floorErrors"`
	FloorShort  int `json:"floorShort"`
	// P99Ratio: managed p99 / floor p99 (0 without a floor).
	P99Ratio float64 `json:"p99Ratio"`
	// Placed: pods given a node; Bound: of them, bound (BindErrors: not).
	Placed          int     `json:"placed"`
	Bound           int     `json:"bound"`
	BindErrors      int     `json:"bindErrors"`
	ElapsedMS       float64 `json:"elapsedMs"`
	DecisionsPerSec float64 `json:"decisionsPerSec"`
	PlacedPerSec    float64 `json:"placedPerSec"`
	// Kill: what the schedulers saw after the kill (absent when no kill
	// was asked for, too few Filters were answered to reach it, or the
	// hook failed: KillError).
	Kill      *KillReport `json:"kill,omitempty"`
	KillError string      `json:"killError,omitempty"`
}

// KillReport: the Filters answered after the kill (the hook's answer,
// else the kill line).
type KillReport struct {
	AfterFilters int     `json:"afterFilters"`
	AtMS         float64 `json:"atMs"`
	// LongestPauseMS: the longest pause between two answered managed
	// Filters, the later one answered after the kill (the Filter that
	// reached KillAfter is before it).
	LongestPauseMS float64 `json:"longestPauseMs"`
	// FirstAnswerMS: from the kill to the first Filter answered after it
	// (-1: none).
	FirstAnswerMS float64 `json:"firstAnswerMs"`
	FiltersAfter  int     `json:"filtersAfter"`
}

// raceRecord collects what the schedulers and the floor saw.
type raceRecord struct {
	mu        sync.Mutex
	start     time.Time
	killAfter int
	hook      string
	hookDone  sync.WaitGroup
	killErr   string
	managed   []float64 // ms
	passing   []float64 // ms
	answered  []time.Duration
	errs      map[string]int
	killAt    time.Duration
	killed    bool
	floor     []float64
	floorErrs int
	short     int
	placed    int
	bound     int
	bindErrs  int
}

// errorKind sorts a failed Filter (see RaceSummary.FilterErrors).
func errorKind(o FilterOutcome) string {
	var pe *ProtocolError
	switch {
	case o.Err == nil:
		return ""
	case o.Status == 0:
		return "transport"
	case o.Status != http.StatusOK:
		return "status"
	case errors.As(o.Err, &pe):
		return "answer"
	default:
		return "extender"
	}
}

// filtered records a managed Filter's outcome; the KillAfter-th prints the
// kill line.
func (r *raceRecord) filtered(o FilterOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Since(r.start)
	r.managed = append(r.managed, o.LatencyMS)
	if o.Err == nil && len(o.Passed) > 0 {
		r.passing = append(r.passing, o.LatencyMS)
	}
	r.answered = append(r.answered, now)
	if k := errorKind(o); k != "" {
		r.errs[k]++
	}
	if r.killAfter > 0 && len(r.answered) == r.killAfter {
		if r.hook == "" {
			r.kill(now, "")
		} else {
			r.hookDone.Add(1)
			go r.callHook()
		}
	}
}

// kill records the kill at `at` (err: it failed) and prints its line; the
// caller holds r.mu.
func (r *raceRecord) kill(at time.Duration, err string) {
	if err == "" {
		r.killed, r.killAt = true, at
	}
	r.killErr = err
	outMu.Lock()
	writeLine(RaceKill{Event: "kill", Answered: len(r.answered), AtMS: ms(at), Error: err})
	outMu.Unlock()
}

// callHook asks the driver for the kill and records it when answered.
func (r *raceRecord) callHook() {
	defer r.hookDone.Done()
	client := &http.Client{Timeout: 60 * time.Second}
	resp, err := client.Post(r.hook, "application/json", nil)
	why := ""
	if err != nil {
		why = err.Error()
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			why = fmt.Sprintf("the kill hook answered %d", resp.StatusCode)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kill(time.Since(r.start), why)
}

func (r *raceRecord) floorFiltered(o FilterOutcome, nodes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.floor = append(r.floor, o.LatencyMS)
	switch {
	case o.Err != nil:
		r.floorErrs++
	case len(o.Passed) != nodes:
		r.short++
	}
}

// runRace schedules the scenario's pods with `schedulers` schedulers at
// once: scheduler w takes pods w, w+schedulers, ... (each replica its own
// pods, as with one schedulerName per replica) and calls its own extender
// replica.
func runRace(sc Scenario, schedulers int, pods []*v1.Pod, nodesOf func(PodCase) []*v1.Node) {
	rc := *sc.Race
	quiet = !rc.Verbose
	urls := rc.URLPrefixes
	if len(urls) == 0 {
		urls = []string{sc.Extender.URLPrefix}
	}
	exts := make([]*HTTPExtender, len(urls))
	for i, u := range urls {
		c := sc.Extender
		c.URLPrefix = u
		exts[i] = NewHTTPExtender(c)
	}
	var floorPod *v1.Pod
	if rc.Floor != nil {
		p, err := buildPod(*rc.Floor)
		if err != nil {
			fail("the floor pod: %v", err)
		}
		floorPod = p
	}
	interval := time.Duration(rc.FloorIntervalMS) * time.Millisecond
	if rc.FloorIntervalMS <= 0 {
		interval = 2 * time.Millisecond
	}
	binder := &http.Client{Timeout: 30 * time.Second}
	rec := &raceRecord{start: time.Now(), killAfter: rc.KillAfter, hook: rc.KillHook, errs: map[string]int{}}

	stopFloor := make(chan struct{})
	floorDone := make(chan struct{})
	go func() {
		defer close(floorDone)
		if floorPod == nil {
			return
		}
		nodes := nodesOf(*rc.Floor)
		for k := 0; ; k++ {
			select {
			case <-stopFloor:
				return
			default:
			}
			rec.floorFiltered(exts[k%len(exts)].Filter(floorPod, nodes), len(nodes))
			time.Sleep(interval)
		}
	}()

	var wg sync.WaitGroup
	for w := 0; w < schedulers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ext := exts[w%len(exts)]
			for i := w; i < len(pods); i += schedulers {
				line := schedule(ext, sc.Pods[i], pods[i], nodesOf(sc.Pods[i]), rec.filtered)
				if line.Node == "" {
					continue
				}
				var err error
				if rc.BindURL != "" {
					err = bind(binder, rc.BindURL, pods[i], line.Node)
				}
				rec.mu.Lock()
				rec.placed++
				switch {
				case rc.BindURL == "":
				case err != nil:
					rec.bindErrs++
				default:
					rec.bound++
				}
				rec.mu.Unlock()
				if err != nil {
					emit(Line{Pod: line.Pod, Call: "bind", Node: line.Node, Error: err.Error()})
				}
			}
		}(w)
	}
	wg.Wait()
	elapsed := time.Since(rec.start)
	close(stopFloor)
	<-floorDone
	rec.hookDone.Wait()

	rec.mu.Lock()
	defer rec.mu.Unlock()
	s := RaceSummary{
		Event: "summary", Schedulers: schedulers, Extenders: len(exts), Pods: len(pods),
		Filters: len(rec.managed), FilterErrorsByKind: rec.errs,
		FloorSamples: len(rec.floor), FloorErrors: rec.floorErrs, FloorShort: rec.short,
		Placed: rec.placed, Bound: rec.bound, BindErrors: rec.bindErrs,
		ElapsedMS: ms(elapsed),
	}
	for _, n := range rec.errs {
		s.FilterErrors += n
	}
	s.ManagedP50MS, s.ManagedP99MS = percentile(rec.managed, 0.5), percentile(rec.managed, 0.99)
	s.ManagedMaxMS = percentile(rec.managed, 1)
	s.Passing = len(rec.passing)
	s.PassingP50MS, s.PassingP99MS = percentile(rec.passing, 0.5), percentile(rec.passing, 0.99)
	s.FloorP50MS, s.FloorP99MS = percentile(rec.floor, 0.5), percentile(rec.floor, 0.99)
	if s.FloorP99MS > 0 {
		s.P99Ratio = round2(s.ManagedP99MS / s.FloorP99MS)
	}
	if secs := elapsed.Seconds(); secs > 0 {
		s.DecisionsPerSec = round2(float64(s.Filters) / secs)
		s.PlacedPerSec = round2(float64(s.Placed) / secs)
	}
	if rec.killed {
		s.Kill = killReport(rec.answered, rec.killAt, rc.KillAfter)
	}
	s.KillError = rec.killErr
	outMu.Lock()
	writeLine(s)
	outMu.Unlock()
}

// killReport: the pauses between answered Filters from the kill line on.
func killReport(answered []time.Duration, at time.Duration, after int) *KillReport {
	sorted := append([]time.Duration(nil), answered...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	k := &KillReport{AfterFilters: after, AtMS: ms(at), FirstAnswerMS: -1}
	for i, t := range sorted {
		if t <= at {
			continue
		}
		k.FiltersAfter++
		if k.FirstAnswerMS < 0 {
			k.FirstAnswerMS = ms(t - at)
		}
		if i > 0 {
			k.LongestPauseMS = math.Max(k.LongestPauseMS, ms(t-sorted[i-1]))
		}
	}
	return k
}

// percentile: the value at rank round((n-1)*p) of the sorted samples (the
// Rust benchmarks' rule), 0 without samples.
func percentile(samples []float64, p float64) float64 {
	if len(samples) == 0 {
		return 0
	}
	sorted := append([]float64(nil), samples...)
	sort.Float64s(sorted)
	i := int(math.Round(float64(len(sorted)-1) * p))
	return sorted[i]
}

func round2(v float64) float64 { return math.Round(v*100) / 100 }

// bind is kube-scheduler's DefaultBinder: a v1.Binding of the pod to node,
// created through the pod's binding subresource.
func bind(client *http.Client, apiURL string, pod *v1.Pod, node string) error {
	b := &v1.Binding{
		TypeMeta:   metav1.TypeMeta{Kind: "Binding", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     v1.ObjectReference{Kind: "Node", Name: node},
	}
	body, err := json.Marshal(b)
	if err != nil {
		return err
	}
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/binding", strings.TrimRight(apiURL, "/"), pod.Namespace, pod.Name)
	req, err := http.NewRequest("POST", url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return fmt.Errorf("binding %s/%s to %s: %d %s", pod.Namespace, pod.Name, node, resp.StatusCode, bytes.TrimSpace(msg))
	}
	return nil
}
