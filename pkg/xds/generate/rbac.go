package generate

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rbacconfig "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	rbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// rbacOptions say what a proxy can check: a JWT's claims (jwt: an Envoy
// with a JWT filter), and whether the traffic is HTTP at all (tcp: no
// paths, methods, hosts or headers).
type rbacOptions struct {
	jwt, tcp bool
}

// RBACFilters returns the RBAC HTTP filters of a class's
// AuthorizationPolicies for a proxyless gRPC server (no JWT), as Istio
// evaluates them: a request matching a DENY rule is denied; then, when
// any ALLOW policy applies, a request matching none of their rules is
// denied. No policy: no filter.
//
// AUDIT policies are left out: grpc-go ignores Envoy's LOG action (gRFC
// A41).
func RBACFilters(sec Security) []*hcm.HttpFilter {
	_, deny, allow, anyAllow := rbacPolicies(sec, rbacOptions{})
	var out []*hcm.HttpFilter
	if len(deny) > 0 {
		// grpc-go refuses a listener whose HTTP filters share a name (the
		// DENY and ALLOW filters of one workload did): the DENY filter has
		// a name of its own, the one istiod gives it for gRPC.
		f := rbacFilter(rbacconfig.RBAC_DENY, deny)
		f.Name = "envoy.filters.http.rbac.DENY"
		out = append(out, f)
	}
	if anyAllow {
		out = append(out, rbacFilter(rbacconfig.RBAC_ALLOW, allow))
	}
	return out
}

// rbacPolicies translates the AuthorizationPolicies of a class into the
// policies of an AUDIT (Envoy's LOG), a DENY and an ALLOW RBAC filter, and
// says whether any ALLOW policy applies (an ALLOW filter is needed even
// with no rule: it denies everything). An AUDIT rule is translated as a
// DENY rule is: what it cannot check widens it, as istiod widens it.
func rbacPolicies(sec Security, opts rbacOptions) (audit, deny, allow map[string]*rbacconfig.Policy, anyAllow bool) {
	audit, deny, allow = map[string]*rbacconfig.Policy{}, map[string]*rbacconfig.Policy{}, map[string]*rbacconfig.Policy{}
	for _, p := range sec {
		ap, ok := p.Spec.(*meshv1.AuthorizationPolicy)
		if !ok {
			continue
		}
		for i, r := range ap.Audit {
			if policy, ok := rbacPolicy(r, true, opts); ok {
				audit[fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", p.Namespace, p.Name, i)] = policy
			}
		}
		if len(ap.Audit) > 0 {
			continue // its action and rules are for pushers that do not know audit
		}
		isDeny := ap.Action == meshv1.AuthorizationPolicy_ACTION_DENY
		anyAllow = anyAllow || !isDeny
		for i, r := range ap.Rules {
			policy, ok := rbacPolicy(r, isDeny, opts)
			if !ok {
				continue
			}
			name := fmt.Sprintf("ns[%s]-policy[%s]-rule[%d]", p.Namespace, p.Name, i)
			if isDeny {
				deny[name] = policy
			} else {
				allow[name] = policy
			}
		}
	}
	return audit, deny, allow, anyAllow
}

func rbacFilter(action rbacconfig.RBAC_Action, policies map[string]*rbacconfig.Policy) *hcm.HttpFilter {
	return &hcm.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcm.HttpFilter_TypedConfig{
		TypedConfig: mustAny(&rbac.RBAC{Rules: &rbacconfig.RBAC{Action: action, Policies: policies}})}}
}

// rbacPolicy translates one rule into istiod's shape: a permission for
// each operation of "to" and a principal for each source of "from", each
// the conjunction of its fields (hosts, methods, paths, ports; principals,
// request principals, namespaces, addresses) and the rule's "when"
// conditions, each field any of its values and none of its "not" values.
// What the proxy cannot check (a JWT's principal or claims without a JWT
// filter; paths, methods, hosts and headers of TCP traffic) fails closed:
// an ALLOW rule's source or operation naming it matches nothing (ok false
// when none is left), a DENY rule matches regardless of it.
func rbacPolicy(r *meshv1.AuthorizationRule, isDeny bool, opts rbacOptions) (*rbacconfig.Policy, bool) {
	var whenIDs []*rbacconfig.Principal
	var whenPerms []*rbacconfig.Permission
	for _, c := range r.When {
		switch {
		case c.Key == "destination.port":
			permissionField(&whenPerms, c.Values, false, portPermission)
			permissionField(&whenPerms, c.NotValues, true, portPermission)
		case strings.HasPrefix(c.Key, "request.auth."):
			ids, checked := claimCondition(c, opts)
			if !checked {
				if !isDeny {
					return nil, false
				}
				continue
			}
			whenIDs = append(whenIDs, ids...)
		case strings.HasPrefix(c.Key, "request.headers[") && opts.tcp:
			if !isDeny {
				return nil, false
			}
		default:
			whenIDs = append(whenIDs, conditionPrincipals(c)...)
		}
	}
	p := &rbacconfig.Policy{}
	for _, op := range r.To {
		perms, checked := operationPermissions(op, opts)
		if !checked && !isDeny {
			continue // this operation can never be proven
		}
		p.Permissions = append(p.Permissions, andPermissions(append(perms, whenPerms...)))
	}
	if len(r.To) == 0 {
		p.Permissions = []*rbacconfig.Permission{andPermissions(whenPerms)}
	}
	for _, src := range r.From {
		ids, checked := sourcePrincipals(src, opts)
		if !checked && !isDeny {
			continue // this source can never be proven
		}
		p.Principals = append(p.Principals, andIDs(append(ids, whenIDs...)))
	}
	if len(r.From) == 0 {
		p.Principals = []*rbacconfig.Principal{andIDs(whenIDs)}
	}
	if len(p.Permissions) == 0 || len(p.Principals) == 0 {
		return nil, false
	}
	return p, true
}

