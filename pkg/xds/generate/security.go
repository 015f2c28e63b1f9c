package generate

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfig "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	jwt "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	rbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Policy is one security policy of a namespace as the generators see it;
// Spec is a *meshv1.AuthorizationPolicy, *meshv1.PeerAuthentication or
// *meshv1.RequestAuthentication.
type Policy struct {
	Namespace, Name string
	Spec            PolicySpec
	Version         string
	// Root says the policy is in the mesh's root namespace: it applies to
	// every namespace (a PeerAuthentication there only without selector,
	// as the mesh's default).
	Root bool
}

// DefaultRootNamespace is Istio's root namespace.
const DefaultRootNamespace = "istio-system"

// PolicySpec is one of the security policy messages.
type PolicySpec interface {
	GetSelector() map[string]string
}

// Tag names a policy by kind ("a:", "p:" or "r:") and name ("~<name>" in
// the root namespace), as class names list the policies that select a
// workload.
func (p *Policy) Tag() string {
	name := p.Name
	if p.Root {
		name = "~" + name
	}
	switch p.Spec.(type) {
	case *meshv1.AuthorizationPolicy:
		return "a:" + name
	case *meshv1.PeerAuthentication:
		return "p:" + name
	}
	return "r:" + name
}

// AppliesTo reports whether a policy may apply to workloads of a
// namespace: its own, or any for a root namespace policy (but a
// PeerAuthentication with a selector there only selects the root's own).
func (p *Policy) AppliesTo(namespace string) bool {
	if p.Namespace == namespace {
		return true
	}
	if !p.Root {
		return false
	}
	_, peer := p.Spec.(*meshv1.PeerAuthentication)
	return !peer || len(p.Spec.GetSelector()) == 0
}

// Security is the policies that apply to one class of proxies, in
// namespace and name order.
type Security []*Policy

// PoliciesFor returns the policies that apply to a class of a namespace:
// those of the namespace and the root namespace without a selector, and
// those whose tags the class lists.
func (m *Mesh) PoliciesFor(namespace string, tags []string) Security {
	if namespace == "" {
		return nil
	}
	var out Security
	for _, p := range m.Policies {
		if !p.AppliesTo(namespace) {
			continue
		}
		if len(p.Spec.GetSelector()) == 0 || slices.Contains(tags, p.Tag()) {
			out = append(out, p)
		}
	}
	return out
}

// MTLSMode is the mode of a port: a selecting PeerAuthentication's port
// mode, then its mode, then the namespace's (no selector), then the root
// namespace's (the mesh's default); the first by name where several
// select.
func (s Security) MTLSMode(port uint32) meshv1.MTLSMode {
	var mesh, ns, selected, selectedPort meshv1.MTLSMode
	for _, p := range s {
		pa, ok := p.Spec.(*meshv1.PeerAuthentication)
		if !ok {
			continue
		}
		switch {
		case len(pa.Selector) > 0:
			selectedPort = cmp.Or(selectedPort, pa.PortModes[port])
			selected = cmp.Or(selected, pa.Mode)
		case p.Root:
			mesh = cmp.Or(mesh, pa.Mode)
		default:
			ns = cmp.Or(ns, pa.Mode)
		}
	}
	return cmp.Or(selectedPort, selected, ns, mesh)
}

// ServerListenerName is the listener a proxyless gRPC server listening on
// addr ("0.0.0.0:50051", "[::]:50051") asks for: grpc-go's default name.
func ServerListenerName(addr string) string {
	return "grpc/server?xds.resource.listening_address=" + addr
}

// IstioServerListenerName is the name a server asks for with the bootstrap
// Istio's agent writes (server_listener_resource_name_template).
func IstioServerListenerName(addr string) string {
	return "xds.istio.io/grpc/lds/inbound/" + addr
}

