// Package report turns a load test's measurements into a JSON report, a
// Markdown summary and PNG plots, printing each figure for shardpilot and
// the baseline side by side with their ratio.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Percentiles summarise a distribution, in seconds.
type Percentiles struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Summarise computes percentiles of durations (nearest rank).
func Summarise(ds []time.Duration) Percentiles {
	if len(ds) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(s)))) - 1
		return s[max(i, 0)].Seconds()
	}
	return Percentiles{N: len(s), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: s[len(s)-1].Seconds()}
}

// Point is one change on the convergence-over-time plot.
type Point struct {
	At          float64 `json:"at"`          // seconds since the changes began
	Convergence float64 `json:"convergence"` // seconds
	Kind        string  `json:"kind"`
}

// Usage is one sample of the control plane's processes.
type Usage struct {
	At  float64 `json:"at"`      // seconds since the phase began
	CPU float64 `json:"cpu_s"`   // CPU seconds used so far
	RSS float64 `json:"rss_mib"` // resident memory, MiB
}

// Fault is one fault of the fault suite.
type Fault struct {
	Name string `json:"name"`
	// Lasted is how long the fault was in effect (until the process was
	// started again or continued).
	Lasted float64 `json:"lasted_s"`
	// Recovered is the time from its end until every change made before
	// its end had reached every proxy; Pending counts those that had not
	// when the run gave up waiting.
	Recovered float64 `json:"recovered_s"`
	Pending   int     `json:"pending"`
	// During, for a fault the others must not notice, is the convergence
	// of the changes made while it lasted.
	During *During `json:"during,omitempty"`
	// Said is what the pushers' readiness and staleness said while it
	// lasted, for the faults that watch them.
	Said string `json:"said,omitempty"`
	// Flood, for a flood a client sends, is what it cost the pusher.
	Flood *Flood `json:"flood,omitempty"`
	// Input, for a heavy input, is what it cost and how the mesh kept
	// flowing while it applied.
	Input *Input `json:"input,omitempty"`
}

// Input is a heavy input: how long until both pushers served it, and its
// removal, alike (-1: not within the bound); how the grpc-go clients
// followed an endpoint moved meanwhile (each move's slowest client, -1
// when one did not follow within a minute) and how many of their RPCs
// failed; the CPU the pushers used from its write until its removal was
// served, and their largest RSS. NormalP99 is the churn's convergence
// p99 alone, before the inputs, to read During against.
type Input struct {
	Applied    float64 `json:"applied_s"`
	Removed    float64 `json:"removed_s"`
	NormalP99  float64 `json:"normal_p99_s"`
	Moves      int     `json:"moves"`
	FollowMax  float64 `json:"follow_max_s"`
	RPCsFailed int64   `json:"rpcs_failed"`
	CPUSeconds float64 `json:"cpu_s"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
}

// Flood is what a flood cost the pusher, held to a memory limit.
type Flood struct {
	// LimitMiB is the memory limit the kernel held the pusher to (0: none
	// could be set) and PeakRSSMiB its largest RSS during the flood;
	// OOMKilled says the kernel killed it for the limit.
	LimitMiB   float64 `json:"limit_mib"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	OOMKilled  bool    `json:"oom_killed"`
	// LiveHeapMiB is the pusher's live heap, after a collection, as the
	// flood ends (0: it could not be read, a pusher killed).
	LiveHeapMiB float64 `json:"live_heap_mib"`
	// NewProxy is how long a proxy connecting during the flood, with a
	// service account token, took to be served (-1: it was not, within
	// the flood); NewProxyError says why not.
	NewProxy      float64 `json:"new_proxy_s"`
	NewProxyError string  `json:"new_proxy_error,omitempty"`
	// Registered is how long a workload of another namespace, naming its
	// WorkloadGroup as it connects during the flood, took until its
	// WorkloadEntry was written (-1: it was not, within the flood);
	// RegisteredError says why not.
	Registered      float64 `json:"registered_s"`
	RegisteredError string  `json:"registered_error,omitempty"`
	// Sent says what the flood sent, and what the pusher answered.
	Sent string `json:"sent"`
}

// During is the convergence of the changes made during a fault.
type During struct {
	Changes int     `json:"changes"`
	P99     float64 `json:"p99_s"`
	Max     float64 `json:"max_s"`
}