var anyID = &rbacconfig.Principal{Identifier: &rbacconfig.Principal_Any{Any: true}}

var anyPermission = &rbacconfig.Permission{Rule: &rbacconfig.Permission_Any{Any: true}}

// andIDs is the conjunction of ids, any principal for none.
func andIDs(ids []*rbacconfig.Principal) *rbacconfig.Principal {
	if len(ids) == 0 {
		ids = []*rbacconfig.Principal{anyID}
	}
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_AndIds{AndIds: &rbacconfig.Principal_Set{Ids: ids}}}
}

func orIDs(ids []*rbacconfig.Principal) *rbacconfig.Principal {
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_OrIds{OrIds: &rbacconfig.Principal_Set{Ids: ids}}}
}

func notID(id *rbacconfig.Principal) *rbacconfig.Principal {
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_NotId{NotId: id}}
}

// andPermissions is the conjunction of ps, any permission for none.
func andPermissions(ps []*rbacconfig.Permission) *rbacconfig.Permission {
	if len(ps) == 0 {
		ps = []*rbacconfig.Permission{anyPermission}
	}
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_AndRules{AndRules: &rbacconfig.Permission_Set{Rules: ps}}}
}

func orPermissions(ps []*rbacconfig.Permission) *rbacconfig.Permission {
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_OrRules{OrRules: &rbacconfig.Permission_Set{Rules: ps}}}
}

func notPermission(p *rbacconfig.Permission) *rbacconfig.Permission {
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_NotRule{NotRule: p}}
}

// stringMatch is Istio's string match: exact, "*" for any value, a prefix
// ("abc*") or a suffix ("*abc").
func stringMatch(v string, ignoreCase bool) *matcher.StringMatcher {
	switch {
	case v == "*":
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: ".+"}}}
	case strings.HasSuffix(v, "*"):
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Prefix{Prefix: strings.TrimSuffix(v, "*")}, IgnoreCase: ignoreCase}
	case strings.HasPrefix(v, "*"):
		return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Suffix{Suffix: strings.TrimPrefix(v, "*")}, IgnoreCase: ignoreCase}
	}
	return &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: v}, IgnoreCase: ignoreCase}
}

// principalName matches the SPIFFE ID of the peer's certificate.
func principalName(m *matcher.StringMatcher) *rbacconfig.Principal {
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_Authenticated_{Authenticated: &rbacconfig.Principal_Authenticated{PrincipalName: m}}}
}

func principalMatch(v string) *rbacconfig.Principal {
	if v == "*" {
		return principalName(stringMatch("*", false))
	}
	// Istio's principals leave out "spiffe://".
	if strings.HasPrefix(v, "*") {
		return principalName(stringMatch(v, false))
	}
	return principalName(stringMatch("spiffe://"+v, false))
}

func namespaceMatch(ns string) *rbacconfig.Principal {
	return principalName(&matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_SafeRegex{
		SafeRegex: &matcher.RegexMatcher{Regex: ".*/ns/" + regexp.QuoteMeta(ns) + "/.*"}}})
}

func ipMatch(v string) *rbacconfig.Principal {
	prefix, err := netip.ParsePrefix(v)
	if err != nil {
		addr, _ := netip.ParseAddr(v)
		prefix = netip.PrefixFrom(addr, addr.BitLen())
	}
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_DirectRemoteIp{DirectRemoteIp: &core.CidrRange{
		AddressPrefix: prefix.Addr().String(), PrefixLen: wrapperspb.UInt32(uint32(prefix.Bits()))}}}
}

func headerID(name string, m *matcher.StringMatcher) *rbacconfig.Principal {
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_Header{Header: &route.HeaderMatcher{
		Name: name, HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: m}}}}
}