// servicePorts returns the ports a service's workloads serve gRPC or HTTP
// on: the target ports of its HTTP ports and the ports its endpoints give
// them; none for a service outside the mesh (not static).
func servicePorts(s *Service, into map[uint32]bool) {
	if s.Spec.Resolution != meshv1.Resolution_RESOLUTION_STATIC {
		return
	}
	for _, p := range s.Spec.Ports {
		if !isHTTP(p) {
			continue
		}
		into[cmp.Or(p.TargetPort, p.Number)] = true
		for _, ep := range s.Endpoints {
			if n := ep.Ports[p.Name]; n != 0 {
				into[n] = true
			}
		}
	}
}

// ServicePortsPrint names the ports a service's proxyless servers get
// listeners for, so that a change of its endpoints that changes them
// regenerates those listeners.
func ServicePortsPrint(s *Service) string {
	ports := map[uint32]bool{}
	servicePorts(s, ports)
	var b strings.Builder
	for _, p := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		b.WriteString(strconv.FormatUint(uint64(p), 10) + ",")
	}
	return b.String()
}

// serverPorts returns the ports a namespace's workloads serve on; for
// namespace "", those of every namespace without security policies (whose
// proxies share one class).
func serverPorts(m *Mesh, namespace string) []uint32 {
	secured := map[string]bool{}
	for _, p := range m.Policies {
		secured[p.Namespace] = true
		if p.Root {
			return nil // every namespace has classes of its own
		}
	}
	ports := map[uint32]bool{}
	for _, s := range m.Services {
		if namespace == "" && !secured[s.Namespace] || s.Namespace == namespace {
			servicePorts(s, ports)
		}
	}
	return slices.SortedFunc(maps.Keys(ports), cmp.Compare)
}

// ServerListeners returns the listeners of a class of proxyless gRPC
// servers of a namespace ("": of the namespaces without security
// policies): for every port its workloads serve on, one per
// wildcard address (servers listen on every interface), whose one filter
// chain takes mutual TLS when the port's PeerAuthentication mode is STRICT
// (certificates from the bootstrap's provider "default"; PERMISSIVE is
// plaintext: grpc-go cannot tell TLS from plaintext on one port) and
// applies the class's AuthorizationPolicies as RBAC filters.
func ServerListeners(m *Mesh, namespace string, sec Security) []*listener.Listener {
	filters := append(RBACFilters(sec), &hcm.HttpFilter{
		Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}})
	var out []*listener.Listener
	for _, port := range serverPorts(m, namespace) {
		num := strconv.FormatUint(uint64(port), 10)
		manager := &hcm.HttpConnectionManager{
			StatPrefix: "inbound_" + num,
			RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
				Name: "inbound|" + num,
				VirtualHosts: []*route.VirtualHost{{
					Name:    "inbound|" + num,
					Domains: []string{"*"},
					Routes: []*route.Route{{
						Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
						Action: &route.Route_NonForwardingAction{NonForwardingAction: &route.NonForwardingAction{}},
					}},
				}},
			}},
			HttpFilters: filters,
		}
		chain := &listener.FilterChain{
			Name: "inbound|" + num,
			Filters: []*listener.Filter{{Name: "envoy.filters.network.http_connection_manager",
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(manager)}}},
		}
		if sec.MTLSMode(port) == meshv1.MTLSMode_MTLS_MODE_STRICT {
			chain.TransportSocket = downstreamMutualTLS(Proxyless, false)
		}
		for _, host := range []string{"0.0.0.0", "::"} {
			addr := netip.AddrPortFrom(netip.MustParseAddr(host), uint16(port)).String()
			// By grpc-go's default name and by the one Istio's agent has
			// servers ask for.
			for _, name := range []string{ServerListenerName(addr), IstioServerListenerName(addr)} {
				out = append(out, &listener.Listener{
					Name:         name,
					Address:      socketAddress(host, port),
					FilterChains: []*listener.FilterChain{chain},
				})
			}
		}
	}
	return out
}

