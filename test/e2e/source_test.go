package e2e

import (
	"fmt"
	"testing"

	"google.golang.org/grpc"
)

// dialAs dials the greeter as a proxyless client of a namespace with labels.
func dialAs(t *testing.T, ads, name, namespace, labels string) *grpc.ClientConn {
	t.Helper()
	return dialXDSNode(t, ads, "xds:///greeter.demo.svc.cluster.local:50051", fmt.Sprintf(`{
		"id": "sidecar~127.0.0.1~%[1]s.%[2]s~%[2]s.svc.cluster.local",
		"metadata": {"GENERATOR": "grpc", "NAMESPACE": %[2]q, "LABELS": %[3]s}}`, name, namespace, labels))
}

// TestSourceMatches: a VirtualService match on sourceLabels or
// sourceNamespace routes the clients it names (their class: their labels,
// their namespace) and no other, with real grpc-go clients.
func TestSourceMatches(t *testing.T) {
	a, b, c := startBackend(t), startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b),
		workloadEntry("greeter-3", "v3", c), greeterSubsets+`
  - {name: v3, labels: {version: v3}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - match: [{sourceLabels: {track: canary}}]
    route: [{destination: {host: greeter, subset: v2}}]
  - match: [{sourceNamespace: batch}]
    route: [{destination: {host: greeter, subset: v3}}]
  - route: [{destination: {host: greeter, subset: v1}}]
`))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	allOn(t, dialAs(t, cp.ads, "web", "demo", `{"app": "web"}`), a.addr, "a client without the labels, in demo, takes the default route")
	allOn(t, dialAs(t, cp.ads, "canary", "demo", `{"app": "web", "track": "canary"}`), b.addr, "a client with the source labels takes their route")
	allOn(t, dialAs(t, cp.ads, "job", "batch", `{"app": "job"}`), c.addr, "a client of the source namespace takes its route")
}

// TestDelegatedRoutes: a VirtualService route that delegates to another
// (without hosts, in another namespace) routes by the delegate's routes
// within its match; a change of the delegate alone reaches the client.
func TestDelegatedRoutes(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b), greeterSubsets, `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - match: [{uri: {prefix: /grpc.health.v1.Health/}}]
    delegate: {name: health, namespace: team}
  - route: [{destination: {host: greeter, subset: v1}}]
`))
	delegate := func(subset string) string {
		return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: health, namespace: team}
spec:
  http:
  - match: [{uri: {exact: /grpc.health.v1.Health/Check}}]
    route: [{destination: {host: greeter.demo.svc.cluster.local, subset: %s}}]
`, subset)
	}
	writeMesh(t, dir, "team.yaml", delegate("v2"))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, b.addr, "Check goes where the delegate routes it")
	writeMesh(t, dir, "team.yaml", delegate("v1"))
	allOn(t, conn, a.addr, "a change of the delegate alone reaches the client")
}
