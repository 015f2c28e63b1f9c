package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"regexp"
	"runtime/pprof"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
)

// Scenario is what a run does; it is printed in the report.
type Scenario struct {
	Proxies    int     `json:"proxies"`
	Services   int     `json:"services"`
	Endpoints  int     `json:"endpoints_per_service"`
	Namespaces int     `json:"namespaces"`
	Delta      float64 `json:"delta_share"`
	NACKRate   float64 `json:"nack_rate"`
	// PerConn is how many proxies share one gRPC connection: 1, as real
	// Envoys do, counts every connection's cost.
	PerConn      int           `json:"proxies_per_connection"`
	EndpointRate float64       `json:"endpoint_changes_per_s"`
	RouteRate    float64       `json:"route_changes_per_s"`
	ServiceRate  float64       `json:"service_changes_per_s"`
	Duration     time.Duration `json:"duration"`
	Settle       time.Duration `json:"settle"`
	Pushers      []int         `json:"pushers"`
	// TLS serves ADS over TLS (a certificate of a CA made for the run);
	// the proxies verify it.
	TLS bool `json:"tls,omitempty"`
	// PusherFlags are passed to every pusher (after the load test's own).
	PusherFlags []string `json:"pusher_flags,omitempty"`
	// Shards, when set, gives every namespace a Sidecar (its own and the
	// shared namespaces) and runs a phase for each count of pushers, each
	// serving the proxies of its namespaces (--namespaces-file: ns-<i> to
	// pusher i mod the count; a proxy dials its namespace's shard).
	// Reshard then adds a shard to the last of them and removes it.
	Shards  []int `json:"shards,omitempty"`
	Reshard bool  `json:"reshard,omitempty"`
	// ShardAlone runs, after the sharded phases, shard 0 of the last count
	// alone with its proxies: one shard as on a machine of its own.
	ShardAlone bool `json:"shard_alone,omitempty"`
	Baseline   bool `json:"baseline"`
	// Istiod, when set, is a directory of Istio's binaries
	// (hack/istio-binaries.sh): istiod then runs the same mesh, changes
	// and proxies, its mesh written through a kube-apiserver (Istio
	// resources), and the report gives shardpilot ÷ istiod.
	Istiod string `json:"istiod,omitempty"`
	Storm  bool   `json:"storm"`
	// Trickle is how many proxies a second connect beside the fleet while
	// the changes are made, each for TrickleLife (pods of rolling
	// deployments): their first configs must not hold the fleet's
	// changes back.
	Trickle     float64       `json:"trickle_per_s,omitempty"`
	TrickleLife time.Duration `json:"trickle_life,omitempty"`
	// SlowReaders proxies beside the fleet read each response
	// SlowReadDelay late while the changes are made: a proxy behind must
	// not hold the others' changes back.
	SlowReaders   int           `json:"slow_readers,omitempty"`
	SlowReadDelay time.Duration `json:"slow_read_delay,omitempty"`
	// PusherProcs, when set, is every pusher's GOMAXPROCS, and Hogs is how
	// many processes spin beside it while the changes are made: a pusher
	// starved of CPU. Bound, when set, fails the run if a change took
	// longer to reach every proxy.
	PusherProcs int           `json:"pusher_gomaxprocs,omitempty"`
	Hogs        int           `json:"cpu_hogs,omitempty"`
	Bound       time.Duration `json:"bound,omitempty"`
	Faults      bool          `json:"faults"`
	// Floods runs the floods a client may send at a pusher held to
	// FloodMemoryLimit (see floodPhase).
	Floods           bool   `json:"floods,omitempty"`
	FloodMemoryLimit string `json:"flood_memory_limit,omitempty"`
	// FloodsOnly runs the floods whose names begin with one of these
	// (all when empty), after the one for comparison.
	FloodsOnly []string      `json:"floods_only,omitempty"`
	FaultHold  time.Duration `json:"fault_hold"`
	// Inputs runs the heavy inputs (see inputsPhase): InputFilters
	// EnvoyFilters, InputServices services in one namespace, a
	// VirtualService of InputRoutes routes rewritten InputRewrites times.
	Inputs        bool `json:"inputs,omitempty"`
	InputFilters  int  `json:"input_filters,omitempty"`
	InputServices int  `json:"input_services,omitempty"`
	InputRoutes   int  `json:"input_routes,omitempty"`
	InputRewrites int  `json:"input_rewrites,omitempty"`
	// FaultOnly, when set, runs only the faults whose names it matches.
	FaultOnly *regexp.Regexp `json:"fault_only,omitempty"`
	Seed      uint64         `json:"seed"`
	// Source is what shardpilot's ingester reads: "yaml" (a directory) or
	// "kube" (Istio resources through a kube-apiserver). The baseline
	// always reads the directory.
	Source string `json:"source"`
	// Capacity, when set, runs no other phase: it searches for the most
	// proxies one pusher keeps at convergence p99 within it (capacity).
	Capacity time.Duration `json:"capacity_p99,omitempty"`
	// Profile saves each serving process's CPU profile over the changes
	// and its heap profile after them, into the output directory.
	Profile bool `json:"profile,omitempty"`

	bin, out       string
	connectTimeout time.Duration
	check          bool
	// removeSeen removes a dynamic service only once its addition reached
	// every proxy: under a fault that outlasts the 5 s wait, an addition
	// and its removal would otherwise reach the proxies as one no-change,
	// which counts as two changes that never converged.
	removeSeen bool
}

