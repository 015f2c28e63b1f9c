package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/internal/h2flood"
	"github.com/shardpilot/shardpilot/internal/pki"
	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/procstat"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// floodPhase runs the floods a client of the ADS port may send against a
// pusher set up as docs/security.md describes (TLS, client certificates
// of SPIFFE identities, service account tokens reviewed by a real
// kube-apiserver) and held by the kernel to a memory limit (the chart's
// default): token reviews asked with forged tokens, names made up by one
// identity's streams, CSDS asked at once by many, and unfinished messages
// without any credential. Under steady churn, for each it reports the
// pusher's largest RSS, whether the kernel killed it, how the changes
// made meanwhile reached the honest proxies (authenticated by their
// certificates), and how long a proxy connecting meanwhile with a
// service account token took to be served. Each flood meets a pusher
// started for it.
func floodPhase(ctx context.Context, sc Scenario, stderr io.Writer) (report.Phase, error) {
	ph := report.Phase{Name: "shardpilot, floods", Target: "shardpilot", Pushers: 1, Proxies: sc.Proxies}
	done := announce(stderr, sc, ph.Name)
	defer done()
	work, meshDir, err := workDir()
	if err != nil {
		return ph, err
	}
	defer os.RemoveAll(work)
	// One namespace: the honest proxies share an identity's namespace
	// with the attacker, who may then ask CSDS for them.
	spec := meshgen.Spec{Services: sc.Services, Endpoints: sc.Endpoints, Namespaces: 1}
	mesh, err := meshgen.Write(meshDir, spec)
	if err != nil {
		return ph, err
	}
	r := &floodRig{ctx: ctx, sc: sc, work: work, tracker: track.New(sc.Proxies)}
	defer r.stopAll()
	if err := r.start(meshDir, spec); err != nil {
		return ph, err
	}

	fleet, err := sim.New(sim.Config{Addrs: []string{r.pusher.ads}, Proxies: sc.Proxies, Delta: sc.Delta, Namespaces: 1, Observer: r.tracker,
		TLS: r.clientTLS(r.honest)})
	if err != nil {
		return ph, err
	}
	stopFleet := runFleet(ctx, fleet)
	defer stopFleet()
	prog := newProgress(stderr)
	phaseStart := time.Now()
	var sampler procstat.Sampler
	if problem := connect(ctx, sc, fleet, prog); problem != "" {
		ph.Problems = append(ph.Problems, problem)
		return finish(ph, fleet, r.tracker, &sampler, []*proc{r.pusher}, phaseStart, time.Now(), nil), nil
	}

	changesStart, stopChurn := steadyChurn(ctx, sc, mesh, r.tracker, fleet)
	defer stopChurn()
	time.Sleep(5 * time.Second)
	for i, f := range r.floods(sc.FloodsOnly) {
		if i > 0 {
			// Each flood meets a pusher of its own: the runtime keeps
			// memory a flood before made it take.
			r.pusher.stop()
			for wait := time.Now(); fleet.Full() == fleet.Size() && time.Since(wait) < 10*time.Second; {
				time.Sleep(10 * time.Millisecond) // until the proxies see their streams end
			}
			if err := r.startPusher(); err != nil {
				return ph, err
			}
			if problem := connect(ctx, sc, fleet, prog); problem != "" {
				ph.Problems = append(ph.Problems, problem)
				break
			}
		}
		fr, problem := r.flood(f)
		if problem != "" {
			ph.Problems = append(ph.Problems, f.name+": "+problem)
		}
		ph.Faults = append(ph.Faults, fr)
		fl := fr.Flood
		prog.done("flood: %s; pusher RSS at most %.0f MiB of %.0f (live heap at its end %.0f MiB), OOM-killed %v; changes made meanwhile reached every proxy in %.2fs at p99, a token proxy was served after %.2fs",
			f.name, fl.PeakRSSMiB, fl.LimitMiB, fl.LiveHeapMiB, fl.OOMKilled, fr.During.P99, fl.NewProxy)
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
	return finish(ph, fleet, r.tracker, &sampler, []*proc{r.pusher}, phaseStart, changesStart, nil), nil
}

// floodRig is the flood phase's processes and credentials.
type floodRig struct {
	ctx              context.Context
	sc               Scenario
	work             string
	tracker          *track.Tracker
	etcdURL, natsURL string
	procs            []*proc
	pusher           *proc
	pusherArgs       []string
	ads, admin       string
	cg               *memcg
	limit            int64
	kube             kubernetes.Interface
	roots            *x509.CertPool
	serving          []string
	honest, attacker tls.Certificate
	vm               tls.Certificate // a workload of namespace vm-quiet, registering
	stopKube         func()
	dyn              dynamic.Interface
	registered       int // the quiet workload's registrations so far
}

// flood is one flood: start starts it and returns what stops it and what
// it sent.
type flood struct {
	name  string
	start func() (stop func() string, err error)
}

func (r *floodRig) start(meshDir string, spec meshgen.Spec) error {
	kubeconfig, err := r.startKube(spec)
	if err != nil {
		return err
	}
	ca, cert, key, err := r.issue()
	if err != nil {
		return err
	}
	sealFile, err := r.sealKey()
	if err != nil {
		return err
	}
	if r.limit, err = cli.ParseSize(r.sc.FloodMemoryLimit); err != nil {
		return fmt.Errorf("--flood-memory-limit: %w", err)
	}
	if err := r.startIngest(meshDir, kubeconfig); err != nil {
		return err
	}
	var err1, err2 error
	r.ads, err1 = freeAddr()
	r.admin, err2 = freeAddr()
	if err1 != nil || err2 != nil {
		return fmt.Errorf("floods: %v %v", err1, err2)
	}
	// As docs/security.md sets a pusher up, at the chart's limits: the
	// pusher's own defaults, and the chart's memory limit.
	r.pusherArgs = []string{"--etcd-endpoints", r.etcdURL, "--nats-url", r.natsURL, "--ads-addr", r.ads, "--admin-addr", r.admin, "--log-level", "info",
		"--ads-cert-file", cert, "--ads-key-file", key, "--ads-client-ca-file", ca.CertFile, "--ca-seal-key-file", sealFile,
		"--ads-tokens", "--kubeconfig", kubeconfig, "--trust-domain", "cluster.local",
		"--memory-limit", r.sc.FloodMemoryLimit, "--send-timeout", "1m"}
	if r.cg, err = newMemcg(fmt.Sprintf("shardpilot-floods-%d", os.Getpid()), r.limit); err != nil {
		fmt.Fprintf(os.Stderr, "loadtest: the pusher's memory limit is not enforced by the kernel (%v): only the collector keeps to it\n", err)
	}
	return r.startPusher()
}

// startKube starts the API server with the mesh and what the floods
// register against, and returns its kubeconfig.
func (r *floodRig) startKube(spec meshgen.Spec) (string, error) {
	kc, kubeconfig, err := startKube(r.work, spec)
	if err != nil {
		return "", err
	}
	r.stopKube, r.kube, r.dyn = kc.Stop, kc.Client, kc.Dynamic
	if _, err := r.kube.CoreV1().ServiceAccounts("ns-0").Create(r.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "late"}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("service account: %w", err)
	}
	// Workloads register in WorkloadGroups: the attacker's identity is
	// admitted by ns-0's, a quiet workload by vm-quiet's.
	if _, err := r.kube.CoreV1().Namespaces().Create(r.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "vm-quiet"}}, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("namespace vm-quiet: %w", err)
	}
	for ns, sa := range map[string]string{"ns-0": "attacker", "vm-quiet": "vm"} {
		group := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "networking.istio.io/v1", "kind": "WorkloadGroup",
			"metadata": map[string]any{"name": "vms", "namespace": ns}, "spec": map[string]any{"template": map[string]any{"serviceAccount": sa}}}}
		if _, err := r.dyn.Resource(workloadGroups).Namespace(ns).Create(r.ctx, group, metav1.CreateOptions{}); err != nil {
			return "", fmt.Errorf("WorkloadGroup %s/vms: %w", ns, err)
		}
	}
	return kubeconfig, nil
}

