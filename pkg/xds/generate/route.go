package generate

import (
	"cmp"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Routes returns the route configurations a kind of proxy asks for: for
// proxyless clients one per HTTP service port named "<host>:<port>", for
// Envoy sidecars one per HTTP port named after the port, holding a virtual
// host per service on that port.
func Routes(m *Mesh, proxy Proxy) []*route.RouteConfiguration {
	if proxy == Envoy {
		return RoutesFrom(m, proxy, SidecarVirtualHost)
	}
	return RoutesFrom(m, proxy, VirtualHost)
}

// VirtualHostFunc returns the virtual host for traffic to host:port; a
// caller may hand RoutesFrom a cached VirtualHost.
type VirtualHostFunc func(m *Mesh, host string, port uint32) *route.VirtualHost

// RoutesFrom is Routes with the virtual hosts from vh.
func RoutesFrom(m *Mesh, proxy Proxy, vh VirtualHostFunc) []*route.RouteConfiguration {
	if proxy == Proxyless {
		var out []*route.RouteConfiguration
		forEachProxylessPort(m, func(host string, p *meshv1.Port) {
			name := ListenerName(host, p.Number)
			out = append(out, &route.RouteConfiguration{
				Name:         name,
				VirtualHosts: []*route.VirtualHost{vh(m, host, p.Number)},
			})
		})
		return out
	}
	byPort := map[uint32]*route.RouteConfiguration{}
	var out []*route.RouteConfiguration
	forEachHTTPPort(m, func(s *Service, host string, p *meshv1.Port) {
		rc := byPort[p.Number]
		if rc == nil {
			// The port is the listener's: hosts are matched without it.
			rc = &route.RouteConfiguration{Name: strconv.FormatUint(uint64(p.Number), 10), ValidateClusters: wrapperspb.Bool(false),
				IgnorePortInHostMatching: true}
			byPort[p.Number] = rc
			out = append(out, rc)
		}
		rc.VirtualHosts = append(rc.VirtualHosts, vh(m, host, p.Number))
	})
	if rc := byPort[80]; rc != nil {
		rc.VirtualHosts = append(rc.VirtualHosts, portlessHosts(m)...)
	}
	for _, rc := range out {
		rc.VirtualHosts = append(uniqueDomains(rc.VirtualHosts), catchAllHost(m))
	}
	return out
}

// portlessHosts are the virtual hosts istiod gives port 80 for the rules
// none of whose hosts is a service with an HTTP port 80 (a host that is
// no service, a service on other ports): each host by itself, routed as
// the rule says for traffic on port 80 (a destination without a port
// takes its service's only port). A rule with a host on port 80 is routed
// there as usual.
func portlessHosts(m *Mesh) []*route.VirtualHost {
	var out []*route.VirtualHost
	for _, rr := range m.Routes {
		if !m.portless(rr.Rule) {
			continue
		}
		var routes []*route.Route
		for _, h := range rr.Rule.Hosts {
			if m.routeByHost[h] != rr {
				continue // another rule routes it
			}
			if routes == nil {
				if routes = httpRoutes(m, rr, nil, 80, true); len(routes) == 0 {
					break
				}
			}
			out = append(out, portlessHost(h, routes))
		}
	}
	return out
}

// portlessHost is a host's virtual host on port 80 of a rule routed there
// by its own hosts.
func portlessHost(host string, routes []*route.Route) *route.VirtualHost {
	return &route.VirtualHost{Name: ListenerName(host, 80), Domains: []string{host}, Routes: routes, IncludeRequestAttemptCount: true}
}

// portless reports whether a rule applies to the mesh and none of its hosts
// is a service routing HTTP on port 80: its hosts are routed on port 80 by
// themselves (see portlessHosts).
func (m *Mesh) portless(r *meshv1.RouteRule) bool {
	return appliesToMesh(r) && !slices.ContainsFunc(r.Hosts, func(h string) bool {
		s := m.Service(h)
		if s == nil || !s.routable() {
			return false
		}
		p := s.port(80)
		return p != nil && isHTTP(p)
	})
}

// uniqueDomains leaves each domain to the first virtual host that claims
// it (two services may share a virtual IP, a short name may be another's
// host), as Istio does: Envoy refuses a route configuration that names a
// domain twice. Only a virtual host that loses a domain is copied.
func uniqueDomains(vhs []*route.VirtualHost) []*route.VirtualHost {
	n := 0
	for _, vh := range vhs {
		n += len(vh.Domains)
	}
	seen := make(map[string]bool, n)
	for i, vh := range vhs {
		if !slices.ContainsFunc(vh.Domains, func(d string) bool { return seen[d] }) {
			for _, d := range vh.Domains {
				seen[d] = true
			}
			continue
		}
		cp := proto.CloneOf(vh)
		cp.Domains = slices.DeleteFunc(cp.Domains, func(d string) bool { return seen[d] })
		for _, d := range cp.Domains {
			seen[d] = true
		}
		vhs[i] = cp
	}
	return slices.DeleteFunc(vhs, func(vh *route.VirtualHost) bool { return len(vh.Domains) == 0 })
}

// SidecarVirtualHost is VirtualHost with the domains an Envoy sidecar
// matches (see Domains).
func SidecarVirtualHost(m *Mesh, host string, port uint32) *route.VirtualHost {
	vh := virtualHost(m, host, port, true)
	vh.IncludeRequestAttemptCount = true
	if s := m.Service(host); s != nil {
		vh.Domains = Domains(m, s, host, 0)
		// The names of the ExternalName Services that alias it, as istiod
		// adds them.
		for _, a := range m.aliasBy[host] {
			for _, h := range a.Spec.Hostnames {
				vh.Domains = append(vh.Domains, Domains(m, a, h, 0)...)
			}
		}
	}
	return vh
}

// Domains are the names requests for host:port may carry, as Istio
// generates them for a sidecar: the host, and as an absolute name (with a
// trailing dot); for a Kubernetes service's host
// (name.namespace.svc.<domain>) its short name for proxies of its
// namespace, name.namespace.svc and name.namespace; the service's virtual
// IPs; each with and without the port (port 0: without, for a route
// configuration that ignores the port, as a sidecar's do).
func Domains(m *Mesh, s *Service, host string, port uint32) []string {
	names := []string{host}
	if net.ParseIP(host) == nil {
		names = append(names, host+".")
	}
	if name, ns, ok := kubeHost(host); ok && ns == s.Namespace {
		if m.Namespace == ns {
			names = append(names, name)
		}
		names = append(names, name+"."+ns+".svc", name+"."+ns)
	}
	names = append(names, s.Spec.GetAddresses()...)
	suffix := ":" + strconv.FormatUint(uint64(port), 10)
	out := make([]string, 0, 2*len(names))
	for _, n := range names {
		if strings.Contains(n, ":") { // an IPv6 address: Envoy matches it bracketed
			n = "[" + n + "]"
		}
		out = append(out, n)
		if port != 0 {
			out = append(out, n+suffix)
		}
	}
	return out
}

// kubeHost splits the host of a Kubernetes service, name.namespace.svc.<domain>.
func kubeHost(host string) (name, namespace string, ok bool) {
	parts := strings.SplitN(host, ".", 4)
	if len(parts) < 4 || parts[2] != "svc" || parts[0] == "" || parts[1] == "" {
		return "", "", false
	}
	return parts[0], parts[1], true
}

// forEachHTTPPort calls fn for every host and HTTP port of every service, in
// service order.
func forEachHTTPPort(m *Mesh, fn func(s *Service, host string, p *meshv1.Port)) {
	for _, s := range m.Services {
		if !s.routable() {
			continue
		}
		for _, h := range m.Owned(s) {
			for _, p := range s.Spec.Ports {
				if isHTTP(p) {
					fn(s, h, p)
				}
			}
		}
	}
}

// forEachProxylessPort calls fn for every host and HTTP port a proxyless
// client may dial: those of forEachHTTPPort, then each name of an alias
// service on each of its HTTP ports, as istiod gives proxyless clients a
// listener for each (see virtualHost for where they are routed).
func forEachProxylessPort(m *Mesh, fn func(host string, p *meshv1.Port)) {
	forEachHTTPPort(m, func(_ *Service, host string, p *meshv1.Port) { fn(host, p) })
	forEachProxylessAlias(m, func(_ *Service, host string, p *meshv1.Port) { fn(host, p) })
}

// forEachProxylessAlias calls fn for each name and HTTP port of each alias
// service the mesh's view sees, in service order.
func forEachProxylessAlias(m *Mesh, fn func(a *Service, host string, p *meshv1.Port)) {
	for _, a := range m.list {
		for _, h := range a.Spec.Hostnames {
			for _, p := range a.Spec.Ports {
				if isHTTP(p) {
					fn(a, h, p)
				}
			}
		}
	}
}

// VirtualHostInputs names the versions of everything VirtualHost reads for
// host:port: the route rule that names the host and the services its
// destinations resolve to. Equal inputs give an equal virtual host.
func VirtualHostInputs(m *Mesh, host string, port uint32) string {
	if target := m.aliasTarget(host, port); target != "" {
		return "alias=" + target + " " + VirtualHostInputs(m, target, port)
	}
	var b strings.Builder
	b.WriteString("mesh=" + m.ConfigVersion + " ")
	s := m.Service(host)
	if s != nil {
		// What its domains depend on.
		_, ns, _ := kubeHost(host)
		b.WriteString("local=" + strconv.FormatBool(ns != "" && ns == m.Namespace) + " vips=" + strings.Join(s.Spec.GetAddresses(), ",") + " ")
		for _, a := range m.aliasBy[host] {
			b.WriteString("alias=" + a.Namespace + "/" + a.Name + "@" + a.ConfigVersion + " ")
		}
	}
	rr := m.routeByHost[host]
	if rr == nil {
		// The default route reads the service's policy (its consistent
		// hash), which its configuration's version follows.
		if s != nil {
			return b.String() + "default " + s.Namespace + "/" + s.Name + "@" + s.ConfigVersion
		}
		return b.String() + "default"
	}
	// Its matches may depend on the proxies: their namespace, the source
	// selectors that select them.
	routes := m.expand(rr.Rule)
	for _, h := range routes {
		for _, hm := range h.Match {
			if hm.SourceNamespace != "" || len(hm.SourceLabels) > 0 {
				b.WriteString("src=" + strconv.FormatBool(m.fromSource(nil, hm.SourceLabels, hm.SourceNamespace)) + " ")
			}
		}
	}
	// Written without fmt: this runs for every host of every class at
	// every generation.
	b.WriteString(rr.Namespace + "/" + rr.Name + "@" + rr.Version)
	dest := func(d *meshv1.Destination) {
		if s := m.Service(d.GetHost()); s != nil {
			b.WriteString(" " + d.GetHost() + "=" + s.Namespace + "/" + s.Name + "@" + s.ConfigVersion)
		} else {
			b.WriteString(" " + d.GetHost() + "=none")
		}
	}
	for _, h := range rr.Rule.Http {
		if d := m.delegateOf(h); d != nil {
			b.WriteString(" delegate=" + d.Namespace + "/" + d.Name + "@" + d.Version)
		}
	}
	for _, h := range routes {
		for _, d := range h.Route {
			dest(d.GetDestination())
		}
		if h.Mirror != nil {
			dest(h.Mirror.GetDestination())
		}
	}
	return b.String()
}

// VirtualHost routes the traffic for host:port: by the VirtualService that
// names the host, else straight to the service; as a proxyless client
// takes it (see SidecarVirtualHost).
func VirtualHost(m *Mesh, host string, port uint32) *route.VirtualHost {
	return virtualHost(m, host, port, false)
}

// virtualHost is VirtualHost for an Envoy (envoy: with what only Envoy
// acts on) or a proxyless client.
//
// A name of an alias service is routed as the host it names where that is
// a service of the mesh on the port (istiod adds the alias's names to that
// host's virtual host); elsewhere, to the alias's own cluster, which
// resolves the name (see AliasClusters).
func virtualHost(m *Mesh, host string, port uint32, envoy bool) *route.VirtualHost {
	name := ListenerName(host, port)
	if target := m.aliasTarget(host, port); target != "" {
		vh := proto.CloneOf(virtualHost(m, target, port, envoy))
		vh.Name, vh.Domains = name, []string{name, host}
		return vh
	}
	vh := &route.VirtualHost{Name: name, Domains: []string{name, host}}
	rr := m.routeByHost[host]
	if rr == nil {
		vh.Routes = []*route.Route{defaultRoute(m, m.Service(host), host, port, envoy)}
		return vh
	}
	vh.Routes = httpRoutes(m, rr, nil, port, envoy)
	return vh
}

// httpRoutes turns a route rule's HTTP routes into Envoy routes for
// traffic that arrived on port at a gateway (nil: at a sidecar, "mesh"),
// for an Envoy or (not envoy) a proxyless client.
func httpRoutes(m *Mesh, rr *Route, gw *Gateway, port uint32, envoy bool) []*route.Route {
	var out []*route.Route
	for _, g := range httpRouteGroups(m, rr, gw, port, envoy) {
		out = append(out, g.routes...)
	}
	return out
}

// routeGroup is the Envoy routes of one HTTP route of a rule (one per
// match that applies), beside that route: what ranks it among others.
type routeGroup struct {
	rule   *meshv1.HTTPRoute
	routes []*route.Route
}

// httpRouteGroups is httpRoutes grouped by the rule's HTTP routes, up to
// the first route that matches every request.
func httpRouteGroups(m *Mesh, rr *Route, gw *Gateway, port uint32, envoy bool) []routeGroup {
	var out []routeGroup
	for _, h := range m.expand(rr.Rule) {
		// The action, headers and filter settings are shared by the
		// routes of every match.
		var shared route.Route
		ops := translateHeaders(h.Headers)
		if h.Redirect != nil {
			shared.Action = redirectAction(h.Redirect)
		} else if dr := h.DirectResponse; dr != nil {
			action := &route.DirectResponseAction{Status: dr.Status}
			if dr.Body != "" {
				action.Body = &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: dr.Body}}
			}
			shared.Action = &route.Route_DirectResponse{DirectResponse: action}
		} else if ra, dst := routeAction(m, h, port, envoy, ops.authority, rr.Rule.GetGatewayApi()); ra != nil {
			shared.Action = &route.Route_Route{Route: ra}
			ops = ops.then(dst) // a single destination's changes apply after the route's
		} else {
			continue
		}
		decorate(&shared, h, ops, envoy)
		matches := h.Match
		if len(matches) == 0 {
			matches = []*meshv1.HTTPMatch{nil}
		}
		group := routeGroup{rule: h}
		for _, hm := range matches {
			if hm.GetPort() != 0 && hm.GetPort() != port {
				continue
			}
			if len(hm.GetGateways()) > 0 && !namesGateway(hm.Gateways, rr.Namespace, gw) {
				continue // the match is for other gateways (or sidecars)
			}
			if !m.fromSource(gw, hm.GetSourceLabels(), hm.GetSourceNamespace()) {
				continue // for other proxies
			}
			name := h.Name
			if hm.GetName() != "" {
				name += "." + hm.Name
			}
			r := &route.Route{Name: name, Match: routeMatch(hm, envoy && rr.Rule.GetGatewayApi()), Action: shared.Action, TypedPerFilterConfig: shared.TypedPerFilterConfig,
				RequestHeadersToAdd: shared.RequestHeadersToAdd, RequestHeadersToRemove: shared.RequestHeadersToRemove,
				ResponseHeadersToAdd: shared.ResponseHeadersToAdd, ResponseHeadersToRemove: shared.ResponseHeadersToRemove}
			if envoy {
				r.Decorator = &route.Decorator{Operation: operation(r, rr.Name, port)}
			}
			removePrefix(r, h.Rewrite)
			group.routes = append(group.routes, r)
			if isCatchAll(r.Match) {
				// No request gets past it: what follows is not sent, as
				// istiod does not send it.
				return append(out, group)
			}
		}
		if len(group.routes) > 0 {
			out = append(out, group)
		}
	}
	return out
}

