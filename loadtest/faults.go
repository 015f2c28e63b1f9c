package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
)

// faultPhase runs the fault suite on real processes: etcd and NATS each
// in a process of their own, two ingesters taking turns by election, two
// pushers. Under steady churn it kills a pusher with SIGKILL (and starts
// it again), stops NATS, stops etcd (SIGSTOP for sc.FaultHold, then
// SIGCONT), kills the ingester that leads with SIGKILL, and connects to
// each pusher a proxy that never answers and 50 that never read (the
// changes made meanwhile must reach the others as fast as ever); after
// each, it waits until every change made so far has reached every proxy.
// Then values the bus cannot carry as they are (over NATS's payload
// limit, a namespace that is no subject token, bytes that decode as
// nothing) are written into etcd past the ingester, and the change stream
// is deleted, and etcd's NOSPACE alarm refuses every write for a while:
// the stream must not wedge, the ingesters must say etcd is full, and what
// readiness and staleness said meanwhile is reported. NATS's file system
// fills (JetStream shuts itself down; NATS is restarted once space is
// back), and etcd is restored from a snapshot: the pushers must say they
// are behind the store meanwhile, and a proxy must hold every service's
// newest change again after.
// Last, with the churn over, NATS is killed and its data wiped: the
// pushers must follow the store again with no change made, ready
// throughout. A change that never reaches every proxy is lost, and fails
// the run.
func faultPhase(ctx context.Context, sc Scenario, stderr io.Writer) (report.Phase, error) {
	ph := report.Phase{Name: "shardpilot, faults", Target: "shardpilot", Pushers: 2, Proxies: sc.Proxies}
	done := announce(stderr, sc, ph.Name)
	defer done()
	r, stop, err := newFaultRig(ctx, sc)
	defer stop()
	if err != nil {
		return ph, err
	}
	// What proxy 0 holds, for the faults after which it must hold every
	// service's newest change again.
	r.tracker.Follow(0)

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

	// Steady churn for as long as the faults take.
	changesStart, stopChurn := steadyChurn(ctx, sc, r.mesh, r.tracker, fleet)
	defer stopChurn()
	time.Sleep(5 * time.Second)
	r.injectAll(&ph, prog)
	if err := stopChurn(); err != nil {
		return ph, err
	}
	for settle := time.Now(); r.tracker.Pending() > 0 && time.Since(settle) < sc.Settle && ctx.Err() == nil; {
		time.Sleep(100 * time.Millisecond)
	}
	// Last, with no change made: NATS loses its data.
	p, problem := wipedNATS(ctx, sc, r.natsDir, r.natsURL, r.nats, r.servers, r.mesh, r.tracker, prog, &ph)
	if p != nil {
		r.procs, r.nats = append(r.procs, p), p
	}
	if problem != "" {
		ph.Problems = append(ph.Problems, problem)
	}
	ph = finish(ph, fleet, r.tracker, &sampler, r.servers, phaseStart, changesStart, nil)
	stopFleet()
	r.terminate(&ph, prog)
	return ph, nil
}

// runFleet runs a fleet's proxies until the stop it returns is called
// (once or more), which returns once they have gone.
func runFleet(ctx context.Context, fleet *sim.Fleet) (stop func()) {
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fleet.Run(fctx) }()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// steadyChurn makes changes, as the scenario's rates say, until the stop
// it returns is called (once or more): that returns the error that ended
// them, if it was not the stop. A dynamic service is removed only once
// every proxy saw it added.
func steadyChurn(ctx context.Context, sc Scenario, mesh *meshgen.Mesh, tracker *track.Tracker, fleet *sim.Fleet) (began time.Time, stop func() error) {
	churn := sc
	churn.Duration, churn.removeSeen = time.Hour, true
	cctx, cancel := context.WithCancel(ctx)
	churned := make(chan error, 1)
	began = time.Now()
	go func() {
		churned <- makeChanges(cctx, churn, mesh, tracker, fleet, began, &progress{w: io.Discard})
	}()
	var once sync.Once
	var err error
	return began, func() error {
		once.Do(func() {
			cancel()
			if err = <-churned; ctx.Err() != nil || errors.Is(err, context.Canceled) {
				err = nil
			}
		})
		return err
	}
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