// Storm is the reconnect storm: every proxy's pusher is killed at once.
type Storm struct {
	Proxies int `json:"proxies"`
	// Converged is the time from the kill until every proxy had ACKed a
	// change made at the kill (on the surviving replica).
	Converged float64 `json:"converged_s"`
	// Reconnected is the time until every proxy had re-established a
	// stream and said what it holds.
	Reconnected float64 `json:"reconnected_s"`
	OK          bool    `json:"ok"`
}

// Trickle is the proxies that came and went beside the fleet while the
// changes were made (pods of rolling deployments): none is measured, but
// each must be served, and the fleet's changes must not wait for them.
type Trickle struct {
	Rate float64 `json:"per_s"`
	Life float64 `json:"life_s"`
	// Started proxies, of which Served got a full config; FullP99 is the
	// time each took to get it, at p99.
	Started int     `json:"started"`
	Served  int     `json:"served"`
	FullP99 float64 `json:"full_p99_s"`
}

// Move is a change of a sharded phase's placement: the proxies of the
// namespaces that moved reconnect to their new shard, the others keep
// their streams.
type Move struct {
	Name string `json:"name"`
	// Moved counts the proxies of the moving namespaces whose stream
	// ended, Others those of other namespaces (0: only the moved moved).
	Moved  int `json:"moved"`
	Others int `json:"others"`
	// Placed is the time from the change until every proxy held a full
	// config from the shard its namespace's address leads to;
	// ChangeConverged until the changes made at that moment (in a moving
	// namespace and in the shared one) reached every proxy that sees them;
	// Converged until both.
	Placed          float64 `json:"placed_s"`
	ChangeConverged float64 `json:"change_converged_s"`
	Converged       float64 `json:"converged_s"`
	Problem         string  `json:"problem,omitempty"`
}

// Phase is one control plane under one run of the scenario.
type Phase struct {
	Name    string `json:"name"` // "shardpilot, 1 pusher", "baseline", …
	Target  string `json:"target"`
	Pushers int    `json:"pushers,omitempty"`
	Proxies int    `json:"proxies"`
	Delta   int    `json:"delta_proxies"`

	Changes     int                    `json:"changes"`
	Unconverged int                    `json:"unconverged"`
	Convergence Percentiles            `json:"convergence"`
	ByKind      map[string]Percentiles `json:"convergence_by_kind"`
	// EachProxy is each proxy's convergence of each change (Convergence
	// is a change's last proxy's): what the control plane's convergence
	// histogram, and so its dashboard, measures.
	EachProxy   Percentiles `json:"convergence_each_proxy"`
	FirstConfig Percentiles `json:"first_config"`

	ResponsesPerProxy float64 `json:"responses_per_proxy"`
	BytesPerProxy     float64 `json:"bytes_per_proxy"`
	// ConfigBytesPerProxy is what a proxy had received when the changes
	// began (its full config, and whatever came again on reconnects), and
	// ChangeTraffic what each change cost a proxy afterwards, per xDS type.
	ConfigBytesPerProxy float64       `json:"config_bytes_per_proxy,omitempty"`
	ChangeTraffic       []TypeTraffic `json:"per_change_and_proxy,omitempty"`
	NACKs               int64         `json:"nacks"`
	Errors              int64         `json:"stream_errors"`

	// CPUPerChange is the serving processes' CPU during the changes
	// (until they converged) divided by the number of changes.
	CPUPerChange float64 `json:"cpu_ms_per_change"`
	CPUSeconds   float64 `json:"cpu_seconds"`
	// RSSLoaded and HeapLoaded are before any proxy connected,
	// RSSConnected and HeapConnected once all held a full config. The heap
	// is read right after a collection; its growth per proxy is the memory
	// a proxy costs beyond the shared state.
	RSSLoaded     float64 `json:"rss_loaded_mib"`
	RSSConnected  float64 `json:"rss_connected_mib"`
	RSSMax        float64 `json:"rss_max_mib"`
	HeapLoaded    float64 `json:"heap_loaded_mib"`
	HeapConnected float64 `json:"heap_connected_mib"`
	// HeapPerPusher is the largest pusher's heap with every proxy
	// connected (after GC), and EventsPerPusher the change events the
	// pusher that took the most took from the bus, EventsAll those all
	// took together: a sharded phase's pushers each hold and follow only
	// what their proxies see.
	HeapPerPusher   float64 `json:"heap_per_pusher_mib,omitempty"`
	EventsPerPusher float64 `json:"events_per_pusher,omitempty"`
	EventsAll       float64 `json:"events_all_pushers,omitempty"`
	MemoryPerProxy  float64 `json:"memory_per_proxy_kib"`
	// Traffic is etcd's and NATS's work during the changes, per change
	// (shardpilot only).
	Traffic *Traffic `json:"store_traffic_per_change,omitempty"`
	// PerProxy is each figure's growth, divided by the proxies, from the
	// mesh loaded to every proxy connected: RSS as a pod's limit sees it,
	// and where it goes.
	PerProxy *Growth `json:"per_proxy,omitempty"`
	// IngestCPUSeconds is the ingester's CPU during the changes (shardpilot only).
	IngestCPUSeconds float64 `json:"ingest_cpu_seconds,omitempty"`
	// StoreCPUSeconds is etcd's and NATS's CPU during the changes (their
	// own process; shardpilot only).
	StoreCPUSeconds float64 `json:"store_cpu_seconds,omitempty"`
	// ChangeRate is the rate changes were actually made at (the generator
	// falls behind the asked rate when the machine is saturated), and
	// HarnessCPUSeconds the load test's own CPU (proxies and generator)
	// during the changes: on a machine it shares with the control plane,
	// a saturated harness reads and ACKs late, which convergence includes.
	ChangeRate        float64 `json:"changes_per_s"`
	HarnessCPUSeconds float64 `json:"harness_cpu_seconds"`

	// Stages are the control plane's own measurements of each step of
	// convergence during the changes (shardpilot only).
	Stages []Stage `json:"stages,omitempty"`

	Timeline []Point  `json:"timeline"`
	Usage    []Usage  `json:"usage"`
	Storm    *Storm   `json:"storm,omitempty"`
	Trickle  *Trickle `json:"trickle,omitempty"`
	// SlowReaders proxies beside the fleet read each response
	// SlowReadDelay late while the changes were made (not measured).
	SlowReaders   int      `json:"slow_readers,omitempty"`
	SlowReadDelay float64  `json:"slow_read_delay_s,omitempty"`
	Moves         []Move   `json:"moves,omitempty"`
	Faults        []Fault  `json:"faults,omitempty"`
	Problems      []string `json:"problems,omitempty"`
}

