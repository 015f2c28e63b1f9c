package testutil

import "fmt"

// StrictGreeter is the Istio config of a proxyless gRPC greeter of
// namespace ns (service account greeter, listening on 127.0.0.1:port)
// that takes Istio's mutual TLS alone: ISTIO_MUTUAL for its clients,
// STRICT for its namespace.
func StrictGreeter(ns string, port int) string {
	return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: %[1]s}
spec:
  hosts: [greeter.%[1]s.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  workloadSelector: {labels: {app: greeter}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: greeter-1, namespace: %[1]s}
spec: {address: 127.0.0.1, ports: {grpc: %[2]d}, labels: {app: greeter}, serviceAccount: greeter}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: %[1]s}
spec:
  host: greeter.%[1]s.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: %[1]s}
spec: {mtls: {mode: STRICT}}
`, ns, port)
}
