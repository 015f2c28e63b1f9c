package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
)

// manyServices are n ServiceEntries of namespace demo, svc-<i>, each with
// an endpoint.
func manyServices(from, n int) string {
	var b strings.Builder
	for i := from; i < from+n; i++ {
		fmt.Fprintf(&b, `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: svc-%d, namespace: demo}
spec:
  hosts: [svc-%d.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1}]
---
`, i, i)
	}
	return b.String()
}

// TestNewServiceReachesProxylessInAHugeClass: in a mesh of 10,000
// services and no Sidecar, a proxyless class's listeners are larger than
// grpc-go takes in one message (4 MiB), but a client names the ones it
// dials: a service added later reaches it, and calls to it succeed.
func TestNewServiceReachesProxylessInAHugeClass(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	for i := range 10 {
		writeMesh(t, dir, fmt.Sprintf("services-%d.yaml", i), manyServices(i*1000, 1000))
	}
	start := time.Now()
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	// Ingesting and generating 10,000 services takes a while on a busy
	// machine (with the race detector): its first config is waited for longer.
	testutil.Eventually(t, 3*time.Minute, "a first call to greeter, among 10,000 services", func() (bool, string) {
		addr, err := call(conn)
		return err == nil && addr == a.addr, fmt.Sprint(addr, err)
	})
	allOn(t, conn, a.addr, "calls to greeter, among 10,000 services")
	t.Logf("10,000 services served to a proxyless client in %s", time.Since(start).Round(time.Millisecond))

	writeMesh(t, dir, "fresh.yaml", fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: fresh, namespace: demo}
spec:
  hosts: [fresh.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {grpc: %d}}]
`, b.port))
	fresh := dialXDS(t, cp.ads, "xds:///fresh.demo.svc.cluster.local:50051")
	testutil.Eventually(t, 2*time.Minute, "calls to a service added to the 10,000", func() (bool, string) {
		addr, err := call(fresh)
		return err == nil && addr == b.addr, fmt.Sprint(addr, err)
	})
}
