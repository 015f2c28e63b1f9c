package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/xds"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// backend is a real gRPC server on loopback; RPCs report which one served
// them through the peer address.
type backend struct {
	addr string
	port int
	// stop stops the server (set by serveBackend).
	stop func()
}

func startBackend(t *testing.T) backend {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveBackend(t, lis, health.NewServer())
}

// serveBackend serves a health service (the RPC the tests make) on lis.
func serveBackend(t *testing.T, lis net.Listener, hs healthpb.HealthServer) backend {
	t.Helper()
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return backend{addr: lis.Addr().String(), port: lis.Addr().(*net.TCPAddr).Port, stop: s.Stop}
}

// settled waits until the pusher has generated from everything the store
// holds: no change written before is still on its way.
func (cp *Replica) settled(t *testing.T) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, "the pusher to catch up with the store", func() (bool, string) {
		resp, err := cp.etcd.Get(context.Background(), "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err.Error()
		}
		p := cp.pusher
		return resp.Count > 0 && p.GeneratedRevision() >= resp.Header.Revision, fmt.Sprintf("generated %d, store at %d", p.GeneratedRevision(), resp.Header.Revision)
	})
}

// serving waits until what the pusher serves a connected proxy (its
// config dump) contains want.
func (cp *Replica) serving(t *testing.T, proxy, want string) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, "the proxy to be served "+want, func() (bool, string) {
		rec := httptest.NewRecorder()
		cp.dump.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/config_dump?proxy="+url.QueryEscape(proxy), nil))
		return strings.Contains(rec.Body.String(), want), rec.Result().Status
	})
}

// dialADS connects to a pusher's ADS port with creds (nil: plaintext); the
// connection closes when the test ends. Every test that speaks xDS itself
// dials through it; dialXDS routes RPCs through grpc-go's own xDS client.
func dialADS(t testing.TB, addr string, creds credentials.TransportCredentials) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(conn)
}

// dialXDS dials target through grpc-go's own xDS resolver, bootstrapped to
// the pusher as a proxyless client of namespace demo.
func dialXDS(t *testing.T, ads, target string) *grpc.ClientConn {
	t.Helper()
	return dialXDSNode(t, ads, target, `{"id": "sidecar~127.0.0.1~client.demo~demo.svc.cluster.local",
		"metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}}`)
}

// dialXDSNode is dialXDS with the bootstrap's node given as JSON.
func dialXDSNode(t *testing.T, ads, target, node string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": %s
	}`, ads, node)
	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// call makes one real RPC and returns the address of the backend that served it.
func call(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var p peer.Peer
	_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
	if err != nil {
		return "", err
	}
	return p.Addr.String(), nil
}

// spread makes n RPCs and counts them by backend; failed RPCs count under
// their error.
func spread(conn *grpc.ClientConn, n int) map[string]int {
	got := map[string]int{}
	for range n {
		addr, err := call(conn)
		if err != nil {
			addr = "error: " + err.Error()
		}
		got[addr]++
	}
	return got
}

// allOn waits until n RPCs in a row land on want.
func allOn(t *testing.T, conn *grpc.ClientConn, want string, what string) {
	t.Helper()
	testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
		for i := range 20 {
			addr, err := call(conn)
			if err != nil {
				return false, err.Error()
			}
			if addr != want {
				return false, fmt.Sprintf("rpc %d served by %s", i, addr)
			}
		}
		return true, ""
	})
}

func writeMesh(t *testing.T, dir, name, content string) {
	t.Helper()
	// Write then rename, as editors and config managers do, so the source
	// never reads half a file.
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

const greeterService = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  workloadSelector: {labels: {app: greeter}}
`

func workloadEntry(name, version string, b backend) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1beta1
kind: WorkloadEntry
metadata: {name: %s, namespace: demo}
spec:
  address: 127.0.0.1
  ports: {grpc: %d}
  labels: {app: greeter, version: %s}
`, name, b.port, version)
}

// greeterSubsets is the greeter's DestinationRule: subsets v1 and v2 by
// the version label.
const greeterSubsets = `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: demo}
spec:
  host: greeter
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
`

const greeterSplit = greeterSubsets + `---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - destination: {host: greeter, subset: v1}
      weight: 80
    - destination: {host: greeter, subset: v2}
      weight: 20