// downstreamMutualTLS requires a client certificate of the mesh's root:
// for an Envoy from SDS ("default" and "ROOTCA"), for a proxyless server
// from its bootstrap's certificate provider "default", as Istio's.
func downstreamMutualTLS(proxy Proxy, agent bool) *core.TransportSocket {
	return tlsSocket(&tlsv3.DownstreamTlsContext{CommonTlsContext: meshCertificates(proxy, agent), RequireClientCertificate: wrapperspb.Bool(true)})
}

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
func RBACFilters(sec Security) []*hcm.HttpFilter {
	deny, allow, anyAllow := rbacPolicies(sec, rbacOptions{})
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
// policies of a DENY and an ALLOW RBAC filter, and says whether any ALLOW
// policy applies (an ALLOW filter is needed even with no rule: it denies
// everything).
func rbacPolicies(sec Security, opts rbacOptions) (deny, allow map[string]*rbacconfig.Policy, anyAllow bool) {
	deny, allow = map[string]*rbacconfig.Policy{}, map[string]*rbacconfig.Policy{}
	for _, p := range sec {
		ap, ok := p.Spec.(*meshv1.AuthorizationPolicy)
		if !ok {
			continue
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
	return deny, allow, anyAllow
}

func rbacFilter(action rbacconfig.RBAC_Action, policies map[string]*rbacconfig.Policy) *hcm.HttpFilter {
	return &hcm.HttpFilter{Name: "envoy.filters.http.rbac", ConfigType: &hcm.HttpFilter_TypedConfig{
		TypedConfig: mustAny(&rbac.RBAC{Rules: &rbacconfig.RBAC{Action: action, Policies: policies}})}}
}

// rbacPolicy translates one rule. What the proxy cannot check (a JWT's
// principal or claims without a JWT filter; paths, methods, hosts and
// headers of TCP traffic) fails closed: an ALLOW rule naming it matches
// nothing (ok false: left out), a DENY rule matches regardless of it.
func rbacPolicy(r *meshv1.AuthorizationRule, isDeny bool, opts rbacOptions) (*rbacconfig.Policy, bool) {
	var principals []*rbacconfig.Principal
	var perms []*rbacconfig.Permission
	if len(r.From) > 0 {
		var alts []*rbacconfig.Principal
		for _, src := range r.From {
			id, checked := sourcePrincipal(src, opts)
			if !checked && !isDeny {
				continue // this source can never be proven
			}
			alts = append(alts, id)
		}
		if len(alts) == 0 {
			return nil, false
		}
		principals = append(principals, orIDs(alts))
	}
	if len(r.To) > 0 {
		var alts []*rbacconfig.Permission
		for _, op := range r.To {
			perm, checked := operationPermission(op, opts)
			if !checked && !isDeny {
				continue
			}
			alts = append(alts, perm)
		}
		if len(alts) == 0 {
			return nil, false
		}
		perms = append(perms, orPermissions(alts))
	}
	for _, c := range r.When {
		switch {
		case c.Key == "destination.port":
			perms = append(perms, valuesPermission(c, func(v string) *rbacconfig.Permission {
				n, _ := strconv.ParseUint(v, 10, 32)
				return &rbacconfig.Permission{Rule: &rbacconfig.Permission_DestinationPort{DestinationPort: uint32(n)}}
			}))
		case strings.HasPrefix(c.Key, "request.auth."):
			id, checked := claimCondition(c, opts)
			if !checked {
				if !isDeny {
					return nil, false
				}
				continue
			}
			principals = append(principals, id)
		case strings.HasPrefix(c.Key, "request.headers[") && opts.tcp:
			if !isDeny {
				return nil, false
			}
		default:
			principals = append(principals, conditionPrincipal(c))
		}
	}
	p := &rbacconfig.Policy{
		Permissions: []*rbacconfig.Permission{andPermissions(perms)},
		Principals:  []*rbacconfig.Principal{andIDs(principals)},
	}
	return p, true
}

var anyID = &rbacconfig.Principal{Identifier: &rbacconfig.Principal_Any{Any: true}}
var anyPermission = &rbacconfig.Permission{Rule: &rbacconfig.Permission_Any{Any: true}}

func andIDs(ids []*rbacconfig.Principal) *rbacconfig.Principal {
	switch len(ids) {
	case 0:
		return anyID
	case 1:
		return ids[0]
	}
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_AndIds{AndIds: &rbacconfig.Principal_Set{Ids: ids}}}
}

func orIDs(ids []*rbacconfig.Principal) *rbacconfig.Principal {
	if len(ids) == 1 {
		return ids[0]
	}
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_OrIds{OrIds: &rbacconfig.Principal_Set{Ids: ids}}}
}

func notID(id *rbacconfig.Principal) *rbacconfig.Principal {
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_NotId{NotId: id}}
}

