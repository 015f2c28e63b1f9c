package e2e

import (
	"fmt"
	"testing"
)

// dnsEntry is a ServiceEntry whose endpoint is a name to resolve.
func dnsEntry(resolution, name string, b backend) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external, namespace: demo}
spec:
  hosts: [greeter.example.com]
  location: MESH_EXTERNAL
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: %s
  endpoints: [{address: %s, ports: {grpc: %d}}]
`, resolution, name, b.port)
}

// TestProxylessGRPCResolvesDNS: a ServiceEntry with DNS resolution is
// served as a cluster that resolves its endpoint's name (LOGICAL_DNS for
// grpc-go, never a hostname over EDS); a grpc-go client resolves
// "localhost" and calls the backend; an endpoint moved to another name is
// followed.
func TestProxylessGRPCResolvesDNS(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "external.yaml", dnsEntry("DNS", "localhost", a))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.example.com:50051")
	allOn(t, conn, a.addr, "RPCs reach the backend behind the resolved name")

	// Only the endpoint changes (an endpoints object, not the service):
	// the cluster, which holds it, follows.
	writeMesh(t, dir, "external.yaml", dnsEntry("DNS", "localhost", b))
	allOn(t, conn, b.addr, "RPCs follow the endpoint to the other backend")
	writeMesh(t, dir, "external.yaml", dnsEntry("DNS_ROUND_ROBIN", "localhost", a))
	allOn(t, conn, a.addr, "DNS_ROUND_ROBIN resolves too")
}
