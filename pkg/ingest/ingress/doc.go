// Package ingress serves Kubernetes Ingresses of Istio's class at the
// mesh's ingress gateway, as istiod does: each Ingress becomes an Istio
// Gateway in the gateway's namespace (HTTP on 80 for every host, HTTPS on
// 443 for each TLS entry with a secret), and the rules of each host, of
// every Ingress, one VirtualService bound to it. Translate returns them as
// Istio resources, which the Istio normalizer then checks and normalizes
// like any other; their location is the Ingress they come from.
package ingress