func runScenario(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var sc Scenario
	var rf runFlags
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sc.phaseFlags(fs, &rf)
	sc.besideFlags(fs)
	fs.StringVar(&rf.cpuProfile, "cpuprofile", "", "write the load test's own CPU profile to this file")
	if err := parse(fs, "Load-test shardpilot with simulated Envoys, side by side with a snapshot-cache baseline.", args); err != nil {
		return err
	}
	if err := sc.validate(rf); err != nil {
		return err
	}
	if err := os.MkdirAll(sc.out, 0o755); err != nil {
		return err
	}
	if rf.cpuProfile != "" {
		f, err := os.Create(rf.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	rep := &report.Report{Scenario: sc, Started: time.Now()}
	if sc.Capacity > 0 {
		c, phases, err := capacity(ctx, sc, stderr)
		rep.Capacity, rep.Phases = &c, phases
		if werr := rep.Write(sc.out, stdout); err == nil {
			err = werr
		}
		return err
	}
	if err := runPhases(ctx, sc, rep, stderr); err != nil {
		return err
	}
	if err := rep.Write(sc.out, stdout); err != nil {
		return err
	}
	if failed := sc.failures(rep); len(failed) > 0 {
		return fmt.Errorf("correctness check failed:\n  %s", strings.Join(failed, "\n  "))
	}
	return nil
}

// runFlags are the run command's flags that are not the scenario's.
type runFlags struct{ pushers, shards, cpuProfile string }

// phaseFlags defines the flags of the mesh, the changes and the phases.
func (sc *Scenario) phaseFlags(fs *flag.FlagSet, rf *runFlags) {
	fs.IntVar(&sc.Proxies, "proxies", 500, "simulated Envoys")
	fs.IntVar(&sc.Services, "services", 200, "services in the mesh")
	fs.IntVar(&sc.Endpoints, "endpoints", 10, "endpoints per service")
	fs.IntVar(&sc.Namespaces, "namespaces", 10, "namespaces the services and proxies spread over")
	fs.Float64Var(&sc.Delta, "delta", 0.5, "share of proxies that speak Delta xDS (the rest SotW)")
	fs.IntVar(&sc.PerConn, "per-conn", 1, "proxies sharing one gRPC connection (1: one connection per proxy, as real Envoys)")
	fs.Float64Var(&sc.NACKRate, "nack-rate", 0, "share of responses the proxies reject (a rejected change converges only with the next one of the same resource)")
	fs.Float64Var(&sc.EndpointRate, "endpoint-rate", 10, "endpoint changes per second")
	fs.Float64Var(&sc.RouteRate, "route-rate", 1, "route (VirtualService) changes per second")
	fs.Float64Var(&sc.ServiceRate, "service-rate", 0.5, "services added or removed per second")
	fs.DurationVar(&sc.Duration, "duration", 20*time.Second, "how long changes are made")
	fs.DurationVar(&sc.Settle, "settle", 30*time.Second, "how long to wait, after the last change, for every proxy to converge")
	fs.StringVar(&rf.pushers, "pushers", "1", "comma-separated pusher counts, one phase each (for example 1,2; empty for none)")
	fs.BoolVar(&sc.Baseline, "baseline", true, "also run the go-control-plane snapshot-cache baseline")
	fs.StringVar(&rf.shards, "shards", "", "comma-separated shard counts: give every namespace a Sidecar (its own and the shared namespaces) and run a phase of that many pushers for each, each serving its namespaces' proxies (empty: none); the --pushers phases then run on the same mesh, for comparison")
	fs.Func("pusher-flag", "a flag passed to every pusher, after the load test's own (repeat it for more; for example --pusher-flag=--grpc-read-buffer=8192)", func(v string) error {
		if !strings.HasPrefix(v, "-") {
			return fmt.Errorf("%q: want a flag, such as --grpc-read-buffer=8192", v)
		}
		sc.PusherFlags = append(sc.PusherFlags, v)
		return nil
	})
	fs.BoolVar(&sc.TLS, "tls", false, "serve ADS over TLS to the proxies (the baseline stays plaintext): what a connection costs with TLS")
	fs.BoolVar(&sc.ShardAlone, "shard-alone", false, "with --shards, also run shard 0 of the last count alone with its own proxies (and the changes they see), as one shard would run on a machine of its own")
	fs.BoolVar(&sc.Reshard, "reshard", false, "with --shards, after the changes of the last sharded phase, add a shard that takes a share of every shard's namespaces, then remove it: the proxies that move, those that do not, and how long they take")
}

// besideFlags defines the flags of what runs beside the changes (the
// trickle, the slow readers, the hogs), of the suites (faults, floods,
// heavy inputs) and of the run itself.
func (sc *Scenario) besideFlags(fs *flag.FlagSet) {
	fs.Float64Var(&sc.Trickle, "trickle", 0, "proxies a second that connect beside the fleet while the changes are made, each for --trickle-life, as pods of rolling deployments come and go (not measured; the fleet's changes must not wait for them)")
	fs.DurationVar(&sc.TrickleLife, "trickle-life", 3*time.Second, "how long each --trickle proxy stays connected")
	fs.IntVar(&sc.SlowReaders, "slow-readers", 0, "proxies beside the fleet that read each response --slow-read-delay late while the changes are made (not measured; the fleet's changes must not wait for them)")
	fs.DurationVar(&sc.SlowReadDelay, "slow-read-delay", 2*time.Second, "how late each --slow-readers proxy reads a response")
	fs.IntVar(&sc.PusherProcs, "pusher-gomaxprocs", 0, "every pusher's GOMAXPROCS (0: the machine's)")
	fs.IntVar(&sc.Hogs, "hogs", 0, "processes that spin beside the control plane while the changes are made (a machine starved of CPU)")
	fs.DurationVar(&sc.Bound, "bound", 0, "fail unless every change reached every proxy within this (0: no bound)")
	fs.StringVar(&sc.Istiod, "istiod", "", "directory of Istio's binaries (hack/istio-binaries.sh): also run istiod on the same mesh, changes and proxies, fed through a kube-apiserver built by hack/kube-binaries.sh, and report shardpilot ÷ istiod")
	fs.BoolVar(&sc.Storm, "storm", false, "also run the reconnect storm: kill the pusher holding every proxy")
	fs.BoolVar(&sc.Faults, "faults", false, "also run the fault suite: under churn, kill a pusher, stop NATS, stop etcd, kill the ingester leader; fails if a change is lost")
	fs.BoolVar(&sc.Floods, "floods", false, "also run the floods (needs a kube-apiserver built by hack/kube-binaries.sh, and root to hold the pusher to a memory limit): forged token reviews, registrations of one identity, made-up names, CSDS at once, unfinished messages, each for --fault-hold under churn, against a pusher set up as docs/security.md describes; fails if the pusher is killed, a change is lost, or a proxy or workload connecting meanwhile is not served or registered")
	fs.Func("floods-only", "comma-separated: run only the floods whose names begin with one of these (H2, H3, H4, H5, H6), after the one for comparison", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				sc.FloodsOnly = append(sc.FloodsOnly, f)
			}
		}
		return nil
	})
	fs.BoolVar(&sc.Inputs, "inputs", false, "also run the heavy inputs on the fault suite's processes (needs meshapp in --bin): contradictory EnvoyFilters, a namespace of many services, a VirtualService of many routes rewritten every second, each beside churn and a grpc-go client on each pusher; fails if an unrelated change is held back, a change is lost, or the pushers do not serve the input alike")
	fs.IntVar(&sc.InputFilters, "input-filters", 300, "--inputs: how many EnvoyFilters")
	fs.IntVar(&sc.InputServices, "input-services", 20000, "--inputs: how many services in the one namespace")
	fs.IntVar(&sc.InputRoutes, "input-routes", 5000, "--inputs: how many routes the VirtualService has")
	fs.IntVar(&sc.InputRewrites, "input-rewrites", 20, "--inputs: how many times (once a second) the VirtualService is rewritten")
	fs.StringVar(&sc.FloodMemoryLimit, "flood-memory-limit", "678Mi", "the pusher's memory limit under the floods: the chart's default (2 × the sized request of 339 MiB)")
	fs.DurationVar(&sc.FaultHold, "fault-hold", 30*time.Second, "how long the fault suite keeps NATS and etcd stopped")
	fs.Func("fault-only", "a regular expression: run only the faults of the suite whose names it matches (the last, NATS wiped, always runs)", func(v string) (err error) {
		sc.FaultOnly, err = regexp.Compile(v)
		return err
	})
	fs.StringVar(&sc.Source, "source", "yaml", `what the ingester reads: "yaml" (a directory) or "kube" (a kube-apiserver built by hack/kube-binaries.sh)`)
	fs.DurationVar(&sc.Capacity, "capacity", 0, "instead of the phases, find the most proxies one pusher keeps at this convergence p99: from --proxies, doubling until a trial fails, then bisecting to within a tenth; each trial is a phase of the report (0: no search)")
	fs.BoolVar(&sc.Profile, "profile", false, "save each serving process's CPU profile over the changes (<phase>-<process>-cpu.pprof, beside its log) and its heap profile after them (-heap.pprof) in --out: read them with go tool pprof")
	fs.Uint64Var(&sc.Seed, "seed", 1, "seed of the change sequence (every phase makes the same changes)")
	fs.StringVar(&sc.bin, "bin", ".bin", "directory holding the ingester and pusher binaries (make build)")
	fs.StringVar(&sc.out, "out", "loadtest/out", "directory for report.json, report.md, the plots and the processes' logs")
	fs.DurationVar(&sc.connectTimeout, "connect-timeout", 5*time.Minute, "how long every proxy may take to get its first full config")
	fs.BoolVar(&sc.check, "check", true, "fail unless every proxy converged on every change")
}