`

func docs(parts ...string) string { return strings.Join(parts, "\n---\n") }

// TestProxylessGRPCFollowsTheYAML runs the whole pipeline — YAML directory,
// ingester, etcd, relay, NATS JetStream, pusher — and a real grpc-go client
// routing real RPCs through what the pusher serves, while the YAML changes.
func TestProxylessGRPCFollowsTheYAML(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")

	allOn(t, conn, a.addr, "RPCs reach backend a, the only endpoint")

	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b)))
	allOn(t, conn, b.addr, "RPCs follow the endpoint to backend b")

	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a),
		workloadEntry("greeter-2", "v2", b), greeterSplit))
	splits8020(t, conn, a, b)

	// The VirtualService alone changes: the pusher generates its virtual
	// host, not the classes (pusher.rerouteClass), and the client follows.
	rerouted := counterWith(t, cp.reg, "shardpilot_pusher_generations_total", "kind", "routes")
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a),
		workloadEntry("greeter-2", "v2", b), strings.NewReplacer("weight: 80", "weight: 0", "weight: 20", "weight: 100").Replace(greeterSplit)))
	allOn(t, conn, b.addr, "RPCs follow the VirtualService to subset v2 alone")
	if got := counterWith(t, cp.reg, "shardpilot_pusher_generations_total", "kind", "routes"); got <= rerouted {
		t.Errorf("the VirtualService change was generated whole (%v route generations before and after)", got)
	}
}

// splits8020 waits until RPCs split 80/20 between backends a and b, then
// checks the split over 500 RPCs, every one of which must succeed.
func splits8020(t *testing.T, conn *grpc.ClientConn, a, b backend) {
	t.Helper()
	// The client may fail a few RPCs while it switches clusters (grpc-go
	// swaps its cluster picker after its route table); once switched, every
	// RPC succeeds and the split holds. Before the route rule arrives, the
	// default route already spreads over both endpoints, round robin (25 of
	// 50 each): only an 80/20 spread shows that the split took effect.
	testutil.Eventually(t, 20*time.Second, "client splits 80/20 between the subsets", func() (bool, string) {
		got := spread(conn, 50)
		return got[a.addr] >= 35 && got[b.addr] > 0 && got[a.addr]+got[b.addr] == 50, fmt.Sprint(got)
	})
	got := spread(conn, 500)
	t.Logf("500 RPCs after the split: %v", got)
	if got[a.addr]+got[b.addr] != 500 {
		t.Fatalf("RPCs failed after the split took effect: %v", got)
	}
	// 500 draws of p=0.8 have a standard deviation of 1.8%: ±7% is nearly
	// four of them.
	if share := float64(got[a.addr]) / 500; share < 0.73 || share > 0.87 {
		t.Errorf("subset v1 (backend a) got %.0f%% of the RPCs, want 80%%", 100*share)
	}
}

func sortedNames[V any](m map[string]V) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// tlsCreds are client TLS credentials presenting cert, trusting caFile.
func tlsCreds(t *testing.T, caFile, cert, key string) credentials.TransportCredentials {
	t.Helper()
	c, err := (&transport.TLSInfo{TrustedCAFile: caFile, CertFile: cert, KeyFile: key}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return credentials.NewTLS(c)
}

// dialTLS connects to addr with tlsCreds; the test closes the connection.
func dialTLS(t *testing.T, addr, caFile, cert, key string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(tlsCreds(t, caFile, cert, key)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestUnknownFieldAppliesTheRest: a VirtualService with a field this
// version does not know (a newer Istio's) still routes a real grpc-go
// client as its known fields say; refused, it would leave the client
// spread over both versions. (The security policies, which such a field
// refuses whole, are istio.TestUnknownFields'.)
func TestUnknownFieldAppliesTheRest(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	writeMesh(t, dir, "route.yaml", greeterSubsets+`---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - destination: {host: greeter, subset: v2}
    retryBudget: {percent: 10}
`)
	allOn(t, conn, b.addr, "RPCs follow the VirtualService whose unknown field is warned of, to v2")
}
