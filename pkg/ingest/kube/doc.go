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
// A cluster's informers (Informers) are shared by the sources of its
// namespace parts that one process leads: they start with the first
// source and stop after the last. Source.Run returns after its own
// handlers, and the informers it was the last to use, have stopped. The
// mesh's MeshConfig and the root certificates' ConfigMaps have watches of
// their own (meshconfig.go, rootcert.go).
package kube