// validate parses the counts and checks the scenario.
func (sc *Scenario) validate(rf runFlags) error {
	var err error
	if sc.Pushers, err = counts("--pushers", rf.pushers); err != nil {
		return err
	}
	if sc.Shards, err = counts("--shards", rf.shards); err != nil {
		return err
	}
	for _, n := range sc.Shards {
		if sc.Namespaces%n != 0 || sc.Source != "yaml" || sc.Baseline || sc.PerConn != 1 {
			return fmt.Errorf("--shards %d: want a divisor of --namespaces (%d), with --source yaml, --baseline=false and --per-conn 1", n, sc.Namespaces)
		}
	}
	if (sc.Reshard || sc.ShardAlone) && len(sc.Shards) == 0 {
		return errors.New("--reshard, --shard-alone: give --shards")
	}
	if sc.Source != "yaml" && sc.Source != "kube" {
		return fmt.Errorf("--source %q: want yaml or kube", sc.Source)
	}
	if sc.Proxies < 1 || sc.Services < 1 || sc.Endpoints < 1 {
		return errors.New("--proxies, --services and --endpoints must each be at least 1")
	}
	if sc.EndpointRate < 0 || sc.RouteRate < 0 || sc.ServiceRate < 0 || sc.EndpointRate+sc.RouteRate+sc.ServiceRate == 0 {
		return errors.New("the change rates must not be negative, and not all zero")
	}
	for _, b := range []string{"ingester", "pusher"} {
		if _, err := os.Stat(filepath.Join(sc.bin, b)); err != nil {
			return fmt.Errorf("--bin %s: %w (run make build)", sc.bin, err)
		}
	}
	return nil
}

