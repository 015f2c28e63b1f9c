// Package istio reads the Istio resources users write today
// (networking.istio.io v1, v1beta1 and v1alpha3: ServiceEntry,
// WorkloadEntry, VirtualService, DestinationRule, Sidecar, Gateway;
// security.istio.io: PeerAuthentication, AuthorizationPolicy,
// RequestAuthentication; and the mesh's MeshConfig) and normalizes them
// into model objects, a file per kind. Every source of these resources —
// the YAML directory, Kubernetes — goes through this one normalizer, so
// the same resource gives the same objects wherever it came from.
//
// Decoding is strict: a field Istio does not define is an error naming the
// field. The package does no I/O and holds no state.
package istio
