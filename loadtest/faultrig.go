package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// faultRig is the fault suite's processes, each in a process of its own:
// etcd, NATS, two ingesters taking turns by election, two pushers.
type faultRig struct {
	ctx context.Context
	// said is what the pushers said during the last fault, for those
	// that watch it (see watchSignals).
	said             string
	sc               Scenario
	work, meshDir    string
	etcdURL, natsURL string
	procs            []*proc // every process started, to stop
	etcd, nats       *proc
	// natsDir is where NATS's store process keeps its data: a file system
	// of its own (natsFSErr says why not), which a fault fills.
	natsDir                  string
	natsFSErr                error
	unmountNATS              func()
	ingesters                map[string]*proc
	servers                  []*proc
	cli                      *clientv3.Client
	tracker                  *track.Tracker
	mesh                     *meshgen.Mesh
	hostagesFrom, hostagesTo time.Time
}

// fault is one fault the suite injects under churn.
type fault struct {
	name   string
	inject func() error
	// during, when set, reports how the changes made during the fault
	// converged, and says whether that was too slow.
	during func(*report.Fault) string
}

// newFaultRig writes the scenario's mesh into a new work directory and
// starts the fault suite's processes on it. stop stops them and removes
// the directory, after an error too.
func newFaultRig(ctx context.Context, sc Scenario) (r *faultRig, stop func(), err error) {
	work, meshDir, err := workDir()
	if err != nil {
		return nil, func() {}, err
	}
	r = &faultRig{ctx: ctx, sc: sc, work: work, meshDir: meshDir, ingesters: map[string]*proc{}, servers: make([]*proc, 2), tracker: track.New(sc.Proxies)}
	stop = func() {
		if r.cli != nil {
			r.cli.Close()
		}
		r.stopAll()
		os.RemoveAll(work)
	}
	if r.mesh, err = meshgen.Write(meshDir, meshgen.Spec{Services: sc.Services, Endpoints: sc.Endpoints, Namespaces: sc.Namespaces}); err != nil {
		return r, stop, err
	}
	return r, stop, r.start()
}

// newFleet makes the simulated proxies, spread over both pushers and
// observed by the rig's tracker.
func (r *faultRig) newFleet() (*sim.Fleet, error) {
	return sim.New(sim.Config{Addrs: []string{r.servers[0].ads, r.servers[1].ads}, Proxies: r.sc.Proxies, Delta: r.sc.Delta, PerConn: r.sc.PerConn,
		Namespaces: r.sc.Namespaces, Observer: r.tracker})
}

// settleUpTo waits, for the scenario's settle at most, until every change
// up to n has reached every proxy, and returns how long it waited and how
// many had not.
func (r *faultRig) settleUpTo(n int) (time.Duration, int) {
	start := time.Now()
	for pendingUpTo(r.tracker, n) > 0 && time.Since(start) < r.sc.Settle && r.ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start), pendingUpTo(r.tracker, n)
}

