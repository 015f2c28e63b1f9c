package gatewayapi

import (
	"fmt"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1a2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
)

func (t *translator) tlsRoute(r *gwv1.TLSRoute) {
	if r.Spec.UseDefaultGateways != "" {
		t.warn(KindTLSRoute, r.Namespace, r.Name, "spec.useDefaultGateways", "default Gateways are not read")
	}
	refs := newRefs(r.Generation)
	rs := &rules{}
	for i, rule := range r.Spec.Rules {
		rs.l4 = append(rs.l4, t.l4Rule(KindTLSRoute, r.Namespace, fmt.Sprintf("spec.rules[%d]", i), rule.BackendRefs, refs))
	}
	t.route(&route{kind: KindTLSRoute, obj: r, parents: r.Spec.ParentRefs, hostnames: r.Spec.Hostnames, rules: rs, refs: refs})
}

func (t *translator) tcpRoute(r *gwv1a2.TCPRoute) {
	if r.Spec.UseDefaultGateways != "" {
		t.warn(KindTCPRoute, r.Namespace, r.Name, "spec.useDefaultGateways", "default Gateways are not read")
	}
	refs := newRefs(r.Generation)
	rs := &rules{}
	for i, rule := range r.Spec.Rules {
		rs.l4 = append(rs.l4, t.l4Rule(KindTCPRoute, r.Namespace, fmt.Sprintf("spec.rules[%d]", i), rule.BackendRefs, refs))
	}
	t.route(&route{kind: KindTCPRoute, obj: r, parents: r.Spec.ParentRefs, rules: rs, refs: refs})
}

// l4Rule is a TLS or TCP rule's destinations, weighted; a backend that
// does not resolve is left out (a connection cannot be answered 500).
func (t *translator) l4Rule(kind, ns, field string, backends []gwv1.BackendRef, refs *refs) *meshv1.L4Route {
	out := &meshv1.L4Route{}
	for j, b := range backends {
		weight := uint32(1)
		if b.Weight != nil {
			weight = uint32(max(*b.Weight, 0))
		}
		dst := t.backend(refs, kind, ns, fmt.Sprintf("%s.backendRefs[%d]", field, j), b.BackendObjectReference)
		if weight == 0 || dst.Host == invalidHost {
			continue
		}
		out.Route = append(out.Route, &meshv1.RouteDestination{Destination: dst, Weight: weight})
	}
	return out
}