// runPhases runs the scenario's phases, in order, into the report.
func runPhases(ctx context.Context, sc Scenario, rep *report.Report, stderr io.Writer) error {
	var targets []target
	for _, n := range sc.Pushers {
		targets = append(targets, target{pushers: n})
	}
	for i, n := range sc.Shards {
		targets = append(targets, target{pushers: n, sharded: true, reshard: sc.Reshard && i == len(sc.Shards)-1})
	}
	if sc.ShardAlone {
		targets = append(targets, target{pushers: sc.Shards[len(sc.Shards)-1], sharded: true, alone: true})
	}
	of := func(t target) func(context.Context, Scenario, io.Writer) (report.Phase, error) {
		return func(ctx context.Context, sc Scenario, stderr io.Writer) (report.Phase, error) {
			return phase(ctx, sc, t, stderr)
		}
	}
	var runs []func(context.Context, Scenario, io.Writer) (report.Phase, error)
	for _, t := range targets {
		runs = append(runs, of(t))
	}
	for _, r := range []struct {
		on  bool
		run func(context.Context, Scenario, io.Writer) (report.Phase, error)
	}{
		{sc.Storm, of(target{pushers: 2, storm: true})},
		{sc.Faults, faultPhase},
		{sc.Inputs, inputsPhase},
		{sc.Floods, floodPhase},
		{sc.Istiod != "", of(target{istiod: true})},
		{sc.Baseline, of(target{baseline: true})},
	} {
		if r.on {
			runs = append(runs, r.run)
		}
	}
	for _, run := range runs {
		ph, err := run(ctx, sc, stderr)
		if err != nil {
			return err
		}
		rep.Phases = append(rep.Phases, ph)
	}
	return nil
}