// routeMatch is a match's Envoy match; with segments, a path prefix
// matches whole path segments ("/a" matches "/a" and "/a/b", not "/ab"),
// as the Gateway API asks (proxyless clients know only plain prefixes).
// removePrefix makes a rewrite of a whole-segment prefix to "/" remove
// the prefix: Envoy's prefix rewrite would leave "//rest" of "/prefix/rest".
func removePrefix(r *route.Route, rw *meshv1.Rewrite) {
	p := r.GetMatch().GetPathSeparatedPrefix()
	a := r.GetRoute()
	if p == "" || a == nil || rw.GetUri() != "/" || rw.GetFullPath() != "" {
		return
	}
	a = proto.CloneOf(a)
	a.PrefixRewrite = ""
	a.RegexRewrite = &matcher.RegexMatchAndSubstitute{Pattern: &matcher.RegexMatcher{Regex: "^" + regexp.QuoteMeta(p) + "(/?)(.*)"}, Substitution: `/\2`}
	r.Action = &route.Route_Route{Route: a}
}

func routeMatch(hm *meshv1.HTTPMatch, segments bool) *route.RouteMatch {
	rm := &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}}
	if hm == nil {
		return rm
	}
	rm.CaseSensitive = wrapperspb.Bool(!hm.IgnoreUriCase)
	switch u := hm.Uri.GetKind().(type) {
	case *meshv1.StringMatch_Exact:
		rm.PathSpecifier = &route.RouteMatch_Path{Path: u.Exact}
	case *meshv1.StringMatch_Prefix:
		rm.PathSpecifier = &route.RouteMatch_Prefix{Prefix: u.Prefix}
		if segments && u.Prefix != "/" {
			rm.PathSpecifier = &route.RouteMatch_PathSeparatedPrefix{PathSeparatedPrefix: strings.TrimSuffix(u.Prefix, "/")}
		}
	case *meshv1.StringMatch_Regex:
		rm.PathSpecifier = &route.RouteMatch_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: u.Regex}}
	}
	if hm.Method != nil {
		rm.Headers = append(rm.Headers, headerMatcher(":method", hm.Method))
	}
	for _, name := range sortedKeys(hm.Headers) {
		rm.Headers = append(rm.Headers, headerMatcher(name, hm.Headers[name]))
	}
	for _, name := range sortedKeys(hm.WithoutHeaders) {
		h := headerMatcher(name, hm.WithoutHeaders[name])
		h.InvertMatch = true
		rm.Headers = append(rm.Headers, h)
	}
	for _, name := range sortedKeys(hm.QueryParams) {
		sm := headerMatcher(name, hm.QueryParams[name]).GetStringMatch()
		rm.QueryParameters = append(rm.QueryParameters, &route.QueryParameterMatcher{Name: name,
			QueryParameterMatchSpecifier: &route.QueryParameterMatcher_StringMatch{StringMatch: sm}})
	}
	return rm
}