// issue makes the CA, the pusher's serving certificate and the clients'
// (the honest proxy, the attacker, the workload) and the roots they trust.
func (r *floodRig) issue() (ca *pki.CA, cert, key string, err error) {
	if ca, r.serving, r.roots, err = servingCA(r.work, "floods"); err != nil {
		return nil, "", "", err
	}
	for who, into := range map[string]*tls.Certificate{"honest": &r.honest, "attacker": &r.attacker, "vm": &r.vm} {
		ns := map[bool]string{true: "vm-quiet", false: "ns-0"}[who == "vm"]
		c, k, err := ca.Issue(who, "spiffe://cluster.local/ns/"+ns+"/sa/"+who)
		if err != nil {
			return nil, "", "", err
		}
		if *into, err = tls.LoadX509KeyPair(c, k); err != nil {
			return nil, "", "", err
		}
	}
	return ca, r.serving[0], r.serving[1], nil
}

// sealKey writes a key for sealing the CA's key in the store, and returns
// its file.
func (r *floodRig) sealKey() (string, error) {
	seal := make([]byte, 32)
	if _, err := rand.Read(seal); err != nil {
		return "", err
	}
	sealFile := filepath.Join(r.work, "seal.key")
	if err := os.WriteFile(sealFile, []byte(base64.StdEncoding.EncodeToString(seal)+"\n"), 0o600); err != nil {
		return "", err
	}
	return sealFile, nil
}

