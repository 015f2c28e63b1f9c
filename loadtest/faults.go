package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// faultPhase runs the fault suite on real processes: etcd and NATS each
// in a process of their own, two ingesters taking turns by election, two
// pushers. Under steady churn it kills a pusher with SIGKILL (and starts
// it again), stops NATS, stops etcd (SIGSTOP for sc.FaultHold, then
// SIGCONT), kills the ingester that leads with SIGKILL, and connects to
// each pusher a proxy that never answers and 50 that never read (the
// changes made meanwhile must reach the others as fast as ever); after
// each, it waits until every change made so far has reached every proxy.
// Last, with the churn over, NATS is killed and its data wiped: the
// pushers must follow the store again with no change made, ready
// throughout. A change that never reaches every proxy is lost, and fails
// the run.
func faultPhase(ctx context.Context, sc Scenario, stderr io.Writer) (report.Phase, error) {
	ph := report.Phase{Name: "shardpilot, faults", Target: "shardpilot", Pushers: 2, Proxies: sc.Proxies}
	done := announce(stderr, sc, ph.Name)
	defer done()
	work, meshDir, err := workDir()
	if err != nil {
		return ph, err
	}
	defer os.RemoveAll(work)
	mesh, err := meshgen.Write(meshDir, meshgen.Spec{Services: sc.Services, Endpoints: sc.Endpoints, Namespaces: sc.Namespaces})
	if err != nil {
		return ph, err
	}

	var procs []*proc
	defer func() {
		for _, p := range procs {
			if p.cmd.ProcessState == nil {
				_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot stop
			}
			p.stop()
		}
	}()
	etcd, etcdURL, _, err := startStore(ctx, sc.out, "faults-etcd", work, "--only", "etcd")
	if err != nil {
		return ph, err
	}
	procs = append(procs, etcd)
	nats, _, natsURL, err := startStore(ctx, sc.out, "faults-nats", work, "--only", "nats")
	if err != nil {
		return ph, err
	}
	procs = append(procs, nats)

	startIngester := func(id string) (*proc, error) {
		admin, err := freeAddr()
		if err != nil {
			return nil, err
		}
		p, err := start(sc.out, "faults-"+id, filepath.Join(sc.bin, "ingester"), "--etcd-endpoints", etcdURL, "--nats-url", natsURL,
			"--admin-addr", admin, "--leader-id", id, "--leader-ttl", "3s", "--log-level", "info", "--mesh-dir", meshDir)
		if err != nil {
			return nil, err
		}
		p.admin = admin
		procs = append(procs, p)
		return p, nil
	}
	ingesters := map[string]*proc{}
	for _, id := range []string{"ingester-0", "ingester-1"} {
		if ingesters[id], err = startIngester(id); err != nil {
			return ph, err
		}
	}
	servers := make([]*proc, 2)
	startPusher := func(i int, ads, admin string) (*proc, error) {
		p, err := start(sc.out, fmt.Sprintf("faults-pusher-%d-%d", i, time.Now().UnixNano()%1e6), filepath.Join(sc.bin, "pusher"),
			"--etcd-endpoints", etcdURL, "--nats-url", natsURL, "--ads-plaintext", "--ads-addr", ads, "--admin-addr", admin, "--log-level", "info", "--send-timeout", "1m")
		if err != nil {
			return nil, err
		}
		p.ads, p.admin, p.heap = ads, admin, admin
		procs = append(procs, p)
		return p, nil
	}
	for i := range servers {
		ads, err1 := freeAddr()
		admin, err2 := freeAddr()
		if err1 != nil || err2 != nil {
			return ph, fmt.Errorf("faults: %v %v", err1, err2)
		}
		if servers[i], err = startPusher(i, ads, admin); err != nil {
			return ph, err
		}
	}
	for _, p := range servers {
		if err := p.waitReady(ctx, time.Minute); err != nil {
			return ph, err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return ph, err
	}
	defer cli.Close()

	phaseStart := time.Now()
	var sampler procstat.Sampler
	tracker := track.New(sc.Proxies)
	fleet, err := sim.New(sim.Config{Addrs: []string{servers[0].ads, servers[1].ads}, Proxies: sc.Proxies, Delta: sc.Delta, PerConn: sc.PerConn,
		Namespaces: sc.Namespaces, Observer: tracker})
	if err != nil {
		return ph, err
	}
	fctx, stopFleet := context.WithCancel(ctx)
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- fleet.Run(fctx) }()
	defer func() { stopFleet(); <-fleetDone }()
	prog := newProgress(stderr)
	if problem := connect(ctx, sc, fleet, prog); problem != "" {
		ph.Problems = append(ph.Problems, problem)
		return finish(ph, fleet, tracker, &sampler, servers, phaseStart, time.Now(), nil), nil
	}

	// Steady churn for as long as the faults take.
	churn := sc
	churn.Duration, churn.removeSeen = time.Hour, true
	cctx, stopChurn := context.WithCancel(ctx)
	churned := make(chan error, 1)
	changesStart := time.Now()
	go func() {
		churned <- makeChanges(cctx, churn, mesh, tracker, fleet, changesStart, &progress{w: io.Discard})
	}()
	churning := true
	defer func() {
		if churning {
			stopChurn()
			<-churned
		}
	}()

	leader := func() (*proc, string) {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := cli.Get(lctx, store.ElectionPrefix+"source/yaml", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
		if err != nil || len(resp.Kvs) == 0 {
			return nil, ""
		}
		id := string(resp.Kvs[0].Value)
		return ingesters[id], id
	}
	var hostagesFrom, hostagesTo time.Time
	faults := []struct {
		name   string
		inject func() error
		// during, when set, reports how the changes made during the fault
		// converged, and says whether that was too slow.
		during func(*report.Fault) string
	}{
		{"a pusher killed (SIGKILL) and started again", func() error {
			old := servers[0]
			old.kill()
			time.Sleep(5 * time.Second)
			p, err := startPusher(0, old.ads, old.admin)
			if err != nil {
				return err
			}
			servers[0] = p
			return p.waitReady(ctx, time.Minute)
		}, nil},
		{fmt.Sprintf("NATS stopped for %s (SIGSTOP)", sc.FaultHold), func() error {
			// A pusher that cannot follow the store stays ready, serving
			// its last config, and says it is stale.
			_ = nats.cmd.Process.Signal(syscall.SIGSTOP)
			fell, stale := false, false
			for until := time.Now().Add(sc.FaultHold); time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
				fell = fell || !servers[1].ready()
				stale = stale || servers[1].stale()
			}
			_ = nats.cmd.Process.Signal(syscall.SIGCONT)
			switch {
			case fell:
				return fmt.Errorf("%s went unready while NATS was stopped: it has a config to serve", servers[1].name)
			case !stale:
				return fmt.Errorf("%s did not say it was stale while NATS was stopped", servers[1].name)
			}
			return servers[1].waitReady(ctx, time.Minute)
		}, nil},
		{fmt.Sprintf("etcd stopped for %s (SIGSTOP)", sc.FaultHold), func() error {
			return etcdStopped(ctx, sc.FaultHold, etcd, ingesters, servers[1])
		}, nil},
		{"the ingester leader killed (SIGKILL)", func() error {
			p, id := leader()
			if p == nil {
				return fmt.Errorf("no ingester leads the YAML source")
			}
			p.kill()
			time.Sleep(5 * time.Second)
			if _, other := leader(); other == id || other == "" {
				return fmt.Errorf("no other ingester took over from %s", id)
			}
			// The killed one comes back as a follower.
			q, err := startIngester(id)
			ingesters[id] = q
			return err
		}, nil},
		{"a proxy that never answers and 100 that never read, beside the others", func() error {
			release, err := hostages(ctx, []string{servers[0].ads, servers[1].ads}, 100)
			if err != nil {
				return err
			}
			hostagesFrom = time.Now()
			time.Sleep(sc.FaultHold)
			hostagesTo = time.Now()
			release()
			return nil
		}, func(f *report.Fault) string {
			p99, longest, n := convergedBetween(tracker, hostagesFrom, hostagesTo)
			f.During = &report.During{Changes: n, P99: p99.Seconds(), Max: longest.Seconds()}
			// Held, they would wait for the debounce's maximum hold (5s).
			if n == 0 || p99 >= 4*time.Second {
				return fmt.Sprintf("the %d changes made beside them reached every other proxy in %s at p99: held back by them", n, p99)
			}
			return ""
		}},
	}
	time.Sleep(5 * time.Second)
	for _, f := range faults {
		faulted := time.Now()
		if err := f.inject(); err != nil {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s: %v", f.name, err))
			break
		}
		// Every change made until the fault ended must reach every proxy.
		upTo := lastMade(tracker)
		recovered := time.Now()
		ok := false
		for time.Since(recovered) < sc.Settle && ctx.Err() == nil {
			if pending := pendingUpTo(tracker, upTo); pending == 0 {
				ok = true
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		fr := report.Fault{Name: f.name, Lasted: recovered.Sub(faulted).Seconds(), Recovered: time.Since(recovered).Seconds(), Pending: pendingUpTo(tracker, upTo)}
		if f.during != nil {
			if problem := f.during(&fr); problem != "" {
				ph.Problems = append(ph.Problems, f.name+": "+problem)
			}
		}
		ph.Faults = append(ph.Faults, fr)
		prog.done("fault: %s; changes made until its end reached every proxy %.2fs later (%d pending)", f.name, fr.Recovered, fr.Pending)
		if d := fr.During; d != nil {
			prog.done("  the %d changes made during it reached every other proxy in %.2fs at p99, %.2fs at most", d.Changes, d.P99, d.Max)
		}
		if !ok {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s: %d changes made before it ended did not reach every proxy within %s", f.name, fr.Pending, sc.Settle))
		}
	}
	stopChurn()
	churning = false
	if err := <-churned; err != nil && ctx.Err() == nil && err != context.Canceled {
		return ph, err
	}
	for settle := time.Now(); tracker.Pending() > 0 && time.Since(settle) < sc.Settle && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond)
	}
	// Last, with no change made: NATS loses its data.
	if p, problem := wipedNATS(ctx, sc, work, natsURL, nats, servers, mesh, tracker, prog, &ph); p != nil {
		procs, nats = append(procs, p), p
	} else if problem != "" {
		ph.Problems = append(ph.Problems, problem)
	}
	ph = finish(ph, fleet, tracker, &sampler, servers, phaseStart, changesStart, nil)

	// Last, SIGTERM with etcd and NATS both stopped: every process still
	// ends within its drain timeout.
	_ = etcd.cmd.Process.Signal(syscall.SIGSTOP)
	_ = nats.cmd.Process.Signal(syscall.SIGSTOP)
	stopFleet()
	for _, p := range procs {
		if p == etcd || p == nats || p.cmd.ProcessState != nil {
			continue
		}
		start := time.Now()
		if !p.terminate(20 * time.Second) {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s did not end within 20s of SIGTERM with etcd and NATS stopped", p.name))
			continue
		}
		prog.done("SIGTERM with etcd and NATS stopped: %s ended after %s", p.name, time.Since(start).Round(time.Millisecond))
	}
	return ph, nil
}

