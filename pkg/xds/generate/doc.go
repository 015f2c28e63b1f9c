// Package generate turns the normalized mesh into Envoy resources: pure
// functions from model values to xDS messages, one file per xDS type, with
// no I/O and no state, so that each can be tested with plain values.
//
// Two kinds of proxy are served. Envoy sidecars get an outbound listener per
// HTTP port ("0.0.0.0_<port>") whose route configuration is named after the
// port, as in Istio. Proxyless gRPC clients dial xds:///<host>:<port> and get
// an API listener and a route configuration named "<host>:<port>". Both get
// clusters named outbound|<port>|<subset>|<host> (EDS over ADS) and share the
// ClusterLoadAssignments.
package generate
