// Package kube is the Kubernetes source: it watches one cluster with
// client-go shared informers — Services, EndpointSlices, Pods, Nodes and
// Namespaces — and dynamic informers for Istio's networking CRDs, turns what
// it sees into model objects (the CRDs through the same normalizer as the
// YAML directory), and syncs them into the store as that cluster's shard.
//
// A Service becomes <name>.<namespace>.svc.<domain suffix> with its ports'
// protocols read as Istio reads them (appProtocol, then the port name's
// prefix). Its endpoints come from its EndpointSlices, honouring the ready,
// serving and terminating conditions, with each Pod's labels and service
// account and each Node's region and zone.
//
// Source.Run owns its informers and returns after they have stopped.
package kube