// TypeTraffic is what a proxy received of one xDS type while the changes
// were made, per change made.
type TypeTraffic struct {
	Type      string  `json:"type"` // CDS, EDS, LDS, RDS, VHDS
	Responses float64 `json:"responses"`
	Bytes     float64 `json:"bytes"`
}

// Traffic is what etcd and NATS received and sent, per change, from and
// to every client (the ingester, the pushers, their leases and heartbeats):
// etcd's gRPC messages and bytes, NATS's messages and bytes in (published,
// acknowledged) and out (delivered to the pushers' consumers).
type Traffic struct {
	EtcdMsgsIn   float64 `json:"etcd_msgs_in"`
	EtcdMsgsOut  float64 `json:"etcd_msgs_out"`
	EtcdBytesIn  float64 `json:"etcd_bytes_in"`
	EtcdBytesOut float64 `json:"etcd_bytes_out"`
	NATSMsgsIn   float64 `json:"nats_msgs_in"`
	NATSMsgsOut  float64 `json:"nats_msgs_out"`
	NATSBytesIn  float64 `json:"nats_bytes_in"`
	NATSBytesOut float64 `json:"nats_bytes_out"`
}

// Growth is memory per connected proxy, in KiB (goroutines: a count).
// RSS is what the operating system holds; of it, the Go runtime accounts
// for live heap (right after a collection), heap spans in use beyond it
// (fragmentation, pooled buffers), freed heap it has not yet returned
// (idle), and goroutine stacks. GCGoal is the growth of the heap size
// the next collection runs at: the garbage a process may carry.
type Growth struct {
	RSS        float64 `json:"rss_kib"`
	Live       float64 `json:"heap_live_kib"`
	InUse      float64 `json:"heap_unused_in_spans_kib"`
	Idle       float64 `json:"heap_idle_kib"`
	Stacks     float64 `json:"stacks_kib"`
	GCGoal     float64 `json:"gc_goal_kib"`
	Goroutines float64 `json:"goroutines"`
}