func headerMatcher(name string, m *meshv1.StringMatch) *route.HeaderMatcher {
	sm := &matcher.StringMatcher{}
	switch k := m.GetKind().(type) {
	case *meshv1.StringMatch_Exact:
		sm.MatchPattern = &matcher.StringMatcher_Exact{Exact: k.Exact}
	case *meshv1.StringMatch_Prefix:
		sm.MatchPattern = &matcher.StringMatcher_Prefix{Prefix: k.Prefix}
	case *meshv1.StringMatch_Regex:
		sm.MatchPattern = &matcher.StringMatcher_SafeRegex{SafeRegex: &matcher.RegexMatcher{Regex: k.Regex}}
	}
	return &route.HeaderMatcher{Name: name, HeaderMatchSpecifier: &route.HeaderMatcher_StringMatch{StringMatch: sm}}
}

// routeAction sends a route's traffic to its destinations, weighted when
// there are several, with Istio's defaults where the route is silent (no
// timeout, two retries); authority is what the route's headers set it to.
// A weighted destination's header changes go on its share; a single
// destination's are returned, for the route. It returns nil when no
// destination resolves to a service port, which validation at ingest
// makes rare. A Gateway API route (gatewayAPI) keeps a destination that
// does not resolve, which answers 500 (the API's "invalid backend"),
// unless every destination is one.
func routeAction(m *Mesh, h *meshv1.HTTPRoute, listenerPort uint32, envoy bool, authority string, gatewayAPI bool) (*route.RouteAction, headerOps) {
	targets, invalid := routeTargets(m, h, listenerPort, gatewayAPI)
	if len(targets) == invalid {
		return nil, headerOps{}
	}
	a := &route.RouteAction{}
	if gatewayAPI {
		a.ClusterNotFoundResponseCode = route.RouteAction_INTERNAL_SERVER_ERROR
	}
	setTimeout(a, h.Timeout, envoy)
	rewrite(a, h.Rewrite)
	if a.HostRewriteSpecifier == nil && authority != "" {
		a.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: authority}
	}
	a.RequestMirrorPolicies = mirrorPolicies(m, h.Mirror, listenerPort)
	if len(targets) == 1 {
		t := targets[0]
		a.ClusterSpecifier = &route.RouteAction_Cluster{Cluster: t.cluster}
		if t.headers.authority != "" && a.HostRewriteSpecifier == nil {
			a.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: t.headers.authority}
		}
	} else {
		wc := &route.WeightedCluster{}
		for _, t := range targets {
			cw := &route.WeightedCluster_ClusterWeight{Name: t.cluster, Weight: wrapperspb.UInt32(t.weight),
				RequestHeadersToAdd: t.headers.requestAdd, RequestHeadersToRemove: t.headers.requestRemove,
				ResponseHeadersToAdd: t.headers.responseAdd, ResponseHeadersToRemove: t.headers.responseRemove}
			if t.headers.authority != "" {
				cw.HostRewriteSpecifier = &route.WeightedCluster_ClusterWeight_HostRewriteLiteral{HostRewriteLiteral: t.headers.authority}
			}
			wc.Clusters = append(wc.Clusters, cw)
		}
		a.ClusterSpecifier = &route.RouteAction_WeightedClusters{WeightedClusters: wc}
	}
	// Each destination that hashes consistently hashes here, on the
	// route; its clusters use a ring hash.
	for _, t := range targets {
		a.HashPolicy = append(a.HashPolicy, hashPolicy(t.hash)...)
	}
	// A single destination that hashes keeps its retries on the same host.
	// A route without retries of its own has the mesh's.
	a.RetryPolicy = retryPolicy(cmp.Or(h.Retries, m.Config.GetDefaultHttpRetry()), len(h.Route) == 1 && targets[0].hash != nil)
	if len(targets) == 1 {
		return a, targets[0].headers
	}
	return a, headerOps{}
}

