package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/pki"
	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
)

// phase runs the scenario against one control plane: the mesh written,
// the control plane started, the proxies connected, then the reconnect
// storm or the changes (and the shard moves).
func phase(ctx context.Context, sc Scenario, t target, stderr io.Writer) (report.Phase, error) {
	ph := report.Phase{Name: t.name(), Target: "shardpilot", Pushers: t.pushers, Proxies: sc.Proxies}
	if t.baseline || t.istiod {
		ph.Target, ph.Pushers = t.name(), 0
	}
	done := announce(stderr, sc, ph.Name)
	defer done()
	work, meshDir, err := workDir()
	if err != nil {
		return ph, err
	}
	defer os.RemoveAll(work)
	m, err := writeMesh(sc, t, work, meshDir)
	if m.kc != nil {
		defer m.kc.Stop()
	}
	if err != nil {
		return ph, err
	}
	cp := &controlPlane{sc: sc, t: t, work: work, logName: strings.NewReplacer(", ", "-", " ", "-").Replace(ph.Name)}
	defer cp.stop()
	if err := cp.start(ctx, m); err != nil {
		return ph, err
	}
	return cp.run(ctx, ph, m.mesh, newProgress(stderr))
}

// setup is a phase's mesh: written to a directory, or through a
// kube-apiserver.
type setup struct {
	mesh       *meshgen.Mesh
	meshDir    string
	kc         *kubetest.Cluster // nil: the mesh is a directory
	kubeconfig string
	// source is the ingester's flags that name where the mesh is.
	source []string
}

// writeMesh writes the scenario's mesh where the phase's control plane
// reads it (the Kubernetes API server is stopped by the caller, even on an
// error).
func writeMesh(sc Scenario, t target, work, meshDir string) (setup, error) {
	spec := meshgen.Spec{Services: sc.Services, Endpoints: sc.Endpoints, Namespaces: sc.Namespaces, Sidecars: len(sc.Shards) > 0}
	m := setup{meshDir: meshDir, source: []string{"--mesh-dir", meshDir}}
	var err error
	if sc.Source == "kube" && !t.baseline || t.istiod {
		if m.kc, m.kubeconfig, err = startKube(work, spec); err != nil {
			return m, err
		}
		m.source = []string{"--kubeconfig", "loadtest=" + m.kubeconfig}
		m.mesh, err = meshgen.WriteTo(kubeSink{m.kc.Dynamic}, spec)
		return m, err
	}
	m.mesh, err = meshgen.Write(meshDir, spec)
	return m, err
}

// controlPlane is the processes of a phase's control plane.
type controlPlane struct {
	sc            Scenario
	t             target
	work, logName string

	servers         []*proc // those that serve proxies
	ingester, store *proc
	pl              *placement // the shards' namespaces (sharded)
	// serving are the pushers' certificate and key, roots what the
	// proxies trust (TLS).
	serving []string
	roots   *x509.CertPool
	// etcdURL and natsURL are the store's, which the pushers follow.
	etcdURL, natsURL string
}

func (cp *controlPlane) stop() {
	for _, p := range cp.servers {
		p.stop()
	}
	if cp.ingester != nil {
		cp.ingester.stop()
	}
	if cp.store != nil {
		cp.store.stop()
	}
}