// failures are the problems of shardpilot's phases, and the changes over
// the bound (none unless --check).
func (sc *Scenario) failures(rep *report.Report) []string {
	if !sc.check {
		return nil
	}
	var failed []string
	for _, p := range rep.Phases {
		if p.Target != "shardpilot" {
			continue // what the baseline or istiod cannot do is a measurement, not a failure
		}
		for _, pr := range p.Problems {
			failed = append(failed, p.Name+": "+pr)
		}
		if sc.Bound > 0 && p.Convergence.Max > sc.Bound.Seconds() {
			failed = append(failed, fmt.Sprintf("%s: a change took %.2f s to reach every proxy, over the bound of %s", p.Name, p.Convergence.Max, sc.Bound))
		}
	}
	return failed
}

// counts parses a flag's comma-separated counts of at least 1 (none when empty).
func counts(flag, list string) ([]int, error) {
	if strings.TrimSpace(list) == "" {
		return nil, nil
	}
	var out []int
	for _, p := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s %q: want comma-separated counts of at least 1", flag, list)
		}
		out = append(out, n)
	}
	return out, nil
}

// progress prints a status line: rewritten in place on a terminal, and
// at most every few seconds, a line each, in a log.
type progress struct {
	w     io.Writer
	tty   bool
	every time.Duration
	last  time.Time
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, every: 5 * time.Second}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty, p.every = true, 250*time.Millisecond
		}
	}
	return p
}

func (p *progress) printf(format string, args ...any) {
	if time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	if p.tty {
		fmt.Fprintf(p.w, "\r"+format+"   ", args...)
	} else {
		fmt.Fprintf(p.w, format+"\n", args...)
	}
}

// done ends the status line with a final message.
func (p *progress) done(format string, args ...any) {
	if p.tty {
		fmt.Fprint(p.w, "\r")
	}
	fmt.Fprintf(p.w, format+"\n", args...)
	p.last = time.Time{}
}

// target is the control plane of one phase.
type target struct {
	baseline, istiod bool
	pushers          int
	storm            bool
	// sharded pushers serve their namespaces' proxies alone; reshard adds
	// a shard and removes it after the changes; alone runs the first
	// shard's pusher and proxies alone.
	sharded, reshard, alone bool
}