// routeTarget is one destination of a route: its cluster, weight, header
// operations and consistent hash.
type routeTarget struct {
	cluster string
	weight  uint32
	headers headerOps
	hash    *meshv1.ConsistentHash
}

// routeTargets returns a route's destinations that lead somewhere, and how
// many of them are a Gateway API backend that does not resolve (sent to a
// cluster that does not exist, which Envoy answers 500).
func routeTargets(m *Mesh, h *meshv1.HTTPRoute, listenerPort uint32, gatewayAPI bool) (targets []routeTarget, invalid int) {
	for _, d := range h.Route {
		dst := d.GetDestination()
		s := m.Service(dst.GetHost())
		port := uint32(0)
		if s != nil && s.routable() {
			port = destinationPort(s, dst.GetPort(), listenerPort)
		}
		if port == 0 && gatewayAPI && d.Weight > 0 {
			invalid++
			targets = append(targets, routeTarget{cluster: ClusterName(dst.GetPort(), "", dst.GetHost()), weight: d.Weight})
			continue
		}
		if port == 0 {
			continue
		}
		if dst.GetSubset() != "" && s.subset(dst.GetSubset()) == nil {
			continue
		}
		if len(h.Route) > 1 && d.Weight == 0 {
			continue
		}
		targets = append(targets, routeTarget{ClusterName(port, dst.GetSubset(), m.Resolve(dst.GetHost())), max(d.Weight, 1),
			translateHeaders(d.Headers), destinationHash(s.Policy, dst)})
	}
	return targets, invalid
}