// startIngest starts etcd and NATS (each a process of its own) and the
// ingester, which registers workloads in the API server's WorkloadGroups
// at its default limits.
func (r *floodRig) startIngest(meshDir, kubeconfig string) error {
	etcd, etcdURL, _, err := startStore(r.ctx, r.sc.out, "floods-etcd", r.work, "--only", "etcd")
	if err != nil {
		return err
	}
	r.procs = append(r.procs, etcd)
	nats, _, natsURL, err := startStore(r.ctx, r.sc.out, "floods-nats", r.work, "--only", "nats")
	if err != nil {
		return err
	}
	r.procs = append(r.procs, nats)
	r.etcdURL, r.natsURL = etcdURL, natsURL
	admin, err := freeAddr()
	if err != nil {
		return err
	}
	ingester, err := start(r.sc.out, "floods-ingester", filepath.Join(r.sc.bin, "ingester"), "--etcd-endpoints", etcdURL, "--nats-url", natsURL,
		"--admin-addr", admin, "--leader-id", "", "--log-level", "warn", "--mesh-dir", meshDir, "--kubeconfig", "floods="+kubeconfig)
	if err != nil {
		return err
	}
	ingester.admin = admin
	r.procs = append(r.procs, ingester)
	if err := ingester.waitReady(r.ctx, time.Minute); err != nil {
		return err
	}
	return nil
}

// startPusher starts the pusher (again) on its addresses, in its memory
// cgroup, and waits until it is ready.
func (r *floodRig) startPusher() error {
	p, err := start(r.sc.out, fmt.Sprintf("floods-pusher-%d", time.Now().UnixNano()%1e6), filepath.Join(r.sc.bin, "pusher"), r.pusherArgs...)
	if err != nil {
		return err
	}
	p.ads, p.admin, p.heap = r.ads, r.admin, r.admin
	r.procs = append(r.procs, p)
	r.pusher = p
	if r.cg != nil {
		if err := r.cg.add(p.pid()); err != nil {
			return err
		}
	}
	return p.waitReady(r.ctx, time.Minute)
}

func (r *floodRig) stopAll() {
	for _, p := range r.procs {
		p.stop()
	}
	if r.cg != nil {
		r.cg.remove()
	}
	if r.stopKube != nil {
		r.stopKube()
	}
}

// clientTLS is TLS to the pusher presenting cert (none when it has none).
func (r *floodRig) clientTLS(cert tls.Certificate) *tls.Config {
	tc := &tls.Config{RootCAs: r.roots, MinVersion: tls.VersionTLS12}
	if cert.Certificate != nil {
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc
}

// dial connects to the pusher from a loopback address of the caller's
// (127.0.0.x: a host of its own, as the pusher counts hosts) with TLS tc
// and, when token is set, a bearer token.
func (r *floodRig) dial(from string, tc *tls.Config, token string) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
			return d.DialContext(ctx, "tcp", addr)
		})}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearerToken(token)))
	}
	return grpc.NewClient(r.pusher.ads, opts...)
}

