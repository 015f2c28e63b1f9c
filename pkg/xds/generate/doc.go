// Package generate turns the normalized mesh into Envoy resources: pure
// functions from model values to xDS messages, with no I/O and no state,
// so that each can be tested with plain values. Files follow what they
// generate (clusters, endpoints, listeners, routes, virtual hosts,
// gateways, inbound; security: policies, rbac.go, jwt.go, and servers.go,
// the proxyless servers' listeners) and the rules they share (defaults.go:
// what istiod sets where the user is silent; mtls.go: Istio's mutual TLS).
//
// Two kinds of proxy are served. Envoy sidecars get an outbound listener per
// HTTP port ("0.0.0.0_<port>") whose route configuration is named after the
// port, as in Istio. Proxyless gRPC clients dial xds:///<host>:<port> and get
// an API listener and a route configuration named "<host>:<port>". Both get
// clusters named outbound|<port>|<subset>|<host> (EDS over ADS) and share the
// ClusterLoadAssignments. For the same input an Envoy gets what istiod
// would send it, unless docs/istio-compatibility.md lists the difference.
package generate
