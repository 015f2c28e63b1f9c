package main

import (
	"fmt"
	"syscall"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/report"
)

// faults are the faults injected under churn, in order.
func (r *faultRig) faults() []fault {
	return []fault{
		{name: "a pusher killed (SIGKILL) and started again", inject: r.pusherKilled},
		{name: fmt.Sprintf("NATS stopped for %s (SIGSTOP)", r.sc.FaultHold), inject: r.natsStopped},
		{name: fmt.Sprintf("etcd stopped for %s (SIGSTOP)", r.sc.FaultHold), inject: func() error {
			return etcdStopped(r.ctx, r.sc.FaultHold, r.etcd, r.ingesters, r.servers[1])
		}},
		{name: "the ingester leader killed (SIGKILL)", inject: r.leaderKilled},
		{name: "a proxy that never answers and 100 that never read, beside the others", inject: r.hostagesHeld, during: r.hostagesReport},
		{name: "values the bus cannot carry written into etcd past the ingester (1.2 MB, a namespace with a space, bytes that do not decode)", inject: r.foreignValues},
		{name: "the change stream deleted under churn", inject: r.streamDeleted},
		{name: fmt.Sprintf("etcd's NOSPACE alarm raised for %s under churn (every write refused)", r.sc.FaultHold/3), inject: r.etcdFull},
		{name: fmt.Sprintf("NATS's file system full for %s under churn, then NATS restarted", r.sc.FaultHold), inject: r.natsDiskFull},
		{name: fmt.Sprintf("etcd restored from a snapshot taken %s earlier, under churn", r.sc.FaultHold/3), inject: r.etcdRestored},
	}
}

func (r *faultRig) pusherKilled() error {
	old := r.servers[0]
	old.kill()
	time.Sleep(5 * time.Second)
	p, err := r.startPusher(0, old.ads, old.admin)
	if err != nil {
		return err
	}
	r.servers[0] = p
	return p.waitReady(r.ctx, time.Minute)
}

// natsStopped stops NATS: a pusher that cannot follow the store stays
// ready, serving its last config, and says it is stale.
func (r *faultRig) natsStopped() error {
	_ = r.nats.cmd.Process.Signal(syscall.SIGSTOP)
	fell, stale := false, false
	for until := time.Now().Add(r.sc.FaultHold); time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
		fell = fell || !r.servers[1].ready()
		stale = stale || r.servers[1].stale()
	}
	_ = r.nats.cmd.Process.Signal(syscall.SIGCONT)
	switch {
	case fell:
		return fmt.Errorf("%s went unready while NATS was stopped: it has a config to serve", r.servers[1].name)
	case !stale:
		return fmt.Errorf("%s did not say it was stale while NATS was stopped", r.servers[1].name)
	}
	return r.servers[1].waitReady(r.ctx, time.Minute)
}

// leaderKilled kills the ingester that leads: another takes over, and the
// killed one comes back as a follower.
func (r *faultRig) leaderKilled() error {
	p, id := r.leader()
	if p == nil {
		return fmt.Errorf("no ingester leads the YAML source")
	}
	p.kill()
	time.Sleep(5 * time.Second)
	if _, other := r.leader(); other == id || other == "" {
		return fmt.Errorf("no other ingester took over from %s", id)
	}
	q, err := r.startIngester(id)
	r.ingesters[id] = q
	return err
}

// hostagesHeld connects the bad proxies to both pushers for the hold.
func (r *faultRig) hostagesHeld() error {
	release, err := hostages(r.ctx, []string{r.servers[0].ads, r.servers[1].ads}, 100)
	if err != nil {
		return err
	}
	r.hostagesFrom = time.Now()
	time.Sleep(r.sc.FaultHold)
	r.hostagesTo = time.Now()
	release()
	return nil
}

// hostagesReport says how the changes made beside the bad proxies
// converged: held by them, they would wait for the debounce's maximum
// hold (5s).
func (r *faultRig) hostagesReport(f *report.Fault) string {
	p99, longest, n := convergedBetween(r.tracker, r.hostagesFrom, r.hostagesTo)
	f.During = &report.During{Changes: n, P99: p99.Seconds(), Max: longest.Seconds()}
	if n == 0 || p99 >= 4*time.Second {
		return fmt.Sprintf("the %d changes made beside them reached every other proxy in %s at p99: held back by them", n, p99)
	}
	return ""
}