// mirrorPolicies is a route's mirror (nil: none) as Envoy takes it, when
// its destination is routable.
func mirrorPolicies(m *Mesh, mr *meshv1.Mirror, listenerPort uint32) []*route.RouteAction_RequestMirrorPolicy {
	if mr == nil {
		return nil
	}
	s := m.Service(mr.GetDestination().GetHost())
	if s == nil || !s.routable() {
		return nil
	}
	port := destinationPort(s, mr.Destination.Port, listenerPort)
	if port == 0 {
		return nil
	}
	pct := mr.Percentage
	if pct == 0 {
		pct = 100
	}
	return []*route.RouteAction_RequestMirrorPolicy{{
		Cluster:         ClusterName(port, mr.Destination.Subset, m.Resolve(mr.Destination.Host)),
		RuntimeFraction: &core.RuntimeFractionalPercent{DefaultValue: fractional(pct)},
		// Mirrored requests keep their host and start no trace.
		TraceSampled:                  wrapperspb.Bool(false),
		DisableShadowHostSuffixAppend: true,
	}}
}

// rewrite applies a route's rewrite (nil: none) to its action: the
// matched prefix or the whole path, and the authority.
func rewrite(a *route.RouteAction, rw *meshv1.Rewrite) {
	if rw == nil {
		return
	}
	a.PrefixRewrite = rw.Uri
	if rw.FullPath != "" {
		a.PrefixRewrite = ""
		a.RegexRewrite = &matcher.RegexMatchAndSubstitute{Pattern: &matcher.RegexMatcher{Regex: "/.*"}, Substitution: rw.FullPath}
	}
	if rw.Authority != "" {
		a.HostRewriteSpecifier = &route.RouteAction_HostRewriteLiteral{HostRewriteLiteral: rw.Authority}
	}
}