// dialMany makes n connections as dial does, and what closes them.
func (r *floodRig) dialMany(n int, from string, tc *tls.Config) ([]*grpc.ClientConn, func(), error) {
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for range n {
		c, err := r.dial(from, tc, "")
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, c)
	}
	return conns, closeAll, nil
}

// firstAnswer sends a stream's first request and waits for its answer:
// nil, or the error the pusher ended the stream with.
func firstAnswer(s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, req *discovery.DiscoveryRequest) error {
	_ = s.Send(req) // a refused stream's Send fails; Recv says why
	_, err := s.Recv()
	return err
}

// stopThenClose is a flood's end: its callers stopped, then their
// connections closed; it returns what the callers sent.
func stopThenClose(stop func() string, closeAll func()) func() string {
	return func() string {
		sent := stop()
		closeAll()
		return sent
	}
}

// bearerToken sends a service account token with every call, as Istio's
// agent does.
type bearerToken string

func (b bearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearerToken) RequireTransportSecurity() bool { return true }

// floodNode is a sidecar of the honest proxies' namespace.
func floodNode(name string) *core.Node {
	return &core.Node{Id: "sidecar~10.99.0.1~" + name + ".ns-0~ns-0.svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue("ns-0")}}}
}

// flood runs one flood for the hold under churn and reports it.
func (r *floodRig) flood(f flood) (report.Fault, string) {
	fr := report.Fault{Name: f.name, Flood: &report.Flood{NewProxy: -1, Registered: -1}}
	if r.cg != nil {
		fr.Flood.LimitMiB = mib(r.limit)
	}
	kills := 0
	if r.cg != nil {
		kills = r.cg.oomKills()
	}
	from := time.Now()
	stop, err := f.start()
	if err != nil {
		return fr, err.Error()
	}
	// The pusher's RSS, sampled throughout.
	var peak atomic.Int64
	sctx, stopSampling := context.WithCancel(r.ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() {
		for sctx.Err() == nil {
			if s, err := procstat.Read(r.pusher.pid()); err == nil && s.RSS > peak.Load() {
				peak.Store(s.RSS)
			}
			select {
			case <-sctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	// Where the pusher spends its CPU during the flood, for the record.
	sampling.Go(func() { r.profile(f, max(r.sc.FaultHold-4*time.Second, time.Second)) })
	// A proxy connecting with a token a moment into the flood.
	time.Sleep(2 * time.Second)
	newProxy, why := r.tokenProxy(r.sc.FaultHold - 2*time.Second)
	registered, unregistered := r.register(time.Until(from.Add(r.sc.FaultHold)))
	if rest := time.Until(from.Add(r.sc.FaultHold)); rest > 0 {
		time.Sleep(rest)
	}
	// What the pusher holds once the flood has run its course, after a
	// collection: what the flood left it holding, garbage aside.
	fr.Flood.LiveHeapMiB = mib(memoryOf([]*proc{r.pusher}).live)
	fr.Flood.Sent = stop()
	to := time.Now()
	stopSampling()
	sampling.Wait()
	fr.Lasted = to.Sub(from).Seconds()
	fr.Flood.PeakRSSMiB = mib(peak.Load())
	fr.Flood.NewProxy = newProxy.Seconds()
	if why != "" {
		fr.Flood.NewProxy, fr.Flood.NewProxyError = -1, why
	}
	fr.Flood.Registered = registered.Seconds()
	if unregistered != "" {
		fr.Flood.Registered, fr.Flood.RegisteredError = -1, unregistered
	}
	var problem string
	if r.cg != nil && r.cg.oomKills() > kills || r.exited() {
		fr.Flood.OOMKilled = r.cg != nil && r.cg.oomKills() > kills
		problem = "the pusher was killed under the flood"
		if err := r.startPusher(); err != nil {
			return fr, problem + "; and could not be started again: " + err.Error()
		}
	}
	upTo := lastMade(r.tracker)
	recovered := time.Now()
	for time.Since(recovered) < r.sc.Settle && r.ctx.Err() == nil && pendingUpTo(r.tracker, upTo) > 0 {
		time.Sleep(100 * time.Millisecond)
	}
	fr.Recovered, fr.Pending = time.Since(recovered).Seconds(), pendingUpTo(r.tracker, upTo)
	p99, longest, n := convergedBetween(r.tracker, from, to)
	fr.During = &report.During{Changes: n, P99: p99.Seconds(), Max: longest.Seconds()}
	if problem == "" && fr.Pending > 0 {
		problem = fmt.Sprintf("%d changes made until its end did not reach every proxy within %s", fr.Pending, r.sc.Settle)
	}
	if problem == "" && why != "" {
		problem = "a proxy connecting with a token was not served: " + why
	}
	if problem == "" && unregistered != "" {
		problem = "another namespace's workload was not registered: " + unregistered
	}
	return fr, problem
}

// profile writes the pusher's CPU profile over d, then its heap, to the
// run's output directory, named after the flood (go tool pprof reads
// them).
func (r *floodRig) profile(f flood, d time.Duration) {
	name, _, _ := strings.Cut(f.name, ":")
	name = "floods-" + strings.ToLower(strings.Fields(name)[0])
	save := func(path, file string) {
		client := http.Client{Timeout: d + 30*time.Second}
		resp, err := client.Get("http://" + r.pusher.admin + path)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		out, err := os.Create(filepath.Join(r.sc.out, file))
		if err != nil {
			return
		}
		defer out.Close()
		_, _ = io.Copy(out, resp.Body)
	}
	save(fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())), name+".cpu.pprof")
	save("/debug/pprof/heap", name+".heap.pprof")
}

// exited reports whether the pusher has exited (and, a child not yet
// waited for, is a zombie).
func (r *floodRig) exited() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", r.pusher.pid()))
	if err != nil {
		return true
	}
	// pid (comm) state ...
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z'
}

// tokenProxy connects a proxy with a fresh service account token (so
// that it is reviewed) and returns how long its first response took, or
// why there was none within wait.
func (r *floodRig) tokenProxy(wait time.Duration) (time.Duration, string) {
	ctx, cancel := context.WithTimeout(r.ctx, wait)
	defer cancel()
	tr, err := r.kube.CoreV1().ServiceAccounts("ns-0").CreateToken(ctx, "late", &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Sprintf("token: %v", err)
	}
	began := time.Now()
	conn, err := r.dial("127.0.0.1", r.clientTLS(tls.Certificate{}), tr.Status.Token)
	if err != nil {
		return 0, err.Error()
	}
	defer conn.Close()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return 0, err.Error()
	}
	if err := firstAnswer(s, &discovery.DiscoveryRequest{Node: floodNode(fmt.Sprintf("late-%d", began.UnixNano())), TypeUrl: resource.ClusterType}); err != nil {
		return 0, err.Error()
	}
	return time.Since(began), ""
}

var workloadGroups = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadgroups"}
var workloadEntries = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}