// Stage is one step of convergence, as the control plane measured it.
type Stage struct {
	Name string  `json:"name"`
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
}

// Report is a whole run.
type Report struct {
	Scenario any       `json:"scenario"`
	Started  time.Time `json:"started"`
	Phases   []Phase   `json:"phases"`
	// Capacity is what a capacity search found (loadtest run --capacity).
	Capacity *Capacity `json:"capacity,omitempty"`
}

// Capacity is the most proxies one pusher kept at convergence p99 within
// Bound (seconds), and the trials that found it.
type Capacity struct {
	Bound   float64 `json:"p99_bound_s"`
	Proxies int     `json:"proxies"`
	// Limit is the most proxies a trial could run (open files); AtLimit
	// says the search stopped there, still passing.
	Limit   int     `json:"limit"`
	AtLimit bool    `json:"at_limit,omitempty"`
	Trials  []Trial `json:"trials"`
}

// Trial is one phase of a capacity search.
type Trial struct {
	Proxies           int     `json:"proxies"`
	P99               float64 `json:"p99_s"`
	CPUPerChange      float64 `json:"cpu_ms_per_change"`
	HarnessCPUSeconds float64 `json:"harness_cpu_seconds"`
	OK                bool    `json:"passed"`
}

// Write writes report.json, report.md and the plots into dir, and the
// Markdown summary to w.
func (r *Report) Write(dir string, w io.Writer) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	md := r.Markdown()
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := r.plot(dir); err != nil {
		return err
	}
	_, err = io.WriteString(w, md)
	return err
}

// Markdown renders the summary: one table, a column per phase, and the
// ratio of each shardpilot phase to the baseline.
func (r *Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# shardpilot load test\n\nStarted %s. Scenario: `%s`.\n\n", r.Started.Format(time.RFC3339), scenarioLine(r.Scenario))
	r.figures(&b)
	b.WriteString("\n")
	for _, p := range r.Phases {
		phaseDetails(&b, p)
	}
	r.capacity(&b)
	b.WriteString("\nPlots: convergence-cdf.png, convergence-time.png, cpu.png, rss.png.\n")
	return b.String()
}

// figures writes the table of every figure, a column per phase, with the
// ratios to the baseline and to istiod.
func (r *Report) figures(b *strings.Builder) {
	t := figureTable{b: b, phases: r.Phases}
	for i := range r.Phases {
		switch r.Phases[i].Target {
		case "baseline":
			t.base = &r.Phases[i]
		case "istiod":
			t.istiod = &r.Phases[i]
		}
	}
	header := "| figure |"
	sep := "| --- |"
	for _, p := range r.Phases {
		header += " " + p.Name + " |"
		sep += " ---: |"
		if t.base != nil && p.Target != "baseline" {
			header += " ratio to baseline |"
			sep += " ---: |"
		}
		if t.istiod != nil && p.Target == "shardpilot" {
			header += " ratio to istiod |"
			sep += " ---: |"
		}
	}
	b.WriteString(header + "\n" + sep + "\n")
	t.convergenceAndCPU()
	t.memory()
	t.traffic()
}

// figureTable writes the rows of the figures' table: a phase's figure,
// and its ratios to the baseline's and to istiod's when they ran.
type figureTable struct {
	b            *strings.Builder
	phases       []Phase
	base, istiod *Phase
}

func (t figureTable) row(name string, f func(p Phase) float64, unit string) {
	line := "| " + name + " |"
	for _, p := range t.phases {
		line += " " + format(f(p), unit) + " |"
		if t.base != nil && p.Target != "baseline" {
			line += " " + ratio(f(p), f(*t.base)) + " |"
		}
		if t.istiod != nil && p.Target == "shardpilot" {
			line += " " + ratio(f(p), f(*t.istiod)) + " |"
		}
	}
	t.b.WriteString(line + "\n")
}