func (t target) name() string {
	switch {
	case t.baseline:
		return "baseline"
	case t.istiod:
		return "istiod"
	case t.storm:
		return "shardpilot, reconnect storm"
	case t.alone:
		return fmt.Sprintf("shardpilot, 1 of %d shards alone", t.pushers)
	case t.sharded:
		return fmt.Sprintf("shardpilot, %d shards", t.pushers)
	case t.pushers == 1:
		return "shardpilot, 1 pusher"
	}
	return fmt.Sprintf("shardpilot, %d pushers", t.pushers)
}

// connect waits until every proxy holds a full config, and says what went
// wrong when they do not within the connect timeout.
func connect(ctx context.Context, sc Scenario, fleet *sim.Fleet, prog *progress) string {
	start := time.Now()
	for fleet.Full() < fleet.Size() {
		if time.Since(start) > sc.connectTimeout || ctx.Err() != nil {
			return fmt.Sprintf("only %d of %d proxies got a full config within %s", fleet.Full(), fleet.Size(), sc.connectTimeout)
		}
		prog.printf("connecting: %d/%d proxies hold a full config (%s)", fleet.Full(), fleet.Size(), time.Since(start).Round(time.Second))
		time.Sleep(50 * time.Millisecond)
	}
	prog.done("connected: %d proxies hold a full config after %s", fleet.Size(), time.Since(start).Round(time.Millisecond))
	return ""
}

// announce prints a phase's start, and returns what prints its end.
func announce(stderr io.Writer, sc Scenario, name string) func() {
	fmt.Fprintf(stderr, "== %s: %d proxies, %d services × %d endpoints\n", name, sc.Proxies, sc.Services, sc.Endpoints)
	began := time.Now()
	return func() { fmt.Fprintf(stderr, "== %s: done in %s\n", name, time.Since(began).Round(time.Second)) }
}

// workDir makes a phase's working directory and its mesh directory in it.
func workDir() (work, meshDir string, err error) {
	work, err = os.MkdirTemp("", "shardpilot-loadtest-")
	if err != nil {
		return "", "", err
	}
	meshDir = filepath.Join(work, "mesh")
	if err := os.Mkdir(meshDir, 0o755); err != nil {
		os.RemoveAll(work)
		return "", "", err
	}
	return work, meshDir, nil
}

// storm kills the pusher holding every proxy and makes a change at that
// moment: the time until every proxy ACKed it, through the surviving
// pusher, is how long the mesh took to converge again.
func storm(ctx context.Context, sc Scenario, servers []*proc, mesh *meshgen.Mesh, fleet *sim.Fleet, tracker *track.Tracker, prog *progress) *report.Storm {
	s := &report.Storm{Proxies: sc.Proxies}
	killed := time.Now()
	servers[0].kill()
	c, err := mesh.Apply(meshgen.Endpoint, 0, func(c meshgen.Change) { tracker.Made(c, time.Now()) })
	if err != nil {
		return s
	}
	deadline := killed.Add(sc.Settle + sc.connectTimeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if s.Reconnected == 0 && fleet.Full() == sc.Proxies {
			s.Reconnected = time.Since(killed).Seconds()
		}
		if tracker.Pending() == 0 && s.Reconnected > 0 {
			break
		}
		prog.printf("storm: %d/%d proxies hold a full config again, change %d pending at some", fleet.Full(), sc.Proxies, c.N)
		time.Sleep(20 * time.Millisecond)
	}
	prog.done("storm: all converged again after %.2fs (reconnected after %.2fs)", time.Since(killed).Seconds(), s.Reconnected)
	for _, r := range tracker.Results() {
		if r.Change.N == c.N && r.Done {
			s.Converged, s.OK = r.Converged.Seconds(), s.Reconnected > 0
		}
	}
	return s
}

// trafficCounters are the store's counters of its clients' traffic, in
// report.Traffic's order.
var trafficCounters = []string{
	"grpc_server_msg_received_total", "grpc_server_msg_sent_total",
	"etcd_network_client_grpc_received_bytes_total", "etcd_network_client_grpc_sent_bytes_total",
	"loadtest_nats_in_msgs_total", "loadtest_nats_out_msgs_total", "loadtest_nats_in_bytes_total", "loadtest_nats_out_bytes_total",
}

