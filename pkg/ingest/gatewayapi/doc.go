// Package gatewayapi translates the Kubernetes Gateway API
// (gateway.networking.k8s.io: GatewayClass, Gateway, HTTPRoute, GRPCRoute,
// ReferenceGrant) into the mesh model the Istio kinds normalize to, so
// that one generator serves both, as istiod does: a Gateway's listener is
// a model Gateway with one server, bound to the gateway proxies labelled
// gateway.networking.k8s.io/gateway-name=<name>; a route is a route rule
// bound to the listeners it attaches to, or (GAMMA: a Service as its
// parent) to the sidecars and proxyless clients calling that Service.
//
// Translate is a function of the whole set: a route's attachment depends
// on the Gateways' listeners, the namespaces' labels and the
// ReferenceGrants. Beside the objects it returns the status each resource
// should show, the conditions users read with kubectl.
package gatewayapi