// convergenceAndCPU are the rows of convergence, changes and CPU.
func (t figureTable) convergenceAndCPU() {
	row := t.row
	row("convergence p50", func(p Phase) float64 { return p.Convergence.P50 }, "s")
	row("convergence p90", func(p Phase) float64 { return p.Convergence.P90 }, "s")
	row("convergence p99", func(p Phase) float64 { return p.Convergence.P99 }, "s")
	row("convergence max", func(p Phase) float64 { return p.Convergence.Max }, "s")
	row("each proxy's convergence p50", func(p Phase) float64 { return p.EachProxy.P50 }, "s")
	row("each proxy's convergence p99", func(p Phase) float64 { return p.EachProxy.P99 }, "s")
	row("changes", func(p Phase) float64 { return float64(p.Changes) }, "")
	row("changes per second, as made", func(p Phase) float64 { return p.ChangeRate }, "")
	row("changes that never converged", func(p Phase) float64 { return float64(p.Unconverged) }, "")
	row("first full config p99", func(p Phase) float64 { return p.FirstConfig.P99 }, "s")
	row("CPU per change, serving processes", func(p Phase) float64 { return p.CPUPerChange }, "ms")
	row("CPU per change, whole control plane", func(p Phase) float64 { return p.ControlPlaneCPUPerChange() }, "ms")
	row("load test's own CPU during the changes", func(p Phase) float64 { return p.HarnessCPUSeconds }, "s")
	row("memory per proxy beyond the shared state", func(p Phase) float64 { return p.MemoryPerProxy }, "KiB")
}

// memory are the rows of memory, per proxy and whole.
func (t figureTable) memory() {
	row := t.row
	growth := func(name string, f func(g *Growth) float64, unit string) {
		row(name, func(p Phase) float64 {
			if p.PerProxy == nil {
				return math.NaN()
			}
			return f(p.PerProxy)
		}, unit)
	}
	growth("RSS per connected proxy", func(g *Growth) float64 { return g.RSS }, "KiB")
	growth("· live heap per proxy", func(g *Growth) float64 { return g.Live }, "KiB")
	growth("· heap spans in use beyond live", func(g *Growth) float64 { return g.InUse }, "KiB")
	growth("· freed heap not yet returned", func(g *Growth) float64 { return g.Idle }, "KiB")
	growth("· goroutine stacks per proxy", func(g *Growth) float64 { return g.Stacks }, "KiB")
	growth("GC goal per proxy", func(g *Growth) float64 { return g.GCGoal }, "KiB")
	growth("goroutines per proxy", func(g *Growth) float64 { return g.Goroutines }, "")
	row("heap with the mesh loaded (after GC)", func(p Phase) float64 { return p.HeapLoaded }, "MiB")
	row("heap with every proxy connected (after GC)", func(p Phase) float64 { return p.HeapConnected }, "MiB")
	row("heap of the largest pusher, every proxy connected", func(p Phase) float64 { return p.HeapPerPusher }, "MiB")
	row("change events the busiest pusher took", func(p Phase) float64 { return p.EventsPerPusher }, "")
	row("change events all pushers took", func(p Phase) float64 { return p.EventsAll }, "")
}

// traffic are the rows of the store's and the bus's traffic, the bytes
// the proxies received and the stream errors.
func (t figureTable) traffic() {
	row := t.row
	traffic := func(name string, f func(t *Traffic) float64, unit string) {
		row(name, func(p Phase) float64 {
			if p.Traffic == nil {
				return math.NaN()
			}
			return f(p.Traffic)
		}, unit)
	}
	traffic("etcd messages per change, in / out", func(t *Traffic) float64 { return t.EtcdMsgsIn + t.EtcdMsgsOut }, "")
	traffic("· etcd messages in (requests)", func(t *Traffic) float64 { return t.EtcdMsgsIn }, "")
	traffic("etcd bytes per change, in + out", func(t *Traffic) float64 { return (t.EtcdBytesIn + t.EtcdBytesOut) / 1024 }, "KiB")
	traffic("NATS messages in per change (published, acked)", func(t *Traffic) float64 { return t.NATSMsgsIn }, "")
	traffic("NATS messages out per change (delivered)", func(t *Traffic) float64 { return t.NATSMsgsOut }, "")
	traffic("NATS bytes per change, in", func(t *Traffic) float64 { return t.NATSBytesIn / 1024 }, "KiB")
	traffic("NATS bytes per change, out", func(t *Traffic) float64 { return t.NATSBytesOut / 1024 }, "KiB")
	row("RSS with the mesh loaded", func(p Phase) float64 { return p.RSSLoaded }, "MiB")
	row("RSS max", func(p Phase) float64 { return p.RSSMax }, "MiB")
	row("responses per proxy", func(p Phase) float64 { return p.ResponsesPerProxy }, "")
	row("bytes per proxy", func(p Phase) float64 { return p.BytesPerProxy / 1024 }, "KiB")
	row("· before the changes (full config)", func(p Phase) float64 { return p.ConfigBytesPerProxy / 1024 }, "KiB")
	for _, typ := range []string{"CDS", "EDS", "LDS", "RDS", "VHDS"} {
		changed := func(f func(t TypeTraffic) float64) func(p Phase) float64 {
			return func(p Phase) float64 {
				for _, t := range p.ChangeTraffic {
					if t.Type == typ {
						return f(t)
					}
				}
				return math.NaN()
			}
		}
		row("· "+typ+" bytes per change and proxy", changed(func(t TypeTraffic) float64 { return t.Bytes / 1024 }), "KiB")
		row("· "+typ+" responses per 100 changes and proxy", changed(func(t TypeTraffic) float64 { return 100 * t.Responses }), "")
		row("· "+typ+" bytes per response", changed(func(t TypeTraffic) float64 {
			if t.Responses == 0 {
				return math.NaN()
			}
			return t.Bytes / t.Responses / 1024
		}), "KiB")
	}
	row("NACKs", func(p Phase) float64 { return float64(p.NACKs) }, "")
	row("stream errors", func(p Phase) float64 { return float64(p.Errors) }, "")
}