func andPermissions(ps []*rbacconfig.Permission) *rbacconfig.Permission {
	switch len(ps) {
	case 0:
		return anyPermission
	case 1:
		return ps[0]
	}
	return &rbacconfig.Permission{Rule: &rbacconfig.Permission_AndRules{AndRules: &rbacconfig.Permission_Set{Rules: ps}}}
}

func orPermissions(ps []*rbacconfig.Permission) *rbacconfig.Permission {
	if len(ps) == 1 {
		return ps[0]
	}
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

// sourcePrincipal translates a source; checked is false when it names
// request principals the proxy cannot check (they are left out).
func sourcePrincipal(src *meshv1.AuthorizationSource, opts rbacOptions) (id *rbacconfig.Principal, checked bool) {
	var ids []*rbacconfig.Principal
	field(&ids, src.Principals, false, principalMatch)
	field(&ids, src.NotPrincipals, true, principalMatch)
	field(&ids, src.Namespaces, false, namespaceMatch)
	field(&ids, src.NotNamespaces, true, namespaceMatch)
	field(&ids, src.IpBlocks, false, ipMatch)
	field(&ids, src.NotIpBlocks, true, ipMatch)
	checked = len(src.Unchecked) == 0
	if len(src.RequestPrincipals) > 0 || len(src.NotRequestPrincipals) > 0 {
		if opts.jwt && !opts.tcp && requestPrincipalsSupported(src.RequestPrincipals) && requestPrincipalsSupported(src.NotRequestPrincipals) {
			field(&ids, src.RequestPrincipals, false, requestPrincipal)
			field(&ids, src.NotRequestPrincipals, true, requestPrincipal)
		} else {
			checked = false
		}
	}
	return andIDs(ids), checked
}

// The JWT filter puts a validated token's payload in its metadata under
// this key, where the RBAC filter reads the claims.
const jwtPayloadKey = "payload"

// claim matches a claim of the request's validated JWT.
func claim(name string, m *matcher.StringMatcher) *rbacconfig.Principal {
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_Metadata{Metadata: &matcher.MetadataMatcher{
		Filter: "envoy.filters.http.jwt_authn",
		Path:   []*matcher.MetadataMatcher_PathSegment{{Segment: &matcher.MetadataMatcher_PathSegment_Key{Key: jwtPayloadKey}}, {Segment: &matcher.MetadataMatcher_PathSegment_Key{Key: name}}},
		Value:  &matcher.ValueMatcher{MatchPattern: &matcher.ValueMatcher_StringMatch{StringMatch: m}},
	}}}
}

// requestPrincipalsSupported reports whether request principals are of
// the forms checked: "*", "<iss>/<sub>", "<iss>/*" and "*/<sub>".
func requestPrincipalsSupported(values []string) bool {
	for _, v := range values {
		if v == "*" {
			continue
		}
		iss, sub := splitPrincipal(v)
		if iss == "" || sub == "" {
			return false
		}
		for _, part := range []string{iss, sub} {
			if part != "*" && strings.Contains(part, "*") {
				return false
			}
		}
	}
	return true
}

