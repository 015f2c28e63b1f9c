package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
)

// inputsPhase runs the heavy inputs (make loadtest-inputs) on the fault
// suite's processes: etcd and NATS each in a process of their own, two
// ingesters taking turns by election, two pushers, with simulated Envoys
// on both pushers, a probe on each that keeps what it is sent, and a real
// grpc-go client on each calling a real server through them. Under steady
// churn, each input is written into the YAML directory, held, and
// removed: many EnvoyFilters that contradict one another, a namespace of
// many services, a VirtualService of many routes rewritten every second.
// For each it reports how the churn's changes (which have nothing to do
// with it) converged meanwhile against before, how long the grpc-go
// clients took to follow an endpoint moved every few seconds meanwhile,
// how long until both pushers served the input, and its removal, alike,
// and the pushers' CPU and largest RSS. A change that never reaches every
// proxy, an unrelated change held back, or pushers that do not agree
// within the bound fail the run.
func inputsPhase(ctx context.Context, sc Scenario, stderr io.Writer) (report.Phase, error) {
	ph := report.Phase{Name: "shardpilot, heavy inputs", Target: "shardpilot", Pushers: 2, Proxies: sc.Proxies}
	done := announce(stderr, sc, ph.Name)
	defer done()
	r, stop, err := newFaultRig(ctx, sc)
	defer stop()
	if err != nil {
		return ph, err
	}
	meshapp := filepath.Join(sc.bin, "meshapp")
	app, err := startEcho(sc.out, meshapp, r.meshDir, []string{r.servers[0].ads, r.servers[1].ads})
	defer app.stop()
	if err != nil {
		return ph, err
	}
	pctx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	probes := []*probe{newProbe(r.servers[0].ads, "ns-0"), newProbe(r.servers[1].ads, "ns-0")}
	for _, p := range probes {
		go p.run(pctx)
	}

	phaseStart := time.Now()
	var sampler procstat.Sampler
	fleet, err := r.newFleet()
	if err != nil {
		return ph, err
	}
	stopFleet := runFleet(ctx, fleet)
	defer stopFleet()
	prog := newProgress(stderr)
	if problem := connect(ctx, sc, fleet, prog); problem != "" {
		ph.Problems = append(ph.Problems, problem)
		return finish(ph, fleet, r.tracker, &sampler, r.servers, phaseStart, time.Now(), nil), nil
	}
	changesStart, stopChurn := steadyChurn(ctx, sc, r.mesh, r.tracker, fleet)
	defer stopChurn()
	// The churn alone, for what "normal" is on this machine today.
	time.Sleep(20 * time.Second)
	normal, _, _ := convergedBetween(r.tracker, changesStart.Add(5*time.Second), time.Now())
	prog.done("the churn alone: its changes reached every proxy in %.2fs at p99", normal.Seconds())
	ir := &inputRig{faultRig: r, app: app, probes: probes, normal: normal}
	for _, in := range ir.inputs() {
		if sc.FaultOnly != nil && !sc.FaultOnly.MatchString(in.name) {
			continue
		}
		f, problems := ir.run(in)
		for _, pr := range problems {
			ph.Problems = append(ph.Problems, in.name+": "+pr)
		}
		ph.Faults = append(ph.Faults, f)
		prog.done("input: %s; served alike by both pushers after %.1fs, removed after %.1fs; the %d changes made meanwhile reached every proxy in %.2fs at p99 (%.2fs alone); the grpc-go clients followed %d moves in %.2fs at most, %d RPCs failed; the pushers used %.1f CPU-s, RSS at most %.0f MiB",
			in.name, f.Input.Applied, f.Input.Removed, f.During.Changes, f.During.P99, normal.Seconds(), f.Input.Moves, f.Input.FollowMax, f.Input.RPCsFailed, f.Input.CPUSeconds, f.Input.PeakRSSMiB)
		if ctx.Err() != nil {
			break
		}
	}
	if err := stopChurn(); err != nil {
		return ph, err
	}
	for settle := time.Now(); r.tracker.Pending() > 0 && time.Since(settle) < sc.Settle && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond)
	}
	if r.tracker.Pending() > 0 {
		// Where a lost change stopped: what each pusher's probe holds.
		for i, p := range probes {
			var dyn []string
			for name := range p.view().clusters {
				if strings.Contains(name, "."+meshgen.DynamicNamespace+".svc.") {
					dyn = append(dyn, name)
				}
			}
			slices.Sort(dyn)
			ph.Problems = append(ph.Problems, fmt.Sprintf("after the settle, pusher %d's probe holds the dynamic services' clusters %v", i, dyn))
		}
	}
	return finish(ph, fleet, r.tracker, &sampler, r.servers, phaseStart, changesStart, nil), nil
}

