package istio

import (
	"fmt"
	"strconv"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// unsupported reports a field that Istio has and shardpilot does not act on
// yet: the resource is rejected, never applied without it.
func (n *normalizer) unsupported(in Input, field, why string) {
	n.problem(in, field, "not supported yet (%s); the resource is not applied", why)
}

func selectorOf(s *matchSelector) map[string]string {
	if s == nil {
		return nil
	}
	return s.MatchLabels
}

func (n *normalizer) authorizationPolicy(in Input, spec *authorizationPolicy) {
	switch {
	case len(spec.TargetRef) > 0, len(spec.TargetRefs) > 0:
		n.unsupported(in, "spec.targetRef", "policies attached to gateways and waypoints")
		return
	case len(spec.Provider) > 0 && !strings.EqualFold(spec.Action, "CUSTOM"):
		n.problem(in, "spec.provider", "a provider is for CUSTOM policies only")
		return
	}
	p := &meshv1.AuthorizationPolicy{Origin: n.origin(in), Selector: selectorOf(spec.Selector)}
	audit := false
	switch strings.ToUpper(spec.Action) {
	case "", "ALLOW":
		p.Action = meshv1.AuthorizationPolicy_ACTION_ALLOW
	case "DENY":
		p.Action = meshv1.AuthorizationPolicy_ACTION_DENY
	case "CUSTOM":
		// What an external authorizer would decide is not known: what its
		// rules select is refused (failing closed), not let through.
		n.warn(in, "spec.action", "CUSTOM (external authorization) is not supported yet: the requests its rules select are denied")
		p.Action = meshv1.AuthorizationPolicy_ACTION_DENY
	case "AUDIT":
		// Its rules go in a field of their own (see meshv1's audit): a
		// DENY policy without rules denies nothing to a pusher that does
		// not know it.
		p.Action = meshv1.AuthorizationPolicy_ACTION_DENY
		audit = true
	default:
		n.problem(in, "spec.action", "%q is not ALLOW or DENY", spec.Action)
		return
	}
	for i, r := range spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		rule := &meshv1.AuthorizationRule{}
		var ok bool
		if rule.From, ok = n.authorizationSources(in, f, r, p.Action, audit); !ok {
			return
		}
		if rule.To, ok = n.authorizationOperations(in, f, r); !ok {
			return
		}
		for _, c := range r.When {
			rule.When = append(rule.When, &meshv1.AuthorizationCondition{Key: c.Key, Values: c.Values, NotValues: c.NotValues})
		}
		if audit {
			p.Audit = append(p.Audit, rule)
		} else {
			p.Rules = append(p.Rules, rule)
		}
	}
	n.emit(in, p)
}

// authorizationSources converts a rule's sources. It reports false,
// having said why, when the policy is refused.
func (n *normalizer) authorizationSources(in Input, f string, r authorizationRule, action meshv1.AuthorizationPolicy_Action, audit bool) ([]*meshv1.AuthorizationSource, bool) {
	var out []*meshv1.AuthorizationSource
	for j, from := range r.From {
		src := from.Source
		sf := fmt.Sprintf("%s.from[%d].source", f, j)
		if src == nil {
			n.problem(in, sf, "a source is required")
			return nil, false
		}
		// A field not checked yet fails closed (the generator leaves the
		// source out of an ALLOW rule and ignores the field in a DENY
		// rule) and is reported; the rest of the policy applies.
		var unchecked []string
		if len(src.RemoteIPBlocks) > 0 || len(src.NotRemoteIPBlocks) > 0 {
			unchecked = append(unchecked, "remoteIpBlocks")
		}
		if len(src.ServiceAccounts) > 0 || len(src.NotServiceAccounts) > 0 {
			unchecked = append(unchecked, "serviceAccounts")
		}
		for _, u := range unchecked {
			n.warn(in, sf+"."+u, "not checked yet (%s); %s", map[string]string{
				"remoteIpBlocks": "addresses from X-Forwarded-For", "serviceAccounts": "use principals"}[u], failClosed(action, audit))
		}
		out = append(out, &meshv1.AuthorizationSource{
			Principals: src.Principals, NotPrincipals: src.NotPrincipals,
			Namespaces: src.Namespaces, NotNamespaces: src.NotNamespaces,
			IpBlocks: src.IPBlocks, NotIpBlocks: src.NotIPBlocks,
			RequestPrincipals: src.RequestPrincipals, NotRequestPrincipals: src.NotRequestPrincipals,
			Unchecked: unchecked,
		})
	}
	return out, true
}