// phaseDetails writes a phase's list: its changes by kind, stages, storm,
// slow readers, trickle, moves, faults and problems.
func phaseDetails(b *strings.Builder, p Phase) {
	fmt.Fprintf(b, "- %s: %d proxies (%d Delta), %d changes, %d never converged", p.Name, p.Proxies, p.Delta, p.Changes, p.Unconverged)
	if p.IngestCPUSeconds > 0 {
		fmt.Fprintf(b, "; the ingester used %.2f CPU s", p.IngestCPUSeconds)
	}
	if p.StoreCPUSeconds > 0 {
		fmt.Fprintf(b, ", etcd and NATS %.2f CPU s", p.StoreCPUSeconds)
	}
	b.WriteString(".\n")
	for _, kind := range slices.Sorted(maps.Keys(p.ByKind)) {
		pc := p.ByKind[kind]
		fmt.Fprintf(b, "  - %s changes: %d, convergence p50 %s, p99 %s, max %s\n", kind, pc.N, format(pc.P50, "s"), format(pc.P99, "s"), format(pc.Max, "s"))
	}
	if len(p.Stages) > 0 {
		b.WriteString("  - where the time goes, as the control plane measured each stage (p50 / p99, samples):\n")
		for _, s := range p.Stages {
			fmt.Fprintf(b, "    - %s: %s / %s (%d)\n", s.Name, format(s.P50, "s"), format(s.P99, "s"), s.N)
		}
	}
	if s := p.Storm; s != nil {
		fmt.Fprintf(b, "  - reconnect storm: %d proxies lost their pusher at once; all had reconnected after %s and had the change made at the kill after %s\n",
			s.Proxies, format(s.Reconnected, "s"), format(s.Converged, "s"))
	}
	if p.SlowReaders > 0 {
		fmt.Fprintf(b, "  - beside the fleet, %d proxies read each response %s late\n", p.SlowReaders, format(p.SlowReadDelay, "s"))
	}
	if tr := p.Trickle; tr != nil {
		fmt.Fprintf(b, "  - beside the fleet, %.3g proxies a second connected for %s each (%d in all): %d got a full config, in %s at p99\n",
			tr.Rate, format(tr.Life, "s"), tr.Started, tr.Served, format(tr.FullP99, "s"))
	}
	for _, m := range p.Moves {
		fmt.Fprintf(b, "  - %s: %d proxies of those namespaces moved, %d others reconnected; every proxy held a full config from its shard after %s, the changes made at that moment reached every proxy after %s\n",
			m.Name, m.Moved, m.Others, format(m.Placed, "s"), format(m.ChangeConverged, "s"))
	}
	for _, f := range p.Faults {
		faultDetails(b, f)
	}
	for _, pr := range p.Problems {
		fmt.Fprintf(b, "  - PROBLEM: %s\n", pr)
	}
}