// inputRig is the input suite's processes and probes, and the churn's
// convergence p99 alone.
type inputRig struct {
	*faultRig
	app    *echo
	probes []*probe
	normal time.Duration
}

// input is one heavy input: apply writes it (and, for one rewritten
// under churn, rewrites it until it returns), remove removes it; applied
// and gone say whether a probe's view holds it, and holds none of it. It
// is held for hold, and both pushers must serve it alike within
// agreeWithin, and its removal too.
type input struct {
	name          string
	apply, remove func() error
	applied, gone func(view) bool
	hold          time.Duration
	agreeWithin   time.Duration
}

func (ir *inputRig) inputs() []input {
	sc := ir.sc
	return []input{
		ir.envoyFilters(sc.InputFilters),
		ir.services(sc.InputServices),
		ir.routes(sc.InputRoutes, sc.InputRewrites),
	}
}

// run applies one input, holds it, removes it, and reports.
func (ir *inputRig) run(in input) (report.Fault, []string) {
	var problems []string
	f := report.Fault{Name: in.name, Input: &report.Input{NormalP99: ir.normal.Seconds()}}
	failedBefore := ir.app.failed()
	cpuBefore := ir.pushersCPU()
	sctx, stopSampling := context.WithCancel(ir.ctx)
	var sampler procstat.Sampler
	go sampler.Run(sctx, time.Second, ir.servers[0].pid(), ir.servers[1].pid())
	// The grpc-go clients follow an endpoint moved every 5 s meanwhile.
	mctx, stopMoving := context.WithCancel(ir.ctx)
	moved := make(chan []time.Duration, 1)
	go func() {
		var all []time.Duration
		defer func() { moved <- all }()
		for mctx.Err() == nil {
			took, err := ir.app.move(time.Minute)
			if err != nil {
				return
			}
			all = append(all, took...)
			select {
			case <-mctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}()

	from := time.Now()
	if err := in.apply(); err != nil {
		problems = append(problems, "apply: "+err.Error())
	}
	applied, why := ir.agree(in.applied, in.agreeWithin)
	f.Input.Applied = seconds(applied)
	if applied < 0 {
		problems = append(problems, fmt.Sprintf("the pushers did not serve it alike within %s of the write: %s", in.agreeWithin, why))
	}
	time.Sleep(in.hold)
	if err := in.remove(); err != nil {
		problems = append(problems, "remove: "+err.Error())
	}
	removed, why := ir.agree(in.gone, in.agreeWithin)
	f.Input.Removed = seconds(removed)
	if removed < 0 {
		problems = append(problems, fmt.Sprintf("the pushers did not drop it alike within %s of its removal: %s", in.agreeWithin, why))
	}
	to := time.Now()
	f.Lasted = to.Sub(from).Seconds()
	stopMoving()
	follows := <-moved
	stopSampling()

	p99, longest, n := convergedBetween(ir.tracker, from, to)
	f.During = &report.During{Changes: n, P99: p99.Seconds(), Max: longest.Seconds()}
	if n == 0 || p99 > ir.bound() {
		problems = append(problems, fmt.Sprintf("the %d changes made meanwhile reached every proxy in %s at p99 (%s with the churn alone): held back", n, p99.Round(time.Millisecond), ir.normal.Round(time.Millisecond)))
	}
	f.Input.Moves = len(follows) / max(1, len(ir.app.stats))
	for _, d := range follows {
		if d < 0 {
			problems = append(problems, "a grpc-go client did not follow a moved endpoint within a minute")
			f.Input.FollowMax = -1
			break
		}
		f.Input.FollowMax = max(f.Input.FollowMax, d.Seconds())
	}
	f.Input.RPCsFailed = ir.app.failed() - failedBefore
	f.Input.CPUSeconds = (ir.pushersCPU() - cpuBefore).Seconds()
	for _, p := range ir.servers {
		for _, s := range sampler.Samples(p.pid()) {
			f.Input.PeakRSSMiB = max(f.Input.PeakRSSMiB, float64(s.RSS)/(1<<20))
		}
	}
	// Every change made until now reaches every proxy.
	recovered, pending := ir.settleUpTo(lastMade(ir.tracker))
	f.Recovered, f.Pending = recovered.Seconds(), pending
	if pending > 0 {
		problems = append(problems, fmt.Sprintf("%d changes did not reach every proxy within %s", pending, ir.sc.Settle))
	}
	return f, problems
}

func seconds(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return d.Seconds()
}

func (ir *inputRig) pushersCPU() time.Duration {
	var sum time.Duration
	for _, p := range ir.servers {
		if s, err := procstat.Read(p.pid()); err == nil {
			sum += s.CPU
		}
	}
	return sum
}

// agree waits until every probe's view satisfies cond and all views are
// alike, and returns how long that took (-1 and what was seen last when
// it did not within limit).
func (ir *inputRig) agree(cond func(view) bool, limit time.Duration) (time.Duration, string) {
	start := time.Now()
	why := ""
	for time.Since(start) < limit && ir.ctx.Err() == nil {
		var views []view
		why = ""
		for i, p := range ir.probes {
			v := p.view()
			if !cond(v) {
				why += fmt.Sprintf("pusher %d's probe does not hold it yet (%d clusters, %d route configurations); ", i, len(v.clusters), len(v.routes))
			}
			views = append(views, v)
		}
		alike := ""
		for _, v := range views[1:] {
			if d := differ(views[0], v); d != "" {
				alike = d
			}
		}
		if why == "" && alike == "" {
			return time.Since(start), ""
		}
		if why == "" {
			why = "the pushers served different configurations (" + alike + ", first)"
		}
		time.Sleep(250 * time.Millisecond)
	}
	return -1, strings.TrimSuffix(why, "; ")
}

// dir is the YAML directory the ingesters read.
func (ir *inputRig) dir() meshgen.Dir { return meshgen.Dir(ir.meshDir) }

// envoyFilters is n EnvoyFilters in the root namespace, each merging its
// own connection buffer limit and connect timeout into every outbound
// cluster: they contradict one another, and the last in order wins.
func (ir *inputRig) envoyFilters(n int) input {
	const file = "heavy-envoyfilters"
	return input{
		name: fmt.Sprintf("%d EnvoyFilters in the root namespace merging contradictory values into every cluster, removed %s later", n, ir.sc.FaultHold),
		apply: func() error {
			var b bytes.Buffer
			for i := range n {
				fmt.Fprintf(&b, `---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: merge-%d, namespace: istio-system}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {context: SIDECAR_OUTBOUND}
    patch:
      operation: MERGE
      value: {per_connection_buffer_limit_bytes: %d, connect_timeout: %ds}
`, i, 32768+i, 1+i%7)
			}
			return ir.dir().Put(file, b.Bytes())
		},
		remove: func() error { return ir.dir().Delete("", file) },
		applied: func(v view) bool {
			for _, c := range v.clusters {
				if c.PerConnectionBufferLimitBytes != nil && c.PerConnectionBufferLimitBytes.Value >= 32768 {
					return true
				}
			}
			return false
		},
		gone: func(v view) bool {
			for _, c := range v.clusters {
				if c.PerConnectionBufferLimitBytes != nil && c.PerConnectionBufferLimitBytes.Value >= 32768 {
					return false
				}
			}
			return len(v.clusters) > 0
		},
		hold:        ir.sc.FaultHold,
		agreeWithin: 2 * time.Minute,
	}
}

// services is n services in one namespace, which every proxy sees.
func (ir *inputRig) services(n int) input {
	const perFile = 1000
	files := (n + perFile - 1) / perFile
	name := func(f int) string { return fmt.Sprintf("heavy-services-%03d", f) }
	isBulk := func(cluster string) bool { return strings.Contains(cluster, ".bulk.svc.cluster.local") }
	count := func(v view) int {
		c := 0
		for name := range v.clusters {
			if isBulk(name) {
				c++
			}
		}
		return c
	}
	return input{
		name: fmt.Sprintf("%d services in one namespace, which every proxy sees, removed %s later", n, ir.sc.FaultHold),
		apply: func() error {
			for f := range files {
				var b bytes.Buffer
				for i := f * perFile; i < min(n, (f+1)*perFile); i++ {
					fmt.Fprintf(&b, `---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: bulk-%d, namespace: bulk}
spec:
  hosts: [bulk-%d.bulk.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.250.%d.%d}]
`, i, i, i>>8&0xff, i&0xff)
				}
				if err := ir.dir().Put(name(f), b.Bytes()); err != nil {
					return err
				}
			}
			return nil
		},
		remove: func() error {
			for f := range files {
				if err := ir.dir().Delete("", name(f)); err != nil {
					return err
				}
			}
			return nil
		},
		applied:     func(v view) bool { return count(v) == n },
		gone:        func(v view) bool { return len(v.clusters) > 0 && count(v) == 0 },
		hold:        ir.sc.FaultHold,
		agreeWithin: 3 * time.Minute,
	}
}

// routes is a VirtualService of n routes, rewritten every second
// rewrites times (each rewrite renames every route), then removed.
func (ir *inputRig) routes(n, rewrites int) input {
	const file = "heavy-routes"
	gen := 0
	write := func(g int) error {
		var b bytes.Buffer
		fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: wide, namespace: wide}
spec:
  hosts: [wide.wide.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.251.0.1}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: wide, namespace: wide}
spec:
  hosts: [wide.wide.svc.cluster.local]
  http:
`)
		for i := range n {
			fmt.Fprintf(&b, "  - {name: wide-%d-%d, match: [{uri: {prefix: /r%d/}}], route: [{destination: {host: wide.wide.svc.cluster.local}}]}\n", g, i, i)
		}
		return ir.dir().Put(file, b.Bytes())
	}
	has := func(v view, name string) bool {
		for _, rc := range v.routes {
			for _, vh := range rc.VirtualHosts {
				for _, r := range vh.Routes {
					if r.Name == name {
						return true
					}
				}
			}
		}
		return false
	}
	return input{
		name: fmt.Sprintf("a VirtualService of %d routes rewritten every second %d times, then removed", n, rewrites),
		apply: func() error {
			for g := 1; g <= rewrites; g++ {
				start := time.Now()
				if err := write(g); err != nil {
					return err
				}
				gen = g
				time.Sleep(time.Second - time.Since(start))
			}
			return nil
		},
		remove:      func() error { return ir.dir().Delete("", file) },
		applied:     func(v view) bool { return has(v, fmt.Sprintf("wide-%d-%d", gen, n-1)) },
		gone:        func(v view) bool { return len(v.routes) > 0 && !has(v, fmt.Sprintf("wide-%d-0", gen)) },
		agreeWithin: 2 * time.Minute,
	}
}

// bound is how slow the unrelated changes may converge while an input
// applies: the scenario's --bound, or 2 s and three times the churn's
// p99 alone.
func (ir *inputRig) bound() time.Duration {
	if ir.sc.Bound > 0 {
		return ir.sc.Bound
	}
	return max(2*time.Second, 3*ir.normal)
}
