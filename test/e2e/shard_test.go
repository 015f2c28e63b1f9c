package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/app"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// namespaceService is a ServiceEntry of a namespace, svc.<ns>.example.com,
// whose endpoint is b; and, when egress hosts are given, the namespace's
// Sidecar limiting what its proxies see to them.
func namespaceService(ns string, b backend, egress ...string) string {
	out := fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc, namespace: %[1]s}
spec:
  hosts: [svc.%[1]s.example.com]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {grpc: %[2]d}}]
`, ns, b.port)
	if len(egress) > 0 {
		out += fmt.Sprintf(`---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: %s}
spec:
  egress: [{hosts: ["%s"]}]
`, ns, strings.Join(egress, `", "`))
	}
	return out
}

// eventsApplied is how many change events a pusher took from the bus.
func eventsApplied(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return counterSum(t, reg, "shardpilot_pusher_events_total")
}

// TestShardPushers: pushers serving the proxies of one namespace each
// (whose Sidecar sees it and a shared one) load and follow only those
// namespaces and the root: a change in another namespace reaches none of
// them, one in the shared namespace reaches both; their proxies are
// served what they see; a proxy of another namespace is refused, naming
// the pusher's namespaces.
func TestShardPushers(t *testing.T) {
	x, y := startBackend(t), startBackend(t)
	dir := t.TempDir()
	for _, ns := range []string{"a", "b"} {
		writeMesh(t, dir, ns+".yaml", namespaceService(ns, x, "./*", "shared/*"))
	}
	writeMesh(t, dir, "shared.yaml", namespaceService("shared", x))
	writeMesh(t, dir, "c.yaml", namespaceService("c", x))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	cp.settled(t)
	pa, pb := cp.shardPusher(t, []string{"a"}), cp.shardPusher(t, []string{"b"})
	regA, regB := pa.reg, pb.reg
	for _, rp := range []*Replica{pa, pb} {
		testutil.Eventually(t, 20*time.Second, "the shard pusher to load its scope", func() (bool, string) {
			return rp.pusher.GeneratedRevision() > 0, "not loaded"
		})
	}
	allOn(t, dialXDSNode(t, pa.ads, "xds:///svc.shared.example.com:50051", clientIn("a")), x.addr, "a proxy of a calls the shared namespace's service through its shard's pusher")

	// A change in c reaches neither shard; one in a reaches a's alone; one
	// in shared reaches both. Each is waited for where it is followed.
	storeRev := func() int64 {
		resp, err := cp.etcd.Get(context.Background(), "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	change := func(ns string, b backend, to ...*Replica) {
		t.Helper()
		before := storeRev()
		egress := map[string][]string{"a": {"./*", "shared/*"}, "b": {"./*", "shared/*"}}[ns]
		writeMesh(t, dir, ns+".yaml", namespaceService(ns, b, egress...))
		testutil.Eventually(t, 20*time.Second, "the change in "+ns+" to be stored", func() (bool, string) { return storeRev() > before, "" })
		cp.settled(t)
		rev := storeRev()
		for _, rp := range to {
			testutil.Eventually(t, 20*time.Second, "the change in "+ns+" to reach its shard", func() (bool, string) {
				return rp.pusher.GeneratedRevision() >= rev, fmt.Sprint(rp.pusher.GeneratedRevision(), " < ", rev)
			})
		}
	}
	a0, b0 := eventsApplied(t, regA), eventsApplied(t, regB)
	change("c", y)
	change("a", y, pa) // after c's, in stream order: a's pusher had c's too, if it were sent
	a1, b1 := eventsApplied(t, regA), eventsApplied(t, regB)
	change("shared", y, pa, pb)
	a2, b2 := eventsApplied(t, regA), eventsApplied(t, regB)
	t.Logf("events taken: shard a %v, %v, %v; shard b %v, %v, %v", a0, a1, a2, b0, b1, b2)
	if b1 != b0 {
		t.Errorf("shard b took %v events of changes in c and a, want none", b1-b0)
	}
	if a1 == a0 || a2 == a1 || b2 == b1 {
		t.Errorf("a shard missed a change it sees: a %v → %v → %v, b %v → %v", a0, a1, a2, b1, b2)
	}
	allOn(t, dialXDSNode(t, pa.ads, "xds:///svc.a.example.com:50051", clientIn("a")), y.addr, "the shard's proxies follow its namespace's change")

	// A proxy of another namespace is refused by the shard's pusher.
	ads := dialADS(t, pa.ads, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "sidecar~10.0.0.9~web.c~c.svc.cluster.local"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a proxy of namespace c: %v, want FailedPrecondition", err)
	}
}

// scopeNamespaces reads a pusher's shardpilot_pusher_scope_namespaces.
func scopeNamespaces(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "shardpilot_pusher_scope_namespaces" {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// TestScopeByProxies: a pusher serving the namespaces of its proxies holds
// the root namespace alone until a proxy comes; the first proxy of a
// namespace is told to retry while what it sees is loaded, then served; the
// scope is released a grace period after the last proxy left (longer than
// a refused proxy takes to retry).
func TestScopeByProxies(t *testing.T) {
	x := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "a.yaml", namespaceService("a", x, "./*", "shared/*"))
	writeMesh(t, dir, "shared.yaml", namespaceService("shared", x))
	writeMesh(t, dir, "c.yaml", namespaceService("c", x))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	cp.settled(t)
	byProxies := cp.AddPusher(t, func(p *app.Pusher) { p.ScopeByProxies, p.ScopeGrace = true, 5*time.Second })
	reg := byProxies.reg
	scope := func(want float64, what string) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
			got := scopeNamespaces(t, reg)
			return got == want, fmt.Sprint(got, " namespaces")
		})
	}
	scope(1, "the pusher to hold the root namespace alone")
	conn := dialXDSNode(t, byProxies.ads, "xds:///svc.shared.example.com:50051",
		`{"id": "sidecar~127.0.0.1~client.a~a.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "a"}}`)
	allOn(t, conn, x.addr, "the first proxy of a is served once its scope is loaded")
	scope(3, "the scope of a: a, the root and shared")
	conn.Close()
	scope(1, "the scope released after the grace period")
}