// field adds the match of one list of a source: any of its values.
func field(ids *[]*rbacconfig.Principal, values []string, not bool, match func(string) *rbacconfig.Principal) {
	if len(values) == 0 {
		return
	}
	var alts []*rbacconfig.Principal
	for _, v := range values {
		alts = append(alts, match(v))
	}
	id := orIDs(alts)
	if not {
		id = notID(id)
	}
	*ids = append(*ids, id)
}

// sourcePrincipals translates a source into the principals all of which a
// peer must match, in istiod's order; checked is false when it names what
// the proxy cannot check (request principals without a JWT filter).
func sourcePrincipals(src *meshv1.AuthorizationSource, opts rbacOptions) (ids []*rbacconfig.Principal, checked bool) {
	field(&ids, src.Principals, false, principalMatch)
	field(&ids, src.NotPrincipals, true, principalMatch)
	checked = len(src.Unchecked) == 0
	if len(src.RequestPrincipals) > 0 || len(src.NotRequestPrincipals) > 0 {
		if opts.jwt && !opts.tcp && requestPrincipalsSupported(src.RequestPrincipals) && requestPrincipalsSupported(src.NotRequestPrincipals) {
			field(&ids, src.RequestPrincipals, false, requestPrincipal)
			field(&ids, src.NotRequestPrincipals, true, requestPrincipal)
		} else {
			checked = false
		}
	}
	field(&ids, src.Namespaces, false, namespaceMatch)
	field(&ids, src.NotNamespaces, true, namespaceMatch)
	field(&ids, src.IpBlocks, false, ipMatch)
	field(&ids, src.NotIpBlocks, true, ipMatch)
	return ids, checked
}

func permissionField(perms *[]*rbacconfig.Permission, values []string, not bool, match func(string) *rbacconfig.Permission) {
	if len(values) == 0 {
		return
	}
	var alts []*rbacconfig.Permission
	for _, v := range values {
		alts = append(alts, match(v))
	}
	p := orPermissions(alts)
	if not {
		p = notPermission(p)
	}
	*perms = append(*perms, p)
}

func headerPermission(name string, m *matcher.StringMatcher) *rbacconfig.Permission {
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_Header{Header: &route.HeaderMatcher{
		Name: name, HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: m}}}}
}

// operationPermissions translates an operation into the permissions all
// of which a request must match, in istiod's order; checked is false for
// a TCP port when it names HTTP fields (paths, methods, hosts), which are
// then left out.
func operationPermissions(op *meshv1.AuthorizationOperation, opts rbacOptions) (perms []*rbacconfig.Permission, checked bool) {
	checked = true
	if opts.tcp {
		checked = len(op.Paths)+len(op.NotPaths)+len(op.Methods)+len(op.NotMethods)+len(op.Hosts)+len(op.NotHosts) == 0
	} else {
		path := func(v string) *rbacconfig.Permission {
			return &rbacconfig.Permission{Rule: &rbacconfig.Permission_UrlPath{UrlPath: &matcher.PathMatcher{
				Rule: &matcher.PathMatcher_Path{Path: stringMatch(v, false)}}}}
		}
		method := func(v string) *rbacconfig.Permission { return headerPermission(":method", stringMatch(v, false)) }
		host := func(v string) *rbacconfig.Permission { return headerPermission(":authority", stringMatch(v, true)) }
		permissionField(&perms, op.Hosts, false, host)
		permissionField(&perms, op.NotHosts, true, host)
		permissionField(&perms, op.Methods, false, method)
		permissionField(&perms, op.NotMethods, true, method)
		permissionField(&perms, op.Paths, false, path)
		permissionField(&perms, op.NotPaths, true, path)
	}
	permissionField(&perms, portStrings(op.Ports), false, portPermission)
	permissionField(&perms, portStrings(op.NotPorts), true, portPermission)
	return perms, checked
}

func portPermission(v string) *rbacconfig.Permission {
	n, _ := strconv.ParseUint(v, 10, 32)
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_DestinationPort{DestinationPort: uint32(n)}}
}

func portStrings(ports []uint32) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = strconv.FormatUint(uint64(p), 10)
	}
	return out
}

// conditionPrincipals translates a "when" condition on the source or the
// request's headers into principals all of which must match.
func conditionPrincipals(c *meshv1.AuthorizationCondition) []*rbacconfig.Principal {
	var match func(string) *rbacconfig.Principal
	switch c.Key {
	case "source.ip":
		match = ipMatch
	case "source.namespace":
		match = namespaceMatch
	case "source.principal":
		match = principalMatch
	default: // request.headers[<name>]
		name := strings.TrimSuffix(strings.TrimPrefix(c.Key, "request.headers["), "]")
		match = func(v string) *rbacconfig.Principal { return headerID(strings.ToLower(name), stringMatch(v, false)) }
	}
	var ids []*rbacconfig.Principal
	field(&ids, c.Values, false, match)
	field(&ids, c.NotValues, true, match)
	return ids
}