// register connects a workload of namespace vm-quiet naming its
// WorkloadGroup, as Istio's agent does, and returns how long it took
// until its WorkloadEntry was written, or why it was not within wait. The
// workload stays connected until then.
func (r *floodRig) register(wait time.Duration) (time.Duration, string) {
	ctx, cancel := context.WithTimeout(r.ctx, wait)
	defer cancel()
	r.registered++
	address := fmt.Sprintf("10.250.0.%d", r.registered)
	began := time.Now()
	conn, err := r.dial("127.0.0.5", r.clientTLS(r.vm), "")
	if err != nil {
		return 0, err.Error()
	}
	defer conn.Close()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return 0, err.Error()
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: vmNode("vm-quiet", address), TypeUrl: resource.ClusterType}); err != nil {
		_, err = s.Recv()
		return 0, fmt.Sprint(err)
	}
	served := make(chan error, 1)
	go func() { _, err := s.Recv(); served <- err }()
	entries := r.dyn.Resource(workloadEntries).Namespace("vm-quiet")
	for {
		if _, err := entries.Get(ctx, "vms-"+address, metav1.GetOptions{}); err == nil {
			return time.Since(began), ""
		}
		select {
		case err := <-served:
			if err != nil {
				return 0, "its stream was ended: " + err.Error()
			}
		case <-ctx.Done():
			return 0, fmt.Sprintf("no WorkloadEntry vm-quiet/vms-%s after %s", address, wait.Round(time.Second))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// vmNode is a workload of namespace ns at address naming WorkloadGroup
// vms, as Istio's agent sends it.
func vmNode(ns, address string) *core.Node {
	return &core.Node{Id: "sidecar~" + address + "~vm-" + strings.ReplaceAll(address, ".", "-") + "." + ns + "~" + ns + ".svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(ns),
			"AUTO_REGISTER_GROUP": structpb.NewStringValue("vms"), "INSTANCE_IPS": structpb.NewStringValue(address)}}}
}