// authorizationOperations converts a rule's operations. It reports
// false, having said why, when the policy is refused.
func (n *normalizer) authorizationOperations(in Input, f string, r authorizationRule) ([]*meshv1.AuthorizationOperation, bool) {
	var out []*meshv1.AuthorizationOperation
	for j, to := range r.To {
		op := to.Operation
		of := fmt.Sprintf("%s.to[%d].operation", f, j)
		if op == nil {
			n.problem(in, of, "an operation is required")
			return nil, false
		}
		ports, ok := n.ports(in, of+".ports", op.Ports)
		if !ok {
			return nil, false
		}
		notPorts, ok := n.ports(in, of+".notPorts", op.NotPorts)
		if !ok {
			return nil, false
		}
		out = append(out, &meshv1.AuthorizationOperation{
			Hosts: op.Hosts, NotHosts: op.NotHosts, Ports: ports, NotPorts: notPorts,
			Methods: op.Methods, NotMethods: op.NotMethods, Paths: op.Paths, NotPaths: op.NotPaths,
		})
	}
	return out, true
}

// failClosed says what a field not checked does to its rule (of an AUDIT
// policy with audit).
func failClosed(a meshv1.AuthorizationPolicy_Action, audit bool) string {
	if audit {
		return "this AUDIT rule audits regardless of it"
	}
	if a == meshv1.AuthorizationPolicy_ACTION_DENY {
		return "this DENY rule denies regardless of it (failing closed)"
	}
	return "this source of the ALLOW rule allows nothing (failing closed)"
}

// ports reads Istio's port strings.
func (n *normalizer) ports(in Input, field string, list []string) ([]uint32, bool) {
	var out []uint32
	for i, s := range list {
		v, err := strconv.ParseUint(s, 10, 16)
		if err != nil || v == 0 {
			n.problem(in, fmt.Sprintf("%s[%d]", field, i), "%q is not a port number", s)
			return nil, false
		}
		out = append(out, uint32(v))
	}
	return out, true
}

var mtlsModes = map[string]meshv1.MTLSMode{
	"": meshv1.MTLSMode_MTLS_MODE_UNSET, "UNSET": meshv1.MTLSMode_MTLS_MODE_UNSET,
	"PERMISSIVE": meshv1.MTLSMode_MTLS_MODE_PERMISSIVE, "STRICT": meshv1.MTLSMode_MTLS_MODE_STRICT,
	"DISABLE": meshv1.MTLSMode_MTLS_MODE_DISABLE,
}

func (n *normalizer) peerAuthentication(in Input, spec *peerAuthentication) {
	p := &meshv1.PeerAuthentication{Origin: n.origin(in), Selector: selectorOf(spec.Selector)}
	if spec.Mtls != nil {
		mode, ok := mtlsModes[strings.ToUpper(spec.Mtls.Mode)]
		if !ok {
			n.problem(in, "spec.mtls.mode", "%q is not UNSET, PERMISSIVE, STRICT or DISABLE", spec.Mtls.Mode)
			return
		}
		p.Mode = mode
	}
	for port, m := range spec.PortLevelMtls {
		f := "spec.portLevelMtls[" + port + "]"
		v, err := strconv.ParseUint(port, 10, 16)
		if err != nil || v == 0 {
			n.problem(in, f, "%q is not a port number", port)
			return
		}
		if m == nil {
			n.problem(in, f, "a mode is required")
			return
		}
		mode, ok := mtlsModes[strings.ToUpper(m.Mode)]
		if !ok {
			n.problem(in, f+".mode", "%q is not UNSET, PERMISSIVE, STRICT or DISABLE", m.Mode)
			return
		}
		if p.PortModes == nil {
			p.PortModes = map[uint32]meshv1.MTLSMode{}
		}
		p.PortModes[uint32(v)] = mode
	}
	n.emit(in, p)
}

func (n *normalizer) requestAuthentication(in Input, spec *requestAuthentication) {
	if len(spec.TargetRef) > 0 || len(spec.TargetRefs) > 0 {
		n.unsupported(in, "spec.targetRef", "policies attached to gateways and waypoints")
		return
	}
	r := &meshv1.RequestAuthentication{Origin: n.origin(in), Selector: selectorOf(spec.Selector)}
	for i, j := range spec.JwtRules {
		f := fmt.Sprintf("spec.jwtRules[%d]", i)
		switch {
		case len(j.FromCookies) > 0:
			n.unsupported(in, f+".fromCookies", "tokens in cookies")
			return
		case len(j.OutputClaimToHeaders) > 0:
			n.unsupported(in, f+".outputClaimToHeaders", "claims copied to headers")
			return
		case len(j.Timeout) > 0:
			n.unsupported(in, f+".timeout", "a JWKS fetch timeout")
			return
		}
		rule := &meshv1.JWTRule{Issuer: j.Issuer, Audiences: j.Audiences, JwksUri: j.JwksURI, Jwks: j.Jwks, FromParams: j.FromParams,
			OutputPayloadToHeader: j.OutputPayloadToHeader, ForwardOriginalToken: j.ForwardOriginalToken}
		for _, h := range j.FromHeaders {
			rule.FromHeaders = append(rule.FromHeaders, &meshv1.JWTHeader{Name: h.Name, Prefix: h.Prefix})
		}
		r.JwtRules = append(r.JwtRules, rule)
	}
	n.emit(in, r)
}
