package main

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
)

// changing is the changes of a phase, and what is read of the processes
// around them.
type changing struct {
	cp         *controlPlane
	mesh       *meshgen.Mesh
	tracker    *track.Tracker
	fleet      *sim.Fleet
	fcfg       sim.Config
	sampler    *procstat.Sampler
	phaseStart time.Time
	prog       *progress
}

// counters are what a phase reads of its processes before and after the
// changes.
type counters struct {
	stages                []buckets
	ingester, store, self procstat.Sample
	traffic               []float64
	events                []float64 // each pusher's change events
}

func (cp *controlPlane) counters() counters {
	c := counters{stages: scrapeStages(cp.ingester, cp.servers), traffic: storeTraffic(cp.store)}
	if cp.ingester != nil {
		c.ingester, _ = procstat.Read(cp.ingester.pid())
	}
	if cp.store != nil {
		c.store, _ = procstat.Read(cp.store.pid())
	}
	c.self, _ = procstat.Read(os.Getpid())
	c.events = make([]float64, len(cp.servers))
	for i, p := range cp.servers {
		c.events[i] = counterOf(p, "shardpilot_pusher_events_total")
	}
	return c
}

// profiled are the processes --profile profiles: the serving ones and
// the ingester, which the whole control plane's CPU counts too.
func (cp *controlPlane) profiled() []*proc {
	if cp.ingester == nil {
		return cp.servers
	}
	return append(slices.Clone(cp.servers), cp.ingester)
}

// run makes the changes (with the trickle of short-lived proxies, the
// slow readers and the CPU hogs beside them), lets them settle, and
// records what they cost.
func (ch changing) run(ctx context.Context, ph report.Phase) (report.Phase, error) {
	cp, sc := ch.cp, ch.cp.sc
	before := usage(cp.servers)
	was := cp.counters()
	changesStart := time.Now()
	received := ch.fleet.Stats()
	profiled := profile(ctx, sc, cp.profiled())
	besideCtx, stopBeside := context.WithCancel(ctx)
	trickled := make(chan *report.Trickle, 1)
	go func() { trickled <- trickle(besideCtx, sc, ch.fcfg) }()
	stopHogs := hogs(sc.Hogs)
	slowDone := make(chan struct{})
	go func() { defer close(slowDone); slowReaders(besideCtx, sc, ch.fcfg) }()
	if sc.SlowReaders > 0 {
		ph.SlowReaders, ph.SlowReadDelay = sc.SlowReaders, sc.SlowReadDelay.Seconds()
	}
	err := makeChanges(ctx, sc, ch.mesh, ch.tracker, ch.fleet, changesStart, ch.prog)
	stopBeside()
	stopHogs()
	ph.Trickle = <-trickled
	<-slowDone
	if err != nil {
		return ph, err
	}
	settleStart := time.Now()
	for ch.tracker.Pending() > 0 && time.Since(settleStart) < sc.Settle && ctx.Err() == nil {
		ch.prog.printf("settling: %d changes not yet at every proxy (%s)", ch.tracker.Pending(), time.Since(settleStart).Round(time.Second))
		time.Sleep(50 * time.Millisecond)
	}
	end := usage(cp.servers)
	profiled()
	now := cp.counters()
	ch.prog.done("settled: %d changes pending after %s", ch.tracker.Pending(), time.Since(settleStart).Round(time.Millisecond))
	cpu := end.CPU - before.CPU
	ph = finish(ph, ch.fleet, ch.tracker, ch.sampler, cp.servers, ch.phaseStart, changesStart, &cpu)
	ph.ConfigBytesPerProxy, ph.ChangeTraffic = changeTraffic(received, ch.fleet.Stats(), len(ch.tracker.Results()))
	cp.record(&ph, was, now, len(ch.tracker.Results()))
	ph.ChangeRate = float64(ph.Changes) / sc.Duration.Seconds()
	return ph, nil
}

// record sets what the processes did between two readings of their
// counters, over made changes.
func (cp *controlPlane) record(ph *report.Phase, was, now counters, made int) {
	if now.self.CPU > 0 {
		ph.HarnessCPUSeconds = (now.self.CPU - was.self.CPU).Seconds()
	}
	if ph.Target == "shardpilot" {
		// The change events each pusher took while the changes were made.
		for i := range cp.servers {
			n := now.events[i] - was.events[i]
			ph.EventsPerPusher = max(ph.EventsPerPusher, n)
			ph.EventsAll += n
		}
	}
	if cp.ingester != nil {
		if now.ingester.CPU > 0 {
			ph.IngestCPUSeconds = (now.ingester.CPU - was.ingester.CPU).Seconds()
		}
		ph.Stages = stageSummaries(was.stages, now.stages)
	}
	if cp.store != nil && now.store.CPU > 0 {
		ph.StoreCPUSeconds = (now.store.CPU - was.store.CPU).Seconds()
	}
	// Per change made: etcd and NATS carry every change, whether or not a
	// proxy running sees it (one shard alone).
	if cp.store != nil && made > 0 {
		per := func(i int) float64 { return (now.traffic[i] - was.traffic[i]) / float64(made) }
		ph.Traffic = &report.Traffic{EtcdMsgsIn: per(0), EtcdMsgsOut: per(1), EtcdBytesIn: per(2), EtcdBytesOut: per(3),
			NATSMsgsIn: per(4), NATSMsgsOut: per(5), NATSBytesIn: per(6), NATSBytesOut: per(7)}
	}
}