// splitPrincipal splits "<iss>/<sub>" at its last slash (issuers are URLs).
func splitPrincipal(v string) (iss, sub string) {
	i := strings.LastIndex(v, "/")
	if i < 0 {
		return "", ""
	}
	return v[:i], v[i+1:]
}

func requestPrincipal(v string) *rbacconfig.Principal {
	if v == "*" {
		return claim("iss", stringMatch("*", false))
	}
	iss, sub := splitPrincipal(v)
	return andIDs([]*rbacconfig.Principal{claim("iss", stringMatch(iss, false)), claim("sub", stringMatch(sub, false))})
}

// claimCondition translates a "when" on request.auth.*; checked is false
// where the proxy has no JWT filter.
func claimCondition(c *meshv1.AuthorizationCondition, opts rbacOptions) (*rbacconfig.Principal, bool) {
	if !opts.jwt || opts.tcp {
		return nil, false
	}
	var match func(string) *rbacconfig.Principal
	switch {
	case c.Key == "request.auth.principal":
		if !requestPrincipalsSupported(c.Values) || !requestPrincipalsSupported(c.NotValues) {
			return nil, false
		}
		match = requestPrincipal
	case c.Key == "request.auth.audiences":
		match = func(v string) *rbacconfig.Principal { return claim("aud", stringMatch(v, false)) }
	case c.Key == "request.auth.presenter":
		match = func(v string) *rbacconfig.Principal { return claim("azp", stringMatch(v, false)) }
	default: // request.auth.claims[<name>]
		name := strings.TrimSuffix(strings.TrimPrefix(c.Key, "request.auth.claims["), "]")
		match = func(v string) *rbacconfig.Principal { return claim(name, stringMatch(v, false)) }
	}
	var ids []*rbacconfig.Principal
	field(&ids, c.Values, false, match)
	field(&ids, c.NotValues, true, match)
	return andIDs(ids), true
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

// operationPermission translates an operation; checked is false for a
// TCP port when it names HTTP fields (paths, methods, hosts), which are
// then left out.
func operationPermission(op *meshv1.AuthorizationOperation, opts rbacOptions) (perm *rbacconfig.Permission, checked bool) {
	var perms []*rbacconfig.Permission
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
		permissionField(&perms, op.Paths, false, path)
		permissionField(&perms, op.NotPaths, true, path)
		permissionField(&perms, op.Methods, false, method)
		permissionField(&perms, op.NotMethods, true, method)
		permissionField(&perms, op.Hosts, false, host)
		permissionField(&perms, op.NotHosts, true, host)
	}
	port := func(v string) *rbacconfig.Permission {
		n, _ := strconv.ParseUint(v, 10, 32)
		return &rbacconfig.Permission{Rule: &rbacconfig.Permission_DestinationPort{DestinationPort: uint32(n)}}
	}
	permissionField(&perms, portStrings(op.Ports), false, port)
	permissionField(&perms, portStrings(op.NotPorts), true, port)
	return andPermissions(perms), checked
}

func portStrings(ports []uint32) []string {
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = strconv.FormatUint(uint64(p), 10)
	}
	return out
}

func valuesPermission(c *meshv1.AuthorizationCondition, match func(string) *rbacconfig.Permission) *rbacconfig.Permission {
	var perms []*rbacconfig.Permission
	permissionField(&perms, c.Values, false, match)
	permissionField(&perms, c.NotValues, true, match)
	return andPermissions(perms)
}

// conditionPrincipal translates a "when" condition on the source or the
// request's headers.
func conditionPrincipal(c *meshv1.AuthorizationCondition) *rbacconfig.Principal {
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
	return andIDs(ids)
}