// start starts the target's control plane on the mesh and waits until
// what serves proxies is ready.
func (cp *controlPlane) start(ctx context.Context, m setup) error {
	var err error
	switch {
	case cp.t.baseline:
		err = cp.startBaseline(m.meshDir)
	case cp.t.istiod:
		var p *proc
		if p, err = startIstiod(ctx, cp.sc, cp.logName, cp.sc.Istiod, cp.work, m.kc, m.kubeconfig); err == nil {
			cp.servers = append(cp.servers, p)
		}
	default:
		err = cp.startShardpilot(ctx, m.source)
	}
	if err != nil {
		return err
	}
	for _, p := range cp.servers {
		if err := p.waitReady(ctx, time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// startBaseline runs the go-control-plane snapshot cache serving the mesh
// directory (this program's baseline command).
func (cp *controlPlane) startBaseline(meshDir string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	addr, err1 := freeAddr()
	admin, err2 := freeAddr()
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	p, err := start(cp.sc.out, cp.logName, self, "baseline", "--mesh-dir", meshDir, "--ads-addr", addr, "--admin-addr", admin)
	if err != nil {
		return err
	}
	p.ads, p.heap = addr, admin
	cp.servers = append(cp.servers, p)
	return nil
}

// startShardpilot runs etcd and NATS (in a process of their own, as
// beside a real control plane: in this one, the proxies' CPU would slow
// them), the ingester reading source, and the target's pushers.
func (cp *controlPlane) startShardpilot(ctx context.Context, source []string) error {
	var err error
	cp.store, cp.etcdURL, cp.natsURL, err = startStore(ctx, cp.sc.out, cp.logName+"-store", cp.work)
	if err != nil {
		return err
	}
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	cp.ingester, err = start(cp.sc.out, cp.logName+"-ingester", filepath.Join(cp.sc.bin, "ingester"), append([]string{"--etcd-endpoints", cp.etcdURL,
		"--nats-url", cp.natsURL, "--admin-addr", admin, "--leader-id", "", "--log-level", "warn"}, source...)...)
	if err != nil {
		return err
	}
	cp.ingester.admin, cp.ingester.heap = admin, admin
	if err := cp.ingester.waitReady(ctx, time.Minute); err != nil {
		return err
	}
	if cp.t.sharded {
		if cp.pl, err = newPlacement(cp.work, cp.t.pushers, cp.sc.Namespaces); err != nil {
			return err
		}
	}
	if cp.sc.TLS {
		if err := cp.issue(); err != nil {
			return err
		}
	}
	running := cp.t.pushers
	if cp.t.alone {
		running = 1
	}
	for i := range running {
		p, err := cp.startPusher(i)
		if err != nil {
			return err
		}
		cp.servers = append(cp.servers, p)
	}
	return nil
}

// issue makes a CA, the pushers' serving certificate and the roots the
// proxies trust.
func (cp *controlPlane) issue() (err error) {
	_, cp.serving, cp.roots, err = servingCA(cp.work, "loadtest")
	return err
}

// servingCA makes a CA in dir, a pusher's serving certificate and key
// (serving) and the roots a proxy trusts.
func servingCA(dir, name string) (ca *pki.CA, serving []string, roots *x509.CertPool, err error) {
	if ca, err = pki.NewCA(dir, name, 24*time.Hour); err != nil {
		return nil, nil, nil, err
	}
	cert, key, err := ca.Issue("pusher")
	if err != nil {
		return nil, nil, nil, err
	}
	pem, err := os.ReadFile(ca.CertFile)
	if err != nil {
		return nil, nil, nil, err
	}
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return ca, []string{cert, key}, roots, nil
}

// startPusher starts pusher i (shard i when sharded); the caller waits
// for it to be ready and stops it.
func (cp *controlPlane) startPusher(i int) (*proc, error) {
	ads, err1 := freeAddr()
	admin, err2 := freeAddr()
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	// The simulated proxies share the machine with the control plane and
	// read slower than Envoys would: a longer send timeout keeps the
	// harness from cutting its own streams. They share its address too:
	// connections per source are not bounded.
	args := []string{"--etcd-endpoints", cp.etcdURL,
		"--nats-url", cp.natsURL, "--ads-addr", ads, "--admin-addr", admin, "--log-level", "warn", "--send-timeout", "1m",
		"--max-connections-per-source", "-1"}
	if cp.serving != nil {
		args = append(args, "--ads-cert-file", cp.serving[0], "--ads-key-file", cp.serving[1])
	} else {
		args = append(args, "--ads-plaintext")
	}
	args = append(args, cp.sc.PusherFlags...)
	if cp.pl != nil {
		// Shard i serves the namespaces its file lists, which reshard
		// changes; each proxy dials its namespace's shard.
		args = append(args, "--namespaces-file", cp.pl.file(i))
		cp.pl.setAddr(i, ads)
	}
	var env []string
	if cp.sc.PusherProcs > 0 {
		env = []string{fmt.Sprint("GOMAXPROCS=", cp.sc.PusherProcs)}
	}
	p, err := startWith(env, cp.sc.out, fmt.Sprintf("%s-pusher-%d", cp.logName, i), filepath.Join(cp.sc.bin, "pusher"), args...)
	if err != nil {
		return nil, err
	}
	p.ads, p.admin, p.heap = ads, admin, admin
	return p, nil
}

// run measures the control plane started: the proxies connect, then the
// storm or the changes run.
func (cp *controlPlane) run(ctx context.Context, ph report.Phase, mesh *meshgen.Mesh, prog *progress) (report.Phase, error) {
	phaseStart := time.Now()
	loaded := usage(cp.servers)
	ph.RSSLoaded = mib(loaded.RSS)
	memLoaded := memoryOf(cp.servers)
	ph.HeapLoaded = mib(memLoaded.live)

	var sampler procstat.Sampler
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	pids := make([]int, len(cp.servers))
	for i, p := range cp.servers {
		pids[i] = p.pid()
	}
	go func() { sampler.Run(sctx, 500*time.Millisecond, pids...); close(sampled) }()
	defer func() { stopSampling(); <-sampled }()

	tracker, fcfg := cp.proxies(mesh)
	fleet, err := sim.New(fcfg)
	if err != nil {
		return ph, err
	}
	ph.Proxies = fleet.Size()
	fctx, stopFleet := context.WithCancel(ctx)
	fleetDone := make(chan error, 1)
	go func() { fleetDone <- fleet.Run(fctx) }()
	defer func() { stopFleet(); <-fleetDone }()

	if problem := connect(ctx, cp.sc, fleet, prog); problem != "" {
		ph.Problems = append(ph.Problems, problem)
		return finish(ph, fleet, tracker, &sampler, cp.servers, phaseStart, time.Now(), nil), nil
	}
	// Let the responses of the connection burst drain from the send
	// buffers before the heap is read.
	time.Sleep(2 * time.Second)
	cp.connected(&ph, loaded, memLoaded)

	if cp.t.storm {
		ph.Storm = storm(ctx, cp.sc, cp.servers, mesh, fleet, tracker, prog)
		if !ph.Storm.OK {
			ph.Problems = append(ph.Problems, "the reconnect storm did not converge")
		}
		return finish(ph, fleet, tracker, &sampler, cp.servers, phaseStart, time.Now(), nil), nil
	}
	ch := changing{cp: cp, mesh: mesh, tracker: tracker, fleet: fleet, fcfg: fcfg, sampler: &sampler, phaseStart: phaseStart, prog: prog}
	if ph, err = ch.run(ctx, ph); err != nil || !cp.t.reshard {
		return ph, err
	}
	return cp.reshard(ctx, ph, mesh, fleet, tracker, prog)
}

// proxies returns the fleet's configuration and the tracker of which
// proxies each change reaches.
func (cp *controlPlane) proxies(mesh *meshgen.Mesh) (*track.Tracker, sim.Config) {
	sc, t := cp.sc, cp.t
	tracker := track.New(sc.Proxies)
	tracker.Expect(func(c meshgen.Change) int { return mesh.Audience(c, sc.Proxies) })
	if t.alone {
		// Shard 0's proxies alone: those whose index is 0 modulo the
		// shards are of its namespaces.
		tracker.Expect(func(c meshgen.Change) int {
			n := 0
			for i := 0; i < sc.Proxies; i += t.pushers {
				if mesh.Sees(c, i) {
					n++
				}
			}
			return n
		})
	}
	addrs := make([]string, len(cp.servers))
	for i, p := range cp.servers {
		addrs[i] = p.ads
	}
	fcfg := sim.Config{Addrs: addrs, Proxies: sc.Proxies, Delta: sc.Delta, NACKRate: sc.NACKRate, PerConn: sc.PerConn,
		Namespaces: sc.Namespaces, Observer: tracker, Sticky: t.storm}
	if cp.pl != nil {
		fcfg.Resolve = cp.pl.addr
	}
	if cp.roots != nil {
		fcfg.TLS = &tls.Config{RootCAs: cp.roots, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	}
	if t.alone {
		fcfg.Shard, fcfg.Shards = 0, t.pushers
	}
	return tracker, fcfg
}

// connected records the memory the connected proxies cost.
func (cp *controlPlane) connected(ph *report.Phase, loaded procstat.Sample, memLoaded memory) {
	connected := usage(cp.servers)
	ph.RSSConnected = mib(connected.RSS)
	memConnected := memoryOf(cp.servers)
	ph.HeapConnected = mib(memConnected.live)
	ph.MemoryPerProxy = float64(memConnected.live-memLoaded.live) / 1024 / float64(ph.Proxies)
	if ph.Target == "shardpilot" {
		for _, p := range cp.servers {
			ph.HeapPerPusher = max(ph.HeapPerPusher, mib(memoryOf([]*proc{p}).live))
		}
	}
	per := func(a, b int64) float64 { return float64(b-a) / 1024 / float64(ph.Proxies) }
	ph.PerProxy = &report.Growth{RSS: per(loaded.RSS, connected.RSS), Live: ph.MemoryPerProxy,
		InUse: per(memLoaded.inUse, memConnected.inUse), Idle: per(memLoaded.idle, memConnected.idle),
		Stacks: per(memLoaded.stacks, memConnected.stacks), GCGoal: per(memLoaded.goal, memConnected.goal),
		Goroutines: float64(memConnected.goroutines-memLoaded.goroutines) / float64(ph.Proxies)}
}

// reshard adds a shard and removes it (see reshard.go), the pushers it
// starts stopped with the others.
func (cp *controlPlane) reshard(ctx context.Context, ph report.Phase, mesh *meshgen.Mesh, fleet *sim.Fleet, tracker *track.Tracker, prog *progress) (report.Phase, error) {
	start := func(i int) (*proc, error) {
		p, err := cp.startPusher(i)
		if err != nil {
			return nil, err
		}
		cp.servers = append(cp.servers, p)
		return p, p.waitReady(ctx, time.Minute)
	}
	moves, err := reshard(ctx, cp.sc, cp.pl, start, mesh, fleet, tracker, prog)
	if err != nil {
		return ph, err
	}
	ph.Moves = moves
	for _, m := range moves {
		if m.Problem != "" {
			ph.Problems = append(ph.Problems, m.Name+": "+m.Problem)
		}
		if m.Others > 0 {
			ph.Problems = append(ph.Problems, fmt.Sprintf("%s: %d proxies of namespaces that did not move reconnected", m.Name, m.Others))
		}
	}
	return ph, nil
}