// lastMade returns the number of the newest change made.
func lastMade(t *track.Tracker) int {
	n := -1
	for _, r := range t.Results() {
		n = max(n, r.Change.N)
	}
	return n
}

// pendingUpTo counts the changes up to n not yet at every proxy.
func pendingUpTo(t *track.Tracker, n int) int {
	pending := 0
	for _, r := range t.Results() {
		if r.Change.N <= n && !r.Done {
			pending++
		}
	}
	return pending
}

// etcdStopped stops etcd for hold: the ingesters, which cannot write, say
// so (unready), and come back after; the pusher serves its last config
// and stays ready.
func etcdStopped(ctx context.Context, hold time.Duration, etcd *proc, ingesters map[string]*proc, pusher *proc) error {
	_ = etcd.cmd.Process.Signal(syscall.SIGSTOP)
	unready, fell := map[string]bool{}, false
	for until := time.Now().Add(hold); time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
		for id, p := range ingesters {
			unready[id] = unready[id] || !p.ready()
		}
		fell = fell || !pusher.ready()
	}
	_ = etcd.cmd.Process.Signal(syscall.SIGCONT)
	for id := range ingesters {
		if !unready[id] {
			return fmt.Errorf("ingester %s stayed ready while etcd was stopped: it could not write", id)
		}
	}
	if fell {
		return fmt.Errorf("%s went unready while etcd was stopped: it has a config to serve", pusher.name)
	}
	for _, p := range ingesters {
		if err := p.waitReady(ctx, time.Minute); err != nil {
			return err
		}
	}
	return nil
}