// start starts the processes and waits until the pushers are ready.
func (r *faultRig) start() error {
	var err error
	if r.etcd, r.etcdURL, _, err = startStore(r.ctx, r.sc.out, "faults-etcd", r.work, "--only", "etcd"); err != nil {
		return err
	}
	r.procs = append(r.procs, r.etcd)
	r.natsDir = filepath.Join(r.work, "natsfs")
	if r.unmountNATS, r.natsFSErr = mountNATSFS(r.natsDir); r.natsFSErr != nil {
		r.natsFSErr = fmt.Errorf("%w: %w", errNotRun, r.natsFSErr)
	}
	if r.nats, _, r.natsURL, err = startStore(r.ctx, r.sc.out, "faults-nats", r.natsDir, "--only", "nats"); err != nil {
		return err
	}
	r.procs = append(r.procs, r.nats)
	for _, id := range []string{"ingester-0", "ingester-1"} {
		if r.ingesters[id], err = r.startIngester(id); err != nil {
			return err
		}
	}
	for i := range r.servers {
		ads, err1 := freeAddr()
		admin, err2 := freeAddr()
		if err1 != nil || err2 != nil {
			return fmt.Errorf("faults: %v %v", err1, err2)
		}
		if r.servers[i], err = r.startPusher(i, ads, admin); err != nil {
			return err
		}
	}
	for _, p := range r.servers {
		if err := p.waitReady(r.ctx, time.Minute); err != nil {
			return err
		}
	}
	r.cli, err = clientv3.New(clientv3.Config{Endpoints: []string{r.etcdURL}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	return err
}

func (r *faultRig) startIngester(id string) (*proc, error) {
	admin, err := freeAddr()
	if err != nil {
		return nil, err
	}
	p, err := start(r.sc.out, "faults-"+id, filepath.Join(r.sc.bin, "ingester"), "--etcd-endpoints", r.etcdURL, "--nats-url", r.natsURL,
		"--admin-addr", admin, "--leader-id", id, "--leader-ttl", "3s", "--log-level", "info", "--mesh-dir", r.meshDir)
	if err != nil {
		return nil, err
	}
	p.admin = admin
	r.procs = append(r.procs, p)
	return p, nil
}

func (r *faultRig) startPusher(i int, ads, admin string) (*proc, error) {
	args := append([]string{"--etcd-endpoints", r.etcdURL, "--nats-url", r.natsURL, "--ads-plaintext", "--ads-addr", ads, "--admin-addr", admin,
		"--log-level", "info", "--send-timeout", "1m", "--max-connections-per-source", "-1"}, r.sc.PusherFlags...)
	p, err := start(r.sc.out, fmt.Sprintf("faults-pusher-%d-%d", i, time.Now().UnixNano()%1e6), filepath.Join(r.sc.bin, "pusher"), args...)
	if err != nil {
		return nil, err
	}
	p.ads, p.admin, p.heap = ads, admin, admin
	r.procs = append(r.procs, p)
	return p, nil
}

// leader returns the ingester that leads the YAML source, and its id.
func (r *faultRig) leader() (*proc, string) {
	lctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	defer cancel()
	resp, err := r.cli.Get(lctx, store.ElectionPrefix+"source/yaml", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) == 0 {
		return nil, ""
	}
	id := string(resp.Kvs[0].Value)
	return r.ingesters[id], id
}

// injectAll injects each fault in turn; after each, every change made
// until it ended must reach every proxy.
func (r *faultRig) injectAll(ph *report.Phase, prog *progress) {
	for _, f := range r.faults() {
		if r.sc.FaultOnly != nil && !r.sc.FaultOnly.MatchString(f.name) {
			continue
		}
		faulted := time.Now()
		if err := f.inject(); errors.Is(err, errNotRun) {
			ph.Faults = append(ph.Faults, report.Fault{Name: f.name, Said: err.Error()})
			prog.done("fault: %s: %v", f.name, err)
			continue
		} else if err != nil {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s: %v", f.name, err))
			return
		}
		ended := time.Now()
		recovered, pending := r.settleUpTo(lastMade(r.tracker))
		fr := report.Fault{Name: f.name, Lasted: ended.Sub(faulted).Seconds(), Recovered: recovered.Seconds(), Pending: pending, Said: r.said}
		r.said = ""
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
		if pending > 0 {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s: %d changes made before it ended did not reach every proxy within %s", f.name, fr.Pending, r.sc.Settle))
		}
	}
}

// terminate sends SIGTERM to every process with etcd and NATS both
// stopped: each must still end within its drain timeout.
func (r *faultRig) terminate(ph *report.Phase, prog *progress) {
	_ = r.etcd.cmd.Process.Signal(syscall.SIGSTOP)
	_ = r.nats.cmd.Process.Signal(syscall.SIGSTOP)
	for _, p := range r.procs {
		if p == r.etcd || p == r.nats || p.cmd.ProcessState != nil {
			continue
		}
		start := time.Now()
		if !p.terminate(20 * time.Second) {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s did not end within 20s of SIGTERM with etcd and NATS stopped", p.name))
			continue
		}
		prog.done("SIGTERM with etcd and NATS stopped: %s ended after %s", p.name, time.Since(start).Round(time.Millisecond))
	}
}

// stopAll stops every process left, and unmounts NATS's file system.
func (r *faultRig) stopAll() {
	for _, p := range r.procs {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Signal(syscall.SIGCONT) // a stopped process cannot stop
		}
		p.stop()
	}
	if r.unmountNATS != nil {
		r.unmountNATS()
	}
}

// errNotRun marks a fault this machine cannot inject: reported as not
// run, with the reason, and the suite goes on.
var errNotRun = errors.New("not run")