// storeTraffic reads the store's traffic counters now (zeros without a store).
func storeTraffic(store *proc) []float64 {
	out := make([]float64, len(trafficCounters))
	for i, name := range trafficCounters {
		out[i] = counterOf(store, name)
	}
	return out
}

// usage sums the processes' CPU and RSS now.
func usage(ps []*proc) procstat.Sample {
	var sum procstat.Sample
	for _, p := range ps {
		if p.cmd.ProcessState != nil {
			continue
		}
		if s, err := procstat.Read(p.pid()); err == nil {
			sum.CPU += s.CPU
			sum.RSS += s.RSS
		}
	}
	sum.At = time.Now()
	return sum
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// memory is what the Go runtime says of processes' memory, summed.
type memory struct {
	live, inUse, idle, stacks, goal, goroutines int64
}

var memStatsLine = regexp.MustCompile(`(?m)^# (HeapAlloc|HeapInuse|HeapIdle|HeapReleased|Stack|NextGC) = (\d+)`)
var goroutinesLine = regexp.MustCompile(`goroutine profile: total (\d+)`)

// memoryOf reads the processes' memory right after a collection (from
// /debug/pprof/heap?gc=1): the live heap, unlike RSS, leaves out garbage
// and memory the runtime has not yet returned to the system.
func memoryOf(ps []*proc) memory {
	var sum memory
	// A process thrashing at its memory limit may take its connections
	// and never answer: it is left out rather than waited for.
	client := http.Client{Timeout: 30 * time.Second}
	get := func(url string) []byte {
		resp, err := client.Get(url)
		if err != nil {
			return nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	for _, p := range ps {
		// Two collections: the first moves sync.Pool contents (gRPC's
		// buffers) to its victim cache, the second frees them.
		get("http://" + p.heap + "/debug/pprof/heap?gc=1&debug=1")
		f := map[string]int64{}
		for _, m := range memStatsLine.FindAllSubmatch(get("http://"+p.heap+"/debug/pprof/heap?gc=1&debug=1"), -1) {
			f[string(m[1])], _ = strconv.ParseInt(string(m[2]), 10, 64)
		}
		sum.live += f["HeapAlloc"]
		sum.inUse += f["HeapInuse"] - f["HeapAlloc"]
		sum.idle += f["HeapIdle"] - f["HeapReleased"]
		sum.stacks += f["Stack"]
		sum.goal += f["NextGC"]
		if m := goroutinesLine.FindSubmatch(get("http://" + p.heap + "/debug/pprof/goroutine?debug=1")); m != nil {
			n, _ := strconv.ParseInt(string(m[1]), 10, 64)
			sum.goroutines += n
		}
	}
	return sum
}

// profile, with sc.Profile, starts each server's CPU profile over the
// changes (sc.Duration); the function it returns waits for them and then
// saves each server's heap profile.
func profile(ctx context.Context, sc Scenario, servers []*proc) (wait func()) {
	if !sc.Profile {
		return func() {}
	}
	save := func(p *proc, query, suffix string) {
		client := http.Client{Timeout: sc.Duration + time.Minute}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.heap+"/debug/pprof/"+query, nil)
		if err != nil {
			return
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Fprintf(os.Stderr, "profile of %s: %v\n", p.name, err)
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(filepath.Join(sc.out, p.name+suffix))
		if err != nil {
			return
		}
		defer f.Close()
		io.Copy(f, resp.Body)
	}
	var wg sync.WaitGroup
	for _, p := range servers {
		wg.Go(func() { save(p, fmt.Sprintf("profile?seconds=%d", max(int(sc.Duration.Seconds()), 1)), "-cpu.pprof") })
	}
	return func() {
		wg.Wait()
		for _, p := range servers {
			save(p, "heap?gc=1", "-heap.pprof")
		}
	}
}

// finish sets a phase's figures from what the proxies received, when each
// change reached them, and what the serving processes used over time.
func finish(ph report.Phase, fleet *sim.Fleet, tracker *track.Tracker, sampler *procstat.Sampler, servers []*proc,
	phaseStart, changesStart time.Time, cpu *time.Duration) report.Phase {
	received(&ph, fleet.Stats())
	converged(&ph, tracker, changesStart)
	if cpu != nil && ph.Changes > 0 {
		ph.CPUSeconds = cpu.Seconds()
		ph.CPUPerChange = cpu.Seconds() * 1000 / float64(ph.Changes)
	}
	used(&ph, sampler, servers, phaseStart)
	return ph
}

// received sets what the proxies received: their first full config, and
// the responses and bytes each.
func received(ph *report.Phase, st sim.Stats) {
	ph.Delta, ph.NACKs, ph.Errors = st.Delta, st.NACKs, st.Errors
	var first []time.Duration
	never := 0
	for _, d := range st.FirstFull {
		if d == 0 {
			never++
			continue
		}
		first = append(first, d)
	}
	ph.FirstConfig = report.Summarise(first)
	if never > 0 {
		ph.Problems = append(ph.Problems, fmt.Sprintf("%d proxies never got a full config", never))
	}
	var responses, bytes int64
	for i := range st.Responses {
		responses += st.Responses[i]
		bytes += st.Bytes[i]
	}
	ph.ResponsesPerProxy = float64(responses) / float64(max(st.Proxies, 1))
	ph.BytesPerProxy = float64(bytes) / float64(max(st.Proxies, 1))
}

// converged sets when the changes reached every proxy that sees them
// (made from changesStart), overall and by kind, and which did not.
func converged(ph *report.Phase, tracker *track.Tracker, changesStart time.Time) {
	var all []time.Duration
	byKind := map[string][]time.Duration{}
	n, each := tracker.EachProxy(0.5, 0.9, 0.99, 1)
	ph.EachProxy = report.Percentiles{N: n, P50: each[0].Seconds(), P90: each[1].Seconds(), P99: each[2].Seconds(), Max: each[3].Seconds()}
	for _, r := range tracker.Results() {
		if r.Audience == 0 {
			continue // no proxy running sees it (one shard alone)
		}
		ph.Changes++
		if !r.Done {
			ph.Unconverged++
			if ph.Unconverged <= 5 {
				ph.Problems = append(ph.Problems, fmt.Sprintf("change %d (%s of service %d) reached %d of %d proxies",
					r.Change.N, r.Change.Kind, r.Change.Service, r.Proxies, ph.Proxies))
			}
			continue
		}
		all = append(all, r.Converged)
		byKind[r.Change.Kind.String()] = append(byKind[r.Change.Kind.String()], r.Converged)
		ph.Timeline = append(ph.Timeline, report.Point{At: r.Made.Sub(changesStart).Seconds(), Convergence: r.Converged.Seconds(), Kind: r.Change.Kind.String()})
	}
	if ph.Unconverged > 5 {
		ph.Problems = append(ph.Problems, fmt.Sprintf("and %d more changes did not reach every proxy", ph.Unconverged-5))
	}
	ph.Convergence = report.Summarise(all)
	ph.ByKind = map[string]report.Percentiles{}
	for k, ds := range byKind {
		ph.ByKind[k] = report.Summarise(ds)
	}
}

// used sets the serving processes' CPU and RSS over time, summed, from
// phaseStart.
func used(ph *report.Phase, sampler *procstat.Sampler, servers []*proc, phaseStart time.Time) {
	type acc struct {
		cpu time.Duration
		rss int64
	}
	var series []acc
	var times []time.Time
	perProc := make([][]procstat.Sample, len(servers))
	for i, p := range servers {
		perProc[i] = sampler.Samples(p.pid())
		for j := len(times); j < len(perProc[i]); j++ {
			series = append(series, acc{})
			times = append(times, perProc[i][j].At)
		}
	}
	for _, samples := range perProc {
		for i := range series {
			switch {
			case i < len(samples):
				series[i].cpu += samples[i].CPU
				series[i].rss += samples[i].RSS
			case len(samples) > 0:
				// A killed process keeps the CPU it used, and holds no memory.
				series[i].cpu += samples[len(samples)-1].CPU
			}
		}
	}
	var cpu0 time.Duration
	if len(series) > 0 {
		cpu0 = series[0].cpu
	}
	for i, a := range series {
		ph.Usage = append(ph.Usage, report.Usage{At: times[i].Sub(phaseStart).Seconds(), CPU: (a.cpu - cpu0).Seconds(), RSS: mib(a.rss)})
		ph.RSSMax = max(ph.RSSMax, mib(a.rss))
	}
}