// JWTFilter returns the JWT filter of a class's RequestAuthentications for
// an Envoy, as Istio's: a request with a token none of their issuers
// validates is refused, one without a token passes (for an
// AuthorizationPolicy to decide); a validated token's payload is in the
// filter's metadata for the RBAC filters. Nil without a
// RequestAuthentication.
func JWTFilter(sec Security) *hcm.HttpFilter {
	providers := map[string]*jwt.JwtProvider{}
	var names []string
	for _, p := range sec {
		ra, ok := p.Spec.(*meshv1.RequestAuthentication)
		if !ok {
			continue
		}
		for _, r := range ra.JwtRules {
			name := fmt.Sprintf("%s/%s/%s", p.Namespace, p.Name, r.Issuer)
			provider := &jwt.JwtProvider{
				Issuer: r.Issuer, Audiences: r.Audiences, Forward: r.ForwardOriginalToken,
				FromParams: r.FromParams, ForwardPayloadHeader: r.OutputPayloadToHeader, PayloadInMetadata: jwtPayloadKey,
			}
			for _, h := range r.FromHeaders {
				provider.FromHeaders = append(provider.FromHeaders, &jwt.JwtHeader{Name: h.Name, ValuePrefix: h.Prefix})
			}
			if r.Jwks != "" {
				provider.JwksSourceSpecifier = &jwt.JwtProvider_LocalJwks{LocalJwks: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: r.Jwks}}}
			} else {
				provider.JwksSourceSpecifier = &jwt.JwtProvider_RemoteJwks{RemoteJwks: &jwt.RemoteJwks{
					HttpUri: &core.HttpUri{Uri: r.JwksUri, HttpUpstreamType: &core.HttpUri_Cluster{Cluster: JWKSClusterName(r.JwksUri)},
						Timeout: durationpb.New(5 * time.Second)},
					CacheDuration: durationpb.New(5 * time.Minute),
					AsyncFetch:    &jwt.JwksAsyncFetch{},
				}}
			}
			providers[name] = provider
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	var alternatives []*jwt.JwtRequirement
	for _, n := range names {
		alternatives = append(alternatives, &jwt.JwtRequirement{RequiresType: &jwt.JwtRequirement_ProviderName{ProviderName: n}})
	}
	alternatives = append(alternatives, &jwt.JwtRequirement{RequiresType: &jwt.JwtRequirement_AllowMissing{AllowMissing: &emptypb.Empty{}}})
	config := &jwt.JwtAuthentication{
		Providers: providers,
		Rules: []*jwt.RequirementRule{{
			Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
			RequirementType: &jwt.RequirementRule_Requires{Requires: &jwt.JwtRequirement{
				RequiresType: &jwt.JwtRequirement_RequiresAny{RequiresAny: &jwt.JwtRequirementOrList{Requirements: alternatives}}}},
		}},
	}
	return &hcm.HttpFilter{Name: "envoy.filters.http.jwt_authn", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(config)}}
}

// JWKSClusterName names the cluster an Envoy fetches a JWKS URI's keys
// through.
func JWKSClusterName(uri string) string {
	host, port := jwksHost(uri)
	return "jwks|" + host + "|" + strconv.FormatUint(uint64(port), 10)
}

func jwksHost(uri string) (string, uint32) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", 0
	}
	port := uint32(443)
	if u.Scheme == "http" {
		port = 80
	}
	if p, err := strconv.ParseUint(u.Port(), 10, 16); err == nil {
		port = uint32(p)
	}
	return u.Hostname(), port
}

// JWKSClusters returns the clusters an Envoy class fetches its remote JWKS
// through: DNS, over TLS (validated with the system's roots) for https.
func JWKSClusters(sec Security) []*cluster.Cluster {
	seen := map[string]bool{}
	var out []*cluster.Cluster
	for _, p := range sec {
		ra, ok := p.Spec.(*meshv1.RequestAuthentication)
		if !ok {
			continue
		}
		for _, r := range ra.JwtRules {
			if r.JwksUri == "" || seen[JWKSClusterName(r.JwksUri)] {
				continue
			}
			name := JWKSClusterName(r.JwksUri)
			seen[name] = true
			host, port := jwksHost(r.JwksUri)
			c := &cluster.Cluster{
				Name:                 name,
				ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_LOGICAL_DNS},
				ConnectTimeout:       durationpb.New(5 * time.Second),
				LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
					LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: socketAddress(host, port)}}}},
				}}},
			}
			if strings.HasPrefix(r.JwksUri, "https://") {
				c.TransportSocket = tlsSocket(&tlsv3.UpstreamTlsContext{Sni: host, CommonTlsContext: &tlsv3.CommonTlsContext{
					ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
						TrustedCa: &core.DataSource{Specifier: &core.DataSource_Filename{Filename: SystemRoots}}}}}})
			}
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *cluster.Cluster) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// SystemRoots is where an Envoy's image keeps the public roots (Istio's
// proxy image: Debian's bundle).
const SystemRoots = "/etc/ssl/certs/ca-certificates.crt"