// defaultRoute sends all of host:port's traffic to its service, with the
// defaults of a route that says nothing.
func defaultRoute(m *Mesh, s *Service, host string, port uint32, envoy bool) *route.Route {
	a := &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: ClusterName(port, "", host)}}
	setTimeout(a, nil, envoy)
	a.RetryPolicy = retryPolicy(m.Config.GetDefaultHttpRetry(), false)
	if s != nil {
		a.HashPolicy = hashPolicy(serviceHash(s.Policy, port))
	}
	r := &route.Route{
		Name:   "default",
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: a},
	}
	if envoy {
		r.Decorator = &route.Decorator{Operation: ListenerName(host, port) + "/*"}
	}
	return r
}

// operation names a route in traces: the destination and the path it
// matches, or the VirtualService's name when it splits traffic.
func operation(r *route.Route, rule string, port uint32) string {
	path := "/*"
	switch ps := r.GetMatch().GetPathSpecifier().(type) {
	case *route.RouteMatch_Prefix:
		path = ps.Prefix + "*"
	case *route.RouteMatch_Path:
		path = ps.Path
	case *route.RouteMatch_SafeRegex:
		path = ps.SafeRegex.GetRegex()
	}
	if host, p, _, ok := ParseClusterName(r.GetRoute().GetCluster()); ok {
		return ListenerName(host, p) + path
	}
	return ListenerName(rule, port) + path
}

