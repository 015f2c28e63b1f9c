// Package nodemeta reads what an Envoy node says of itself in Istio's
// terms (its node id and metadata). It is a leaf: what identifies a
// proxy's stream needs it without the generators behind classify.
package nodemeta

import (
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Namespace reads a node's namespace from Istio's NAMESPACE metadata, else
// from an Istio node id ("sidecar~10.1.2.3~pod.ns~ns.svc.cluster.local").
func Namespace(node *core.Node) string {
	if ns := node.GetMetadata().GetFields()["NAMESPACE"].GetStringValue(); ns != "" {
		return ns
	}
	parts := strings.Split(node.GetId(), "~")
	if len(parts) == 4 {
		ns, _, _ := strings.Cut(parts[3], ".")
		return ns
	}
	return ""
}