// forwarder stands for a Kubernetes Service: it sends each connection to
// its current target; connections made before a switch stay where they are.
type forwarder struct {
	lis    net.Listener
	target atomic.Value // string
	// accepted counts the connections made through it.
	accepted atomic.Int64
}

func newForwarder(t *testing.T, target string) *forwarder {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &forwarder{lis: lis}
	f.target.Store(target)
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			f.accepted.Add(1)
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", f.target.Load().(string))
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return f
}

// twoNamespaces is a control plane over namespaces a and b, whose Sidecars
// see themselves and shared; a's service is served by x, b's by y,
// shared's by x.
func twoNamespaces(t *testing.T) (x, y backend, dir string, cp *Cluster) {
	t.Helper()
	x, y = startBackend(t), startBackend(t)
	dir = t.TempDir()
	writeMesh(t, dir, "a.yaml", namespaceService("a", x, "./*", "shared/*"))
	writeMesh(t, dir, "b.yaml", namespaceService("b", y, "./*", "shared/*"))
	writeMesh(t, dir, "shared.yaml", namespaceService("shared", x))
	cp = NewCluster(t, Options{}, yamlSource(dir))
	cp.settled(t)
	return x, y, dir, cp
}

// clientIn is the node of a grpc-go client in a namespace.
func clientIn(ns string) string {
	return fmt.Sprintf(`{"id": "sidecar~127.0.0.1~client.%[1]s~%[1]s.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": %[1]q}}`, ns)
}

