package gatewayapi

import (
	"fmt"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// grpcRules translates a GRPCRoute's rules: a method match is a match
// on the request's path, "/<service>/<method>".
func (t *translator) grpcRules(r *gwv1.GRPCRoute, refs *refs) *rules {
	rs := &rules{}
	for i, rule := range r.Spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		h := &meshv1.HTTPRoute{Name: ruleName(r.Namespace, r.Name, rule.Name, i)}
		for _, m := range rule.Matches {
			hm := &meshv1.HTTPMatch{Uri: grpcMethod(m.Method)}
			for _, hd := range m.Headers {
				regex := hd.Type != nil && *hd.Type == gwv1.GRPCHeaderMatchRegularExpression
				hm.Headers = put(hm.Headers, strings.ToLower(string(hd.Name)), hd.Value, regex)
			}
			h.Match = append(h.Match, hm)
		}
		for j, fl := range rule.Filters {
			switch fl.Type {
			case gwv1.GRPCRouteFilterRequestHeaderModifier:
				h.Headers = withHeaders(h.Headers, fl.RequestHeaderModifier, true)
			case gwv1.GRPCRouteFilterResponseHeaderModifier:
				h.Headers = withHeaders(h.Headers, fl.ResponseHeaderModifier, false)
			case gwv1.GRPCRouteFilterRequestMirror:
				t.mirror(h, fl.RequestMirror, KindGRPCRoute, r.Namespace, refs, rs, fmt.Sprintf("%s.filters[%d]", f, j))
			default:
				rs.refuse("%s.filters[%d]: filter type %s is not supported", f, j, fl.Type)
			}
		}
		if rule.SessionPersistence != nil {
			rs.refuse("%s.sessionPersistence: session persistence is not supported", f)
		}
		backends := make([]backend, len(rule.BackendRefs))
		for j, b := range rule.BackendRefs {
			backends[j] = backend{ref: b.BackendRef, field: fmt.Sprintf("%s.backendRefs[%d]", f, j)}
			for _, bf := range b.Filters {
				backends[j].filters = append(backends[j].filters, gwv1.HTTPRouteFilter{Type: gwv1.HTTPRouteFilterType(bf.Type),
					RequestHeaderModifier: bf.RequestHeaderModifier, ResponseHeaderModifier: bf.ResponseHeaderModifier})
			}
		}
		t.destinations(h, KindGRPCRoute, r.Namespace, backends, refs, rs)
		rs.http = append(rs.http, h)
	}
	return rs
}

// grpcMethod is a method match as a path match (nil: every method).
func grpcMethod(m *gwv1.GRPCMethodMatch) *meshv1.StringMatch {
	if m == nil || (m.Service == nil && m.Method == nil) {
		return nil
	}
	regex := m.Type != nil && *m.Type == gwv1.GRPCMethodMatchRegularExpression
	service, method := ptrOr(m.Service, ""), ptrOr(m.Method, "")
	switch {
	case m.Method == nil && !regex:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/" + service + "/"}}
	case m.Method == nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "/" + service + "/.+"}}
	case m.Service == nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "/[^/]+/" + method}}
	case !regex:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: "/" + service + "/" + method}}
	}
	return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "/" + service + "/" + method}}
}