// faultDetails writes what a fault did and what the control plane said.
func faultDetails(b *strings.Builder, f Fault) {
	fmt.Fprintf(b, "  - fault: %s for %s; every change made until its end reached every proxy %s after it (%d pending)\n",
		f.Name, format(f.Lasted, "s"), format(f.Recovered, "s"), f.Pending)
	if d := f.During; d != nil {
		fmt.Fprintf(b, "    the %d changes made during it reached every other proxy in %s at p99, %s at most\n", d.Changes, format(d.P99, "s"), format(d.Max, "s"))
	}
	if f.Said != "" {
		fmt.Fprintf(b, "    the pushers meanwhile: %s\n", f.Said)
	}
	if in := f.Input; in != nil {
		fmt.Fprintf(b, "    both pushers served it alike after %s and its removal after %s; the churn alone converged in %s at p99\n",
			format(in.Applied, "s"), format(in.Removed, "s"), format(in.NormalP99, "s"))
		fmt.Fprintf(b, "    the grpc-go clients followed %d endpoint moves meanwhile in %s at most; %d RPCs failed\n", in.Moves, format(in.FollowMax, "s"), in.RPCsFailed)
		fmt.Fprintf(b, "    the pushers used %s CPU-s; RSS at most %s MiB\n", format(in.CPUSeconds, ""), format(in.PeakRSSMiB, ""))
	}
	if fl := f.Flood; fl != nil {
		fmt.Fprintf(b, "    sent: %s\n", fl.Sent)
		fmt.Fprintf(b, "    pusher: RSS at most %s MiB under a limit of %s MiB, live heap %s MiB as it ended; OOM-killed: %v\n",
			format(fl.PeakRSSMiB, ""), format(fl.LimitMiB, ""), format(fl.LiveHeapMiB, ""), fl.OOMKilled)
		if fl.NewProxy >= 0 {
			fmt.Fprintf(b, "    a proxy connecting with a token meanwhile was served after %s\n", format(fl.NewProxy, "s"))
		} else {
			fmt.Fprintf(b, "    a proxy connecting with a token meanwhile was not served: %s\n", fl.NewProxyError)
		}
		if fl.Registered >= 0 {
			fmt.Fprintf(b, "    another namespace's workload registering meanwhile had its WorkloadEntry after %s\n", format(fl.Registered, "s"))
		} else {
			fmt.Fprintf(b, "    another namespace's workload registering meanwhile had no WorkloadEntry: %s\n", fl.RegisteredError)
		}
	}
}

// capacity writes the capacity search's result and trials, if it ran.
func (r *Report) capacity(b *strings.Builder) {
	if c := r.Capacity; c != nil {
		fmt.Fprintf(b, "\n## Capacity\n\nThe most proxies one pusher kept at convergence p99 ≤ %s: **%d**", format(c.Bound, "s"), c.Proxies)
		if c.AtLimit {
			fmt.Fprintf(b, " (the search stopped at the %d a trial may open: the limit of open files)", c.Limit)
		}
		b.WriteString(".\n\n| proxies | convergence p99 | CPU per change | load test's own CPU | passed |\n| ---: | ---: | ---: | ---: | --- |\n")
		for _, t := range c.Trials {
			fmt.Fprintf(b, "| %d | %s | %s | %s | %v |\n", t.Proxies, format(t.P99, "s"), format(t.CPUPerChange, "ms"), format(t.HarnessCPUSeconds, "s"), t.OK)
		}
	}
}

func scenarioLine(s any) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func format(v float64, unit string) string {
	if math.IsNaN(v) {
		return "—"
	}
	switch unit {
	case "s":
		if v < 1 {
			return fmt.Sprintf("%.0f ms", v*1000)
		}
		return fmt.Sprintf("%.2f s", v)
	case "":
		if v == math.Trunc(v) {
			return fmt.Sprintf("%.0f", v)
		}
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

func ratio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "—"
	}
	return fmt.Sprintf("%.2f", a/b)
}

// ControlPlaneCPUPerChange is the CPU of every control-plane process
// (pushers, ingester, etcd and NATS) during the changes, per change.
func (p Phase) ControlPlaneCPUPerChange() float64 {
	if p.Changes == 0 {
		return 0
	}
	return (p.CPUSeconds + p.IngestCPUSeconds + p.StoreCPUSeconds) * 1000 / float64(p.Changes)
}