// makeChanges edits the mesh at the scenario's rates for its duration,
// with the same sequence in every phase.
func makeChanges(ctx context.Context, sc Scenario, mesh *meshgen.Mesh, tracker *track.Tracker, fleet *sim.Fleet, begin time.Time, prog *progress) error {
	rng := rand.New(rand.NewPCG(sc.Seed, 3))
	total := sc.EndpointRate + sc.RouteRate + sc.ServiceRate
	// Changes follow a schedule rather than a ticker, which would drop
	// ticks when the machine is busy: a late change is made at once.
	interval := time.Duration(float64(time.Second) / total)
	made := 0
	added := map[int]time.Time{} // dynamic services by the change that added them
	for i := 1; time.Duration(i)*interval < sc.Duration; i++ {
		if wait := time.Until(begin.Add(time.Duration(i) * interval)); wait > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
		}
		kind := meshgen.Endpoint
		switch x := rng.Float64() * total; {
		case x >= sc.EndpointRate+sc.RouteRate:
			kind = meshgen.AddService
			if rng.IntN(2) == 0 {
				kind = meshgen.RemoveService
			}
		case x >= sc.EndpointRate:
			kind = meshgen.Route
		}
		pick := rng.IntN(1 << 30)
		if kind == meshgen.RemoveService {
			// Remove the oldest dynamic service, once every proxy can have
			// seen it: a service added and removed within one debounce is
			// never visible, and its changes could not be told apart from lost ones.
			dyn := mesh.Dynamic()
			if len(dyn) == 0 || time.Since(added[dyn[0]]) < 5*time.Second || (sc.removeSeen && !tracker.Done(dyn[0])) {
				kind = meshgen.AddService
			}
			pick = 0
		}
		c, err := mesh.Apply(kind, pick, func(c meshgen.Change) { tracker.Made(c, time.Now()) })
		if err != nil {
			return err
		}
		if c.Kind == meshgen.AddService {
			added[c.N] = time.Now()
		}
		made++
		prog.printf("changes: %d made in %s, %d not yet at every proxy, %d/%d proxies hold a full config",
			made, time.Since(begin).Round(time.Second), tracker.Pending(), fleet.Full(), fleet.Size())
	}
	prog.done("changes: %d made in %s", made, time.Since(begin).Round(time.Second))
	return nil
}

// trickle connects sc.Trickle proxies a second beside the fleet of fcfg
// until ctx is done, each for sc.TrickleLife, numbered after the fleet's;
// nil when the scenario has none.
func trickle(ctx context.Context, sc Scenario, fcfg sim.Config) *report.Trickle {
	if sc.Trickle <= 0 {
		return nil
	}
	interval := time.Duration(float64(time.Second) / sc.Trickle)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		full []time.Duration
	)
	started := 0
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-tick.C:
			f, err := sim.New(beside(fcfg, sc.Proxies+started, 1))
			started++
			if err != nil {
				continue
			}
			wg.Go(func() {
				life, cancel := context.WithTimeout(context.WithoutCancel(ctx), sc.TrickleLife)
				defer cancel()
				_ = f.Run(life)
				if d := f.Stats().FirstFull[0]; d > 0 {
					mu.Lock()
					full = append(full, d)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return &report.Trickle{Rate: sc.Trickle, Life: sc.TrickleLife.Seconds(), Started: started, Served: len(full), FullP99: report.Summarise(full).P99}
}

// beside is the configuration of n proxies beside the fleet of fcfg,
// numbered from first: untracked, and dialing the fleet's addresses.
func beside(fcfg sim.Config, first, n int) sim.Config {
	fcfg.Observer, fcfg.Resolve, fcfg.Shard, fcfg.Shards = nil, nil, 0, 1
	fcfg.First, fcfg.Proxies = first, n
	return fcfg
}

// hogs starts n processes that spin until the returned function is
// called.
func hogs(n int) (stop func()) {
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if cmd.Start() == nil {
			cmds = append(cmds, cmd)
		}
	}
	return func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
}

// slowReaders runs sc.SlowReaders proxies beside the fleet of fcfg until
// ctx is done, each reading its responses sc.SlowReadDelay late.
func slowReaders(ctx context.Context, sc Scenario, fcfg sim.Config) {
	if sc.SlowReaders <= 0 {
		return
	}
	cfg := beside(fcfg, sc.Proxies+100_000, sc.SlowReaders)
	cfg.ReadDelay = sc.SlowReadDelay
	f, err := sim.New(cfg)
	if err != nil {
		return
	}
	_ = f.Run(ctx)
}

// changeTraffic returns what a proxy had received before the changes
// (before), and what it received per change made and per xDS type between
// before and after.
func changeTraffic(before, after sim.Stats, made int) (float64, []report.TypeTraffic) {
	var config int64
	for _, b := range before.Bytes {
		config += b
	}
	proxies := float64(max(before.Proxies, 1))
	var per []report.TypeTraffic
	for i := range sim.Types {
		d := after.ByType[i].Minus(before.ByType[i])
		n := proxies * float64(max(made, 1))
		per = append(per, report.TypeTraffic{Type: sim.TypeNames[i], Responses: float64(d.Responses) / n, Bytes: float64(d.Bytes) / n})
	}
	return float64(config) / proxies, per
}