// serviceHash is the consistent hash of a service's policy on a port: the
// port's settings', else the policy's.
func serviceHash(tp *meshv1.TrafficPolicy, port uint32) *meshv1.ConsistentHash {
	return cmp.Or(portPolicy(tp.GetPortLevelSettings(), port).GetConsistentHash(), tp.GetConsistentHash())
}

// destinationHash is the consistent hash a route destination uses, as
// Istio picks it: the subset's settings for the port the destination
// names, the subset's, the policy's settings for that port, the policy's.
func destinationHash(tp *meshv1.TrafficPolicy, dst *meshv1.Destination) *meshv1.ConsistentHash {
	onPort := func(ps []*meshv1.PortPolicy) *meshv1.ConsistentHash {
		if dst.GetPort() == 0 {
			return nil
		}
		return portPolicy(ps, dst.Port).GetConsistentHash()
	}
	var sub *meshv1.Subset
	if i := slices.IndexFunc(tp.GetSubsets(), func(s *meshv1.Subset) bool { return s.Name == dst.GetSubset() }); i >= 0 {
		sub = tp.Subsets[i]
	}
	return cmp.Or(onPort(sub.GetPortLevelSettings()), sub.GetConsistentHash(), onPort(tp.GetPortLevelSettings()), tp.GetConsistentHash())
}

// destinationPort picks the service port a destination means: the one it
// names, else the port the traffic arrived on, else the service's only port.
func destinationPort(s *Service, named, listenerPort uint32) uint32 {
	switch {
	case named != 0:
		if s.port(named) != nil {
			return named
		}
		return 0
	case s.port(listenerPort) != nil:
		return listenerPort
	case len(s.Spec.Ports) == 1:
		return s.Spec.Ports[0].Number
	}
	return 0
}