// registrations: the attacker's identity, admitted by ns-0's
// WorkloadGroup, connects workloads at new addresses as fast as it can,
// each ending its stream once served (or refused) for the next.
func (r *floodRig) registrations() (func() string, error) {
	conns, closeAll, err := r.dialMany(16, "127.0.0.6", r.clientTLS(r.attacker))
	if err != nil {
		return nil, err
	}
	var n atomic.Int64
	stop := r.loop(64, func(ctx context.Context, i int) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conns[i%len(conns)]).StreamAggregatedResources(cctx)
		if err != nil {
			return err
		}
		k := n.Add(1)
		address := fmt.Sprintf("10.%d.%d.%d", 100+k>>16&0x7f, k>>8&0xff, k&0xff)
		return firstAnswer(s, &discovery.DiscoveryRequest{Node: vmNode("ns-0", address), TypeUrl: resource.ClusterType})
	})
	return stopThenClose(stop, closeAll), nil
}

// floods are the floods, each after a quiet hold that measures the same
// figures without one.
func (r *floodRig) floods(only []string) []flood {
	all := []flood{
		{name: "none (for comparison)", start: func() (func() string, error) { return func() string { return "nothing" }, nil }},
		{name: "H2: token reviews asked with forged tokens that parse as the API server's, from one host, as fast as it can", start: r.forgedTokens},
		{name: "H3: one identity's workloads registering at new addresses, 64 callers on 16 connections, as fast as they can", start: r.registrations},
		{name: "H4: one identity's streams subscribing to made-up names, 4 MB per type, as many as it is let", start: r.madeUpNames},
		{name: "H5: CSDS asked by 64 callers at once, each for every honest proxy", start: r.csdsAtOnce},
		{name: "H6: 3 connections × 100 streams of unfinished 4 MiB messages, without any credential", start: r.unfinished},
	}
	if len(only) == 0 {
		return all
	}
	run := all[:1]
	for _, f := range all[1:] {
		if slices.ContainsFunc(only, func(p string) bool { return strings.HasPrefix(f.name, p) }) {
			run = append(run, f)
		}
	}
	return run
}

// loop runs n callers of call, each calling again as soon as a call
// returns, until stop; it counts the calls and their errors by status
// code.
func (r *floodRig) loop(n int, call func(ctx context.Context, i int) error) (stop func() string) {
	ctx, cancel := context.WithCancel(r.ctx)
	var calls atomic.Int64
	var mu sync.Mutex
	codes := map[string]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := call(ctx, i)
				calls.Add(1)
				if err != nil && ctx.Err() == nil {
					mu.Lock()
					codes[status.Code(err).String()]++
					mu.Unlock()
				}
			}
		})
	}
	return func() string {
		cancel()
		wg.Wait()
		return fmt.Sprintf("%d calls; refused: %v", calls.Load(), codes)
	}
}

// forgedTokens: tokens that parse as service account tokens of the right
// audience, not yet expired, whose signature is made up: each needs the
// API server to tell.
func (r *floodRig) forgedTokens() (func() string, error) {
	conns, closeAll, err := r.dialMany(8, "127.0.0.2", r.clientTLS(tls.Certificate{}))
	if err != nil {
		return nil, err
	}
	stop := r.loop(32, func(ctx context.Context, i int) error {
		ads := discovery.NewAggregatedDiscoveryServiceClient(conns[i%len(conns)])
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		s, err := ads.StreamAggregatedResources(cctx, grpc.PerRPCCredentials(bearerToken(forgedToken())))
		if err != nil {
			return err
		}
		return firstAnswer(s, &discovery.DiscoveryRequest{Node: floodNode(fmt.Sprintf("forger-%d", i)), TypeUrl: resource.ClusterType})
	})
	return stopThenClose(stop, closeAll), nil
}

