package pusher

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// A class groups the proxies that see the same mesh, so that their
// resources are generated once and shared. A class is named
// "<kind>" when what a proxy sees does not depend on where it runs, and
// "<kind>/<namespace>/<sidecar>" when its namespace (exportTo) or a
// Sidecar resource limits its view ("<kind>/<namespace>/" without a
// Sidecar).

// scopeEntry is one Sidecar.
type scopeEntry struct {
	namespace, name string
	scope           *meshv1.Scope
}

// classIndex is what classifying a proxy reads; a generation replaces it whole.
type classIndex struct {
	// scopes by namespace, those with a workload selector first.
	scopes map[string][]scopeEntry
	// restricted says some service limits who may see it (exportTo).
	restricted bool
}

func newClassIndex(scopes []scopeEntry, restricted bool) *classIndex {
	ix := &classIndex{scopes: map[string][]scopeEntry{}, restricted: restricted}
	for _, s := range scopes {
		ix.scopes[s.namespace] = append(ix.scopes[s.namespace], s)
	}
	for _, list := range ix.scopes {
		// Sidecars with more selector labels first (the namespace default,
		// with none, last), then by name.
		slices.SortFunc(list, func(a, b scopeEntry) int {
			return cmp.Or(cmp.Compare(len(b.scope.WorkloadSelector), len(a.scope.WorkloadSelector)), cmp.Compare(a.name, b.name))
		})
	}
	return ix
}

// scope returns the Sidecar that applies to a workload: the first whose
// selector matches its labels, else the namespace's default (no selector).
func (ix *classIndex) scope(namespace string, labels map[string]string) *scopeEntry {
	for i, s := range ix.scopes[namespace] {
		if len(s.scope.WorkloadSelector) == 0 || model.Selects(s.scope.WorkloadSelector, labels) {
			return &ix.scopes[namespace][i]
		}
	}
	return nil
}

// sameClasses reports whether every proxy keeps its class from one
// generation to the next: the same Sidecars (by name and selector), the
// same exportTo restriction and the same Gateway selectors.
func (ix *classIndex) sameClasses(next *classIndex, before, after *generate.Mesh) bool {
	if ix.restricted != next.restricted || len(ix.scopes) != len(next.scopes) {
		return false
	}
	for ns, list := range ix.scopes {
		other := next.scopes[ns]
		if len(other) != len(list) {
			return false
		}
		for i := range list {
			if list[i].name != other[i].name || !maps.Equal(list[i].scope.WorkloadSelector, other[i].scope.WorkloadSelector) {
				return false
			}
		}
	}
	if before == nil || after == nil || len(before.Gateways) != len(after.Gateways) {
		return before == after
	}
	for i, g := range before.Gateways {
		if g.Key() != after.Gateways[i].Key() || !maps.Equal(g.Spec.Selector, after.Gateways[i].Spec.Selector) {
			return false
		}
	}
	return true
}

func (ix *classIndex) find(namespace, name string) *scopeEntry {
	for i, s := range ix.scopes[namespace] {
		if s.name == name {
			return &ix.scopes[namespace][i]
		}
	}
	return nil
}

// proxyKind tells proxyless gRPC clients (Istio's GENERATOR=grpc metadata,
// or grpc-go's user agent) from Envoy.
func proxyKind(node *core.Node) generate.Proxy {
	if node.GetMetadata().GetFields()["GENERATOR"].GetStringValue() == "grpc" ||
		strings.HasPrefix(node.GetUserAgentName(), "gRPC") {
		return generate.Proxyless
	}
	return generate.Envoy
}

// nodeNamespace reads the namespace from Istio's NAMESPACE metadata, else
// from an Istio node id ("sidecar~10.1.2.3~pod.ns~ns.svc.cluster.local").
func nodeNamespace(node *core.Node) string {
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

// nodeLabels reads Istio's LABELS metadata.
func nodeLabels(node *core.Node) map[string]string {
	out := map[string]string{}
	for k, v := range node.GetMetadata().GetFields()["LABELS"].GetStructValue().GetFields() {
		out[k] = v.GetStringValue()
	}
	return out
}

// routerKind names the class of gateway proxies ("router~..." node ids);
// their class is "router/<gateway>,<gateway>...", the gateways that select them.
const routerKind = "router"

// Classify returns the class of a proxy.
func (p *Pusher) Classify(node *core.Node) string {
	if strings.HasPrefix(node.GetId(), routerKind+"~") {
		var keys []string
		if m := p.last.Load(); m != nil {
			labels := nodeLabels(node)
			for _, g := range m.Gateways {
				if len(g.Spec.Selector) > 0 && model.Selects(g.Spec.Selector, labels) {
					keys = append(keys, g.Key())
				}
			}
		}
		return routerKind + "/" + strings.Join(keys, ",")
	}
	kind := proxyKind(node).String()
	ix := p.index.Load()
	ns := nodeNamespace(node)
	if ix == nil || ns == "" {
		return kind
	}
	if s := ix.scope(ns, nodeLabels(node)); s != nil {
		return kind + "/" + ns + "/" + s.name
	}
	if ix.restricted {
		return kind + "/" + ns + "/"
	}
	return kind
}

// view returns the proxy kind and view of a class.
func (p *Pusher) view(class string) (generate.Proxy, generate.View) {
	parts := strings.SplitN(class, "/", 3)
	kind := generate.Envoy
	if parts[0] == generate.Proxyless.String() {
		kind = generate.Proxyless
	}
	if len(parts) < 3 {
		return kind, generate.View{}
	}
	v := generate.View{Namespace: parts[1]}
	if ix := p.index.Load(); ix != nil && parts[2] != "" {
		if s := ix.find(parts[1], parts[2]); s != nil {
			for _, e := range s.scope.Egress {
				v.Egress = append(v.Egress, e.Hosts...)
			}
		}
	}
	return kind, v
}