// inboundHTTPFilters are an Envoy's inbound HTTP filters before the
// router: the JWT filter, then the RBAC filters (which read its metadata).
func inboundHTTPFilters(sec Security) []*hcm.HttpFilter {
	var out []*hcm.HttpFilter
	jwtFilter := JWTFilter(sec)
	if jwtFilter != nil {
		out = append(out, jwtFilter)
	}
	deny, allow, anyAllow := rbacPolicies(sec, rbacOptions{jwt: jwtFilter != nil})
	if len(deny) > 0 {
		out = append(out, rbacFilter(rbacconfig.RBAC_DENY, deny))
	}
	if anyAllow {
		out = append(out, rbacFilter(rbacconfig.RBAC_ALLOW, allow))
	}
	return out
}

// inboundTCPFilters are an Envoy's network RBAC filters for a TCP port.
func inboundTCPFilters(sec Security, port uint32) []*listener.Filter {
	deny, allow, anyAllow := rbacPolicies(sec, rbacOptions{tcp: true})
	var out []*listener.Filter
	add := func(action rbacconfig.RBAC_Action, policies map[string]*rbacconfig.Policy, what string) {
		out = append(out, &listener.Filter{Name: "envoy.filters.network.rbac", ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&netrbac.RBAC{
			StatPrefix: "tcp." + what + "." + strconv.FormatUint(uint64(port), 10) + ".",
			Rules:      &rbacconfig.RBAC{Action: action, Policies: policies},
		})}})
	}
	if len(deny) > 0 {
		add(rbacconfig.RBAC_DENY, deny, "deny")
	}
	if anyAllow {
		add(rbacconfig.RBAC_ALLOW, allow, "allow")
	}
	return out
}

// inboundTLS returns the chains of one inbound port for its mTLS mode: the
// plaintext chain as it is (no PeerAuthentication, or DISABLE); one chain
// requiring mutual TLS (STRICT: a plaintext connection fails its
// handshake, never reaching the passthrough); a TLS and a plaintext chain
// told apart by the TLS inspector (PERMISSIVE).
func inboundTLS(chain *listener.FilterChain, mode meshv1.MTLSMode, agent bool) []*listener.FilterChain {
	switch mode {
	case meshv1.MTLSMode_MTLS_MODE_STRICT:
		chain.TransportSocket = downstreamMutualTLS(Envoy, agent)
		return []*listener.FilterChain{chain}
	case meshv1.MTLSMode_MTLS_MODE_PERMISSIVE:
		tlsChain := proto.Clone(chain).(*listener.FilterChain)
		tlsChain.Name += "_tls"
		tlsChain.FilterChainMatch.TransportProtocol = "tls"
		tlsChain.TransportSocket = downstreamMutualTLS(Envoy, agent)
		chain.FilterChainMatch.TransportProtocol = "raw_buffer"
		return []*listener.FilterChain{tlsChain, chain}
	}
	return []*listener.FilterChain{chain}
}

// needsTLSInspector reports whether some inbound port is PERMISSIVE.
func needsTLSInspector(m *Mesh, sec Security) bool {
	for port := range inboundPorts(m) {
		if sec.MTLSMode(port) == meshv1.MTLSMode_MTLS_MODE_PERMISSIVE {
			return true
		}
	}
	return false
}