// TestNamespaceMovesShard: a namespace moved to a new shard (its Service
// now selecting the new shard's pushers, the old shard restarted without
// it) has its proxies served by the new shard once they reconnect; the
// old shard's other namespaces stay with it.
func TestNamespaceMovesShard(t *testing.T) {
	x, y, dir, cp := twoNamespaces(t)
	old := cp.shardPusher(t, []string{"a", "b"})
	xdsA, xdsB := newForwarder(t, old.ads), newForwarder(t, old.ads)
	inA := dialXDSNode(t, xdsA.lis.Addr().String(), "xds:///svc.a.example.com:50051", clientIn("a"))
	inB := dialXDSNode(t, xdsB.lis.Addr().String(), "xds:///svc.b.example.com:50051", clientIn("b"))
	allOn(t, inA, x.addr, "a's proxy served by the shard of a and b")
	allOn(t, inB, y.addr, "b's proxy served by the shard of a and b")

	// Move b, as a rolling update does: a new shard serves it and b's
	// Service selects it; the old shard's replacement (without b) comes up
	// and a's Service selects it; then the old shard is stopped.
	moved := cp.shardPusher(t, []string{"b"})
	restarted := cp.shardPusher(t, []string{"a"})
	for _, rp := range []*Replica{moved, restarted} {
		testutil.Eventually(t, 20*time.Second, "the new shards to load", func() (bool, string) { return rp.pusher.GeneratedRevision() > 0, "" })
	}
	xdsB.target.Store(moved.ads)
	xdsA.target.Store(restarted.ads)
	start := time.Now()
	old.stop()
	stopped := time.Since(start)
	// The services change, so that what each proxy is served next is new:
	// only the shard it moved to can serve it.
	writeMesh(t, dir, "b.yaml", namespaceService("b", x, "./*", "shared/*"))
	writeMesh(t, dir, "a.yaml", namespaceService("a", y, "./*", "shared/*"))
	allOn(t, inB, x.addr, "b's proxy follows b to the new shard")
	allOn(t, inA, y.addr, "a's proxy is served by its shard's replacement")
	t.Logf("the old shard drained in %s; both proxies served by their new shards %s after it began to stop",
		stopped.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// placedPusher adds a pusher serving the namespaces a file lists
// (read again every 50ms).
func (c *Cluster) placedPusher(t *testing.T, file string) *Replica {
	t.Helper()
	return c.AddPusher(t, func(p *app.Pusher) {
		p.NamespacesFile, p.PlacementPoll = file, 50*time.Millisecond
	})
}

// counter reads a counter of a registry (0 when it has not been set).
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == name {
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestShardAddedAndRemoved: shards whose namespaces come from a file (a
// ConfigMap) change placement without a restart. A shard added takes b
// from the shard of a and b: b's proxy alone is shed and reconnects,
// through b's Service, to the new shard; a's proxy keeps its connection.
// Emptied, the new shard sheds b's proxy back to the old shard, which was
// given b again.
func TestShardAddedAndRemoved(t *testing.T) {
	x, y, dir, cp := twoNamespaces(t)
	files := t.TempDir()
	place := func(name, namespaces string) string {
		t.Helper()
		writeMesh(t, files, name, "# the namespaces of shard "+name+"\n"+namespaces+"\n")
		return filepath.Join(files, name)
	}
	old := cp.placedPusher(t, place("old", "a, b"))
	regOld := old.reg
	xdsA, xdsB := newForwarder(t, old.ads), newForwarder(t, old.ads)
	inA := dialXDSNode(t, xdsA.lis.Addr().String(), "xds:///svc.a.example.com:50051", clientIn("a"))
	inB := dialXDSNode(t, xdsB.lis.Addr().String(), "xds:///svc.b.example.com:50051", clientIn("b"))
	allOn(t, inA, x.addr, "a's proxy served by the shard of a and b")
	allOn(t, inB, y.addr, "b's proxy served by the shard of a and b")
	scope := func(reg *prometheus.Registry, want float64, what string) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
			got := scopeNamespaces(t, reg)
			return got == want, fmt.Sprint(got, " namespaces")
		})
	}
	scope(regOld, 4, "the old shard to hold a, b, shared and the root namespace")

	// Add a shard for b: it loads b, b's Service selects it, and the old
	// shard's file drops b.
	added := cp.placedPusher(t, place("new", "b"))
	regNew := added.reg
	scope(regNew, 3, "the new shard to hold b, shared and the root namespace")
	testutil.Eventually(t, 20*time.Second, "the new shard to generate", func() (bool, string) { return added.pusher.GeneratedRevision() > 0, "" })
	xdsB.target.Store(added.ads)
	place("old", "a")
	scope(regOld, 3, "the old shard to release b")
	shed := func(reg *prometheus.Registry, what string) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
			n := counter(t, reg, "shardpilot_pusher_xds_streams_shed_total")
			return n == 1, fmt.Sprint(n, " streams shed")
		})
	}
	shed(regOld, "b's proxy to be shed")
	// Only the shard a proxy is on now holds what changes next.
	writeMesh(t, dir, "b.yaml", namespaceService("b", x, "./*", "shared/*"))
	writeMesh(t, dir, "a.yaml", namespaceService("a", y, "./*", "shared/*"))
	allOn(t, inB, x.addr, "b's proxy follows b to the new shard")
	allOn(t, inA, y.addr, "a's proxy is still served by the old shard")
	if n := xdsA.accepted.Load(); n != 1 {
		t.Errorf("a's proxy connected %d times, want once: only the proxies of the namespace moved move", n)
	}
	if n := xdsB.accepted.Load(); n < 2 {
		t.Errorf("b's proxy connected %d times, want a reconnection", n)
	}

	// Remove the new shard: the old one is given b again first, then b's
	// Service selects it and the new shard's file is emptied.
	place("old", "a\nb")
	scope(regOld, 4, "the old shard to load b again")
	xdsB.target.Store(old.ads)
	place("new", "")
	scope(regNew, 1, "the emptied shard to hold the root namespace alone")
	shed(regNew, "b's proxy to be shed by the emptied shard")
	writeMesh(t, dir, "b.yaml", namespaceService("b", y, "./*", "shared/*"))
	allOn(t, inB, y.addr, "b's proxy is back on the old shard")
	if n := xdsA.accepted.Load(); n != 1 {
		t.Errorf("a's proxy connected %d times, want once", n)
	}

	// A broken file keeps the placement.
	shedBefore := counter(t, regOld, "shardpilot_pusher_xds_streams_shed_total")
	connections := xdsA.accepted.Load() + xdsB.accepted.Load()
	place("old", "a, B_")
	testutil.Eventually(t, 20*time.Second, "the broken placement to be read", func() (bool, string) {
		return counter(t, regOld, "shardpilot_pusher_placement_read_failures_total") > 0, ""
	})
	allOn(t, inA, y.addr, "a's proxy still served after a broken placement")
	allOn(t, inB, y.addr, "b's proxy still served after a broken placement")
	if n := counter(t, regOld, "shardpilot_pusher_xds_streams_shed_total"); n != shedBefore {
		t.Errorf("the old shard shed %v streams for a broken placement, want none", n-shedBefore)
	}
	if n := xdsA.accepted.Load() + xdsB.accepted.Load(); n != connections {
		t.Errorf("%d connections after the broken placement, want %d (no proxy moved)", n, connections)
	}
}
