package e2e

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/shardpilot/shardpilot/internal/testutil"
)

// localityEntry is a ServiceEntry with a backend in each of three
// localities.
func localityEntry(a, b, c backend) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.example.com]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints:
  - {address: 127.0.0.1, ports: {grpc: %d}, locality: us-east/z1}
  - {address: 127.0.0.1, ports: {grpc: %d}, locality: us-east/z2}
  - {address: 127.0.0.1, ports: {grpc: %d}, locality: eu-west/z1}
`, a.port, b.port, c.port)
}

// greeterPolicy is the external greeter's DestinationRule with a traffic
// policy (YAML indented under trafficPolicy).
func greeterPolicy(policy string) string {
	return `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: demo}
spec:
  host: greeter.example.com
  trafficPolicy:` + policy + "\n"
}

// dialIn dials the greeter as a proxyless client in a locality.
func dialIn(t *testing.T, ads, region, zone string) *grpc.ClientConn {
	t.Helper()
	return dialXDSNode(t, ads, "xds:///greeter.example.com:50051", fmt.Sprintf(`{
		"id": "sidecar~127.0.0.1~client-%[1]s-%[2]s.demo~demo.svc.cluster.local",
		"metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"},
		"locality": {"region": %[1]q, "zone": %[2]q}}`, region, zone))
}

// TestLocalityFailover: with outlier detection on the destination (what
// turns Istio's locality failover on), grpc-go's xDS client calls the
// endpoints of its own locality, then those of its region when they fail,
// then the rest; each locality's proxies get their own priorities. Without
// it, they spread over every endpoint; distribute sends a locality's
// requests where it says.
func TestLocalityFailover(t *testing.T) {
	a, b, c := startBackend(t), startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", localityEntry(a, b, c))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	east1 := dialIn(t, cp.ads, "us-east", "z1")
	testutil.Eventually(t, 20*time.Second, "calls without a destination rule to spread over the localities", func() (bool, string) {
		got := spread(east1, 30)
		return len(got) == 3 && got[a.addr] > 0 && got[b.addr] > 0 && got[c.addr] > 0, fmt.Sprint(got)
	})

	writeMesh(t, dir, "rule.yaml", greeterPolicy(`
    outlierDetection: {consecutive5xxErrors: 3, interval: 1s, baseEjectionTime: 30s}`))
	allOn(t, east1, a.addr, "a client in us-east/z1 calls the endpoint of its zone")
	// The config dump shows what the proxy is served: its locality's
	// priorities (0 its zone, 1 its region, 2 the other region).
	cp.serving(t, "sidecar~127.0.0.1~client-us-east-z1.demo~demo.svc.cluster.local", `"priority": 2`)
	allOn(t, dialIn(t, cp.ads, "us-east", "z2"), b.addr, "a client in us-east/z2 calls the endpoint of its zone")
	west := dialIn(t, cp.ads, "eu-west", "z1")
	allOn(t, west, c.addr, "a client in eu-west/z1 calls the endpoint of its region")

	a.stop()
	allOn(t, east1, b.addr, "with its zone's endpoint down, the client fails over within its region")
	b.stop()
	allOn(t, east1, c.addr, "with its region down, the client fails over to the other region")
	allOn(t, west, c.addr, "the other region's client is unmoved")

	// distribute: the clients of eu-west send everything to us-east/z2.
	b2 := startBackend(t)
	writeMesh(t, dir, "greeter.yaml", localityEntry(a, b2, c))
	writeMesh(t, dir, "rule.yaml", greeterPolicy(`
    loadBalancer:
      localityLbSetting:
        distribute:
        - from: eu-west/*
          to: {"us-east/z2/*": 100}`))
	allOn(t, west, b2.addr, "distribute sends eu-west's calls to us-east/z2")
}