// forgedToken is a JWT of a service account of ns-0 for audience
// istio-ca, valid for an hour, with a made-up signature.
func forgedToken() string {
	enc := base64.RawURLEncoding
	head, _ := json.Marshal(map[string]string{"alg": "RS256", "kid": "forged"})
	now := time.Now().Unix()
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	claims, _ := json.Marshal(map[string]any{"aud": []string{"istio-ca"}, "exp": now + 3600, "iat": now, "nbf": now,
		"iss": "https://kubernetes.default.svc.cluster.local", "sub": "system:serviceaccount:ns-0:honest", "jti": fmt.Sprintf("%x", id),
		"kubernetes.io": map[string]any{"namespace": "ns-0", "serviceaccount": map[string]string{"name": "honest", "uid": fmt.Sprintf("%x", id)}}})
	sig := make([]byte, 256)
	_, _ = rand.Read(sig)
	return enc.EncodeToString(head) + "." + enc.EncodeToString(claims) + "." + enc.EncodeToString(sig)
}

// madeUpNames: the attacker's identity opens streams on connections of
// its own and asks, of each type, 4,000 names of a kilobyte no other
// stream asks for.
func (r *floodRig) madeUpNames() (func() string, error) {
	conns, closeAll, err := r.dialMany(16, "127.0.0.3", r.clientTLS(r.attacker))
	if err != nil {
		return nil, err
	}
	filler := strings.Repeat("x", 990)
	var held atomic.Int64
	var streams sync.WaitGroup
	stop := r.loop(16, func(ctx context.Context, i int) error {
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conns[i]).StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("names-%d-%d", i, time.Now().UnixNano())
		for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType} {
			names := make([]string, 4000)
			for j := range names {
				names[j] = fmt.Sprintf("%s-%s-%04d-%s", name, typ[len(typ)-8:], j, filler)
			}
			if err := s.Send(&discovery.DiscoveryRequest{Node: floodNode(name), TypeUrl: typ, ResourceNames: names}); err != nil {
				break
			}
		}
		// The stream is kept open, holding what it asked for, unless the
		// pusher ends it; the caller opens the next.
		errc := make(chan error, 1)
		streams.Go(func() {
			for {
				if _, err := s.Recv(); err != nil {
					errc <- err
					return
				}
			}
		})
		select {
		case err := <-errc:
			return err
		case <-time.After(500 * time.Millisecond):
			held.Add(1)
			return nil
		}
	})
	return func() string {
		sent := stop()
		closeAll() // ends the streams kept open
		streams.Wait()
		return fmt.Sprintf("%s; %d streams kept open", sent, held.Load())
	}, nil
}

// csdsAtOnce: the attacker's identity, of the honest proxies' namespace,
// asks CSDS for every one of them, from 64 callers at once.
func (r *floodRig) csdsAtOnce() (func() string, error) {
	conns, closeAll, err := r.dialMany(4, "127.0.0.4", r.clientTLS(r.attacker))
	if err != nil {
		return nil, err
	}
	var matchers []*matcherv3.NodeMatcher
	for i := range r.sc.Proxies {
		matchers = append(matchers, &matcherv3.NodeMatcher{NodeId: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: sim.NodeID(i, 1)}}})
	}
	stop := r.loop(64, func(ctx context.Context, i int) error {
		_, err := statusv3.NewClientStatusDiscoveryServiceClient(conns[i%len(conns)]).FetchClientStatus(ctx, &statusv3.ClientStatusRequest{NodeMatchers: matchers},
			grpc.MaxCallRecvMsgSize(1<<30))
		return err
	})
	return stopThenClose(stop, closeAll), nil
}

// unfinished: messages of 4 MiB begun and never finished, without a
// client certificate or a token.
func (r *floodRig) unfinished() (func() string, error) {
	tc := r.clientTLS(tls.Certificate{})
	tc.NextProtos = []string{"h2"}
	f, err := h2flood.Start(r.pusher.ads, tc, "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources", 3, 100, 4<<20)
	if err != nil {
		return nil, err
	}
	return func() string {
		f.Close()
		return fmt.Sprintf("%d MiB of messages; %d of 300 streams ended by the pusher", f.Sent()>>20, f.Reset())
	}, nil
}
