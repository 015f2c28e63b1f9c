// Package istio reads the Istio resources users write today
// (networking.istio.io v1, v1beta1 and v1alpha3: ServiceEntry,
// WorkloadEntry, WorkloadGroup, VirtualService, DestinationRule, Sidecar,
// Gateway, EnvoyFilter; security.istio.io: PeerAuthentication,
// AuthorizationPolicy, RequestAuthentication; telemetry.istio.io:
// Telemetry; and the mesh's MeshConfig, from the ConfigMap istio) and
// normalizes them into model objects, a file per kind. Every source of
// these resources — the YAML directory, Kubernetes — goes through this one
// normalizer, so the same resource gives the same objects wherever it came
// from.
//
// A field Istio does not define (misspelled, or a newer Istio's) is a
// warning naming it, and the rest of the resource applies, as istiod
// applies what it knows; in a security policy or an EnvoyFilter it is an
// error and the resource is refused, since a field not understood could
// widen what it allows or patches. A field Istio has that has no effect
// here is a warning naming it (FieldTable lists every field and what it
// does). The package does no I/O and holds no state.
package istio
