package generate

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	snicluster "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/sni_cluster/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Gateway is one Istio Gateway as the generators see it.
type Gateway struct {
	Namespace, Name string
	Spec            *meshv1.Gateway
}

// Key is "<namespace>/<name>".
func (g *Gateway) Key() string { return g.Namespace + "/" + g.Name }

// GatewayRouteName is Istio's name for a gateway's plain HTTP routes on a port.
func GatewayRouteName(port uint32) string { return "http." + strconv.FormatUint(uint64(port), 10) }

// gatewayHTTPSRouteName names the routes of a TLS-terminating server, as
// Istio does: "https.<port>.<port name>.<gateway>.<namespace>".
func gatewayHTTPSRouteName(g *Gateway, s *meshv1.GatewayServer) string {
	return "https." + strconv.FormatUint(uint64(s.Port), 10) + "." + s.PortName + "." + g.Name + "." + g.Namespace
}

// gatewayHTTP reports whether a gateway server serves plain HTTP that the
// router routes.
func gatewayHTTP(s *meshv1.GatewayServer) bool {
	switch s.Protocol {
	case meshv1.Protocol_PROTOCOL_HTTP, meshv1.Protocol_PROTOCOL_HTTP2, meshv1.Protocol_PROTOCOL_GRPC:
		return true
	}
	return false
}

// gatewayTerminates reports whether a gateway server terminates TLS and
// routes the HTTP inside (HTTPS with mode SIMPLE, MUTUAL or ISTIO_MUTUAL).
// TLS passthrough is not generated.
func gatewayTerminates(s *meshv1.GatewayServer) bool {
	if s.Protocol != meshv1.Protocol_PROTOCOL_HTTPS {
		return false
	}
	switch s.GetTls().GetMode() {
	case "SIMPLE", "MUTUAL", "ISTIO_MUTUAL":
		return true
	}
	return false
}

// gatewayPorts returns the routed ports of the gateways, in order, and
// whether each terminates TLS (a port where any server does).
func gatewayPorts(gws []*Gateway) ([]uint32, map[uint32]bool) {
	tls := map[uint32]bool{}
	for _, g := range gws {
		for _, s := range g.Spec.Servers {
			if gatewayHTTP(s) || gatewayTerminates(s) {
				tls[s.Port] = tls[s.Port] || gatewayTerminates(s)
			}
		}
	}
	return slices.SortedFunc(maps.Keys(tls), cmp.Compare), tls
}

// GatewayListeners returns a router's listeners: one bound listener per
// port of its gateways, on the port listen maps it to (see ListenPorts;
// none for a port it maps to 0, see Unprivileged). A
// plain HTTP port routes through "http.<listen port>". A TLS port chooses
// a filter chain by SNI among the servers' hosts: a terminating server's
// (its certificate from SDS: its credential, "default" for ISTIO_MUTUAL)
// routes through its own route configuration; a PASSTHROUGH
// server's chains send each SNI host of the bound VirtualServices' tls
// routes on, still encrypted; an AUTO_PASSTHROUGH server's sends a
// connection to the cluster its SNI names ("outbound_.<port>_.<subset>_.<host>",
// see SNIClusters). A TCP server's port sends connections by
// the bound VirtualServices' tcp routes.
func GatewayListeners(m *Mesh, gws []*Gateway, listen func(uint32) uint32) []*listener.Listener {
	ports, tls := gatewayPorts(gws)
	l4 := gatewayL4Ports(gws)
	var out []*listener.Listener
	bound := map[uint32]bool{}
	for _, port := range slices.Sorted(maps.Keys(union(ports, l4))) {
		lport := listen(port)
		if lport == 0 {
			continue // where the proxy cannot listen (Unprivileged)
		}
		if bound[lport] {
			continue // two server ports on one target port: the first wins
		}
		bound[lport] = true
		num := strconv.FormatUint(uint64(lport), 10)
		l := &listener.Listener{Name: "0.0.0.0_" + num, Address: socketAddress("0.0.0.0", lport), TrafficDirection: core.TrafficDirection_OUTBOUND,
			MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1)}
		manager := func(routeName string) []*listener.Filter {
			return []*listener.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(httpConnectionManager(m, "gateway_"+num, routeName, gatewayManager))},
			}}
		}
		if slices.Contains(ports, port) && !tls[port] {
			l.FilterChains = []*listener.FilterChain{{Filters: manager(GatewayRouteName(lport)), TransportSocketConnectTimeout: durationpb.New(15 * time.Second)}}
			out = append(out, l)
			continue // HTTP wins a port a TCP server shares
		}
		seen := map[string]bool{}
		add := func(names []string, socket *core.TransportSocket, filters []*listener.Filter) {
			key := strings.Join(names, ",")
			if seen[key] {
				return // Envoy rejects two chains with one match; the first wins
			}
			seen[key] = true
			// Unnamed, as istiod sends them.
			l.FilterChains = append(l.FilterChains, &listener.FilterChain{
				FilterChainMatch: &listener.FilterChainMatch{ServerNames: names}, TransportSocket: socket, Filters: filters,
				TransportSocketConnectTimeout: durationpb.New(15 * time.Second)})
		}
		var tcp *listener.Filter
		for _, g := range gws {
			for _, srv := range g.Spec.Servers {
				if srv.Port != port {
					continue
				}
				name := g.Key() + "/" + cmp.Or(srv.Name, num)
				switch {
				case gatewayTerminates(srv):
					add(serverNames(srv), downstreamTLS(srv.Tls), manager(gatewayHTTPSRouteName(g, srv)))
				case gatewayPassthrough(srv):
					for _, c := range passthroughChains(m, g, srv) {
						add(c.names, nil, []*listener.Filter{l4Proxy(name, c.targets)})
					}
				case gatewayAutoPassthrough(srv):
					add(serverNames(srv), nil, []*listener.Filter{{Name: "envoy.filters.network.sni_cluster",
						ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&snicluster.SniCluster{})}},
						tcpProxyFilter(name, BlackHoleCluster)})
				case srv.Protocol == meshv1.Protocol_PROTOCOL_TCP && tcp == nil:
					if targets := gatewayTCPTargets(m, g, srv); len(targets) > 0 {
						tcp = l4Proxy(name, targets)
					}
				}
			}
		}
		if len(l.FilterChains) == 0 && tcp == nil {
			continue // nothing routed on the port
		}
		if len(l.FilterChains) > 0 {
			l.ListenerFilters = []*listener.ListenerFilter{{
				Name:       "envoy.filters.listener.tls_inspector",
				ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{InitialReadBufferSize: wrapperspb.UInt32(512)})},
			}}
			if tcp != nil {
				l.DefaultFilterChain = &listener.FilterChain{Name: "tcp", Filters: []*listener.Filter{tcp}}
			}
		} else {
			l.FilterChains = []*listener.FilterChain{{Name: "tcp", Filters: []*listener.Filter{tcp}}}
		}
		out = append(out, l)
	}
	return out
}

func union(a []uint32, b map[uint32]bool) map[uint32]bool {
	out := maps.Clone(b)
	if out == nil {
		out = map[uint32]bool{}
	}
	for _, p := range a {
		out[p] = true
	}
	return out
}

// gatewayPassthrough reports whether a server passes TLS through by the
// tls routes of its VirtualServices; gatewayAutoPassthrough, by the
// cluster its SNI names.
func gatewayPassthrough(s *meshv1.GatewayServer) bool {
	return (s.Protocol == meshv1.Protocol_PROTOCOL_TLS || s.Protocol == meshv1.Protocol_PROTOCOL_HTTPS) && s.GetTls().GetMode() == "PASSTHROUGH"
}

func gatewayAutoPassthrough(s *meshv1.GatewayServer) bool {
	return s.Protocol == meshv1.Protocol_PROTOCOL_TLS && s.GetTls().GetMode() == "AUTO_PASSTHROUGH"
}

// gatewayL4Ports returns the ports of servers that route opaque TCP or TLS.
func gatewayL4Ports(gws []*Gateway) map[uint32]bool {
	out := map[uint32]bool{}
	for _, g := range gws {
		for _, s := range g.Spec.Servers {
			if gatewayPassthrough(s) || gatewayAutoPassthrough(s) || s.Protocol == meshv1.Protocol_PROTOCOL_TCP {
				out[s.Port] = true
			}
		}
	}
	return out
}

// sniChain is a passthrough filter chain: the SNI names it matches and
// where it sends their connections.
type sniChain struct {
	names   []string
	targets []l4Target
}

// passthroughChains are a PASSTHROUGH server's chains: per tls route of a
// VirtualService bound to the gateway, its SNI hosts the server admits.
func passthroughChains(m *Mesh, g *Gateway, srv *meshv1.GatewayServer) []sniChain {
	var out []sniChain
	for _, r := range m.Routes {
		if !boundTo(r, g) {
			continue
		}
		for _, tr := range r.Rule.Tls {
			for _, lm := range tr.Match {
				if (lm.Port != 0 && lm.Port != srv.Port) || (len(lm.Gateways) > 0 && !namesGateway(lm.Gateways, r.Namespace, g)) ||
					!m.fromSource(g, lm.SourceLabels, lm.SourceNamespace) {
					continue
				}
				var names []string
				for _, h := range lm.SniHosts {
					if admits(srv, g.Namespace, r.Namespace, h) {
						names = append(names, h)
					}
				}
				targets := resolveTargets(m, tr.Route, srv.Port)
				if len(names) > 0 && len(targets) > 0 {
					slices.Sort(names)
					out = append(out, sniChain{names: slices.Compact(names), targets: targets})
				}
			}
		}
	}
	return out
}

// gatewayTCPTargets are where a TCP server sends connections: the first
// tcp route, of a VirtualService bound to the gateway whose hosts the
// server admits, that matches the port.
func gatewayTCPTargets(m *Mesh, g *Gateway, srv *meshv1.GatewayServer) []l4Target {
	for _, r := range m.Routes {
		if !boundTo(r, g) || !slices.ContainsFunc(r.Rule.Hosts, func(h string) bool { return admits(srv, g.Namespace, r.Namespace, h) }) {
			continue
		}
		for _, tr := range r.Rule.Tcp {
			matches := len(tr.Match) == 0
			for _, lm := range tr.Match {
				if (lm.Port == 0 || lm.Port == srv.Port) && (len(lm.Gateways) == 0 || namesGateway(lm.Gateways, r.Namespace, g)) &&
					m.fromSource(g, lm.SourceLabels, lm.SourceNamespace) {
					matches = true
				}
			}
			if !matches {
				continue
			}
			if targets := resolveTargets(m, tr.Route, srv.Port); len(targets) > 0 {
				return targets
			}
		}
	}
	return nil
}

// AutoPassthrough reports whether a router's gateways have an
// AUTO_PASSTHROUGH server, whose SNI names the cluster (see SNIClusters).
func AutoPassthrough(gws []*Gateway) bool {
	return slices.ContainsFunc(gws, func(g *Gateway) bool { return slices.ContainsFunc(g.Spec.Servers, gatewayAutoPassthrough) })
}

// SNIClusters are the clusters an AUTO_PASSTHROUGH server's SNI names, as
// Istio names them ("outbound_.<port>_.<subset>_.<host>"): each EDS
// cluster's, taking the same load assignment, without TLS of its own (the
// client's passes through).
func SNIClusters(clusters []*cluster.Cluster) []*cluster.Cluster {
	var out []*cluster.Cluster
	for _, c := range clusters {
		host, port, subset, ok := ParseClusterName(c.Name)
		if !ok || c.GetType() != cluster.Cluster_EDS {
			continue
		}
		sni := proto.CloneOf(c)
		sni.Name = "outbound_." + strconv.FormatUint(uint64(port), 10) + "_." + subset + "_." + host
		sni.EdsClusterConfig.ServiceName = c.Name
		sni.TransportSocket = nil
		out = append(out, sni)
	}
	return out
}

// serverNames returns the SNI names a server matches: its hosts without
// namespaces, none (any name) when one is "*".
func serverNames(srv *meshv1.GatewayServer) []string {
	var out []string
	for _, h := range srv.Hosts {
		if _, host, found := strings.Cut(h, "/"); found {
			h = host
		}
		if h == "*" {
			return nil
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// downstreamTLS terminates TLS with the server's certificate over SDS;
// MUTUAL also requires a client certificate validated by
// "<credential>-cacert", ISTIO_MUTUAL by the mesh's "ROOTCA", as in Istio.
func downstreamTLS(t *meshv1.GatewayTLS) *core.TransportSocket {
	sds := func(name string) *tlsv3.SdsSecretConfig { return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: ads()} }
	cert := CredentialResource(t.CredentialName)
	if t.Mode == "ISTIO_MUTUAL" || t.CredentialName == "" {
		cert = "default"
	}
	ctx := &tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sds(cert)},
		AlpnProtocols:                  []string{"h2", "http/1.1"},
	}, RequireClientCertificate: wrapperspb.Bool(false)}
	switch t.Mode {
	case "MUTUAL":
		ctx.RequireClientCertificate = wrapperspb.Bool(true)
		ctx.CommonTlsContext.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig{ValidationContextSdsSecretConfig: sds(cert + "-cacert")}
	case "ISTIO_MUTUAL":
		ctx.RequireClientCertificate = wrapperspb.Bool(true)
		ctx.CommonTlsContext.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig{ValidationContextSdsSecretConfig: sds("ROOTCA")}
	}
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
}

// ListenPorts returns the port a router listens on for its gateways'
// servers' ports, as istiod resolves them: a Service whose workloads the
// Gateway's selector selects (a Kubernetes Service of the gateway
// Deployment, by its endpoints' labels) and that has the server's port
// maps it to its target port (8080 for port 80 of Istio's ingress
// gateway, which cannot bind 80 unprivileged); without one the server's
// port is the listener's. The first such Service, by namespace and name,
// decides. A router's listeners and routes take the same one.
func ListenPorts(m *Mesh, gws []*Gateway) func(uint32) uint32 {
	listen := map[uint32]uint32{}
	for _, g := range NewGatewayTargets(gws).groups {
		for _, s := range m.Services {
			g.targets(s, func(port, target uint32) {
				if _, ok := listen[port]; !ok {
					listen[port] = target
				}
			})
		}
	}
	return func(port uint32) uint32 { return cmp.Or(listen[port], port) }
}

// Unprivileged is where a gateway proxy that cannot bind the ports below
// 1024 (an unprivileged pod) listens: where listen says, and nowhere (0)
// for a server whose port listen maps below 1024, whose listener and
// routes are then left out, as istiod skips them for such a proxy.
func Unprivileged(listen func(uint32) uint32) func(uint32) uint32 {
	return func(port uint32) uint32 {
		if l := listen(port); l >= 1024 {
			return l
		}
		return 0
	}
}

// GatewayTargets are the selectors of a set of gateways, each with the
// server ports of the gateways that have it: what, with the services'
// endpoints, decides where their routers listen (see ListenPorts). They
// change with the gateways alone: build them once for a set.
type GatewayTargets struct{ groups []*targetGroup }

// targetGroup is one selector and its gateways' server ports.
type targetGroup struct {
	key      string
	selector map[string]string
	ports    map[uint32]bool
}

// NewGatewayTargets groups gateways by selector (gateways mostly share a
// few), in the order of their keys.
func NewGatewayTargets(gws []*Gateway) GatewayTargets {
	by := map[string]*targetGroup{}
	for _, g := range gws {
		if len(g.Spec.Selector) == 0 {
			continue
		}
		key := fmt.Sprint(g.Spec.Selector) // fmt sorts a map's keys
		if by[key] == nil {
			by[key] = &targetGroup{key: key, selector: g.Spec.Selector, ports: map[uint32]bool{}}
		}
		for _, srv := range g.Spec.Servers {
			by[key].ports[srv.Port] = true
		}
	}
	var out GatewayTargets
	for _, key := range slices.Sorted(maps.Keys(by)) {
		out.groups = append(out.groups, by[key])
	}
	return out
}

// targets calls fn with each of the group's server ports a service has
// and the port its first endpoint the selector selects listens on for it;
// not at all when the selector selects none.
func (g *targetGroup) targets(s *Service, fn func(port, target uint32)) {
	if !slices.ContainsFunc(s.Spec.Ports, func(p *meshv1.Port) bool { return g.ports[p.Number] }) {
		return
	}
	i := slices.IndexFunc(s.Endpoints, func(ep *meshv1.Endpoint) bool { return model.Selects(g.selector, ep.Labels) })
	if i < 0 {
		return
	}
	for _, p := range s.Spec.Ports {
		if g.ports[p.Number] {
			fn(p.Number, cmp.Or(s.Endpoints[i].Ports[p.Name], p.TargetPort, p.Number))
		}
	}
}

// Print names the gateways' server ports a service maps to target ports:
// when its endpoints change it (the gateway's pods came, or listen
// elsewhere), the routers' listeners are generated again, not only the
// load assignments.
func (t GatewayTargets) Print(s *Service) string {
	var b strings.Builder
	for _, g := range t.groups {
		g.targets(s, func(port, target uint32) { fmt.Fprintf(&b, "%s:%d=%d;", g.key, port, target) })
	}
	return b.String()
}

// CredentialResource is the SDS resource of a credential (a TLS Secret of
// the proxy's namespace): its name as Istio names it,
// "kubernetes://<name>"; its CA certificate is "<that>-cacert".
func CredentialResource(name string) string {
	if strings.HasPrefix(name, "kubernetes://") {
		return name
	}
	return "kubernetes://" + name
}

// GatewayRoutes returns a router's route configurations: per plain HTTP
// port (named by the port listen maps it to), and per TLS-terminating
// server, a virtual host for every host of the rules bound to a gateway
// whose server admits the host, holding the routes of all those rules
// (see gatewayHost.routes).
func GatewayRoutes(m *Mesh, gws []*Gateway, listen func(uint32) uint32) []*route.RouteConfiguration {
	ports, tls := gatewayPorts(gws)
	var out []*route.RouteConfiguration
	named := map[string]bool{}
	// build routes the servers on port that take selects.
	build := func(name string, port uint32, take func(*Gateway, *meshv1.GatewayServer) bool) {
		if named[name] {
			return // two server ports on one target port: the first wins
		}
		named[name] = true
		rc := &route.RouteConfiguration{Name: name, ValidateClusters: wrapperspb.Bool(false), IgnorePortInHostMatching: true}
		hosts := map[string]*gatewayHost{}
		for _, g := range gws {
			for _, srv := range g.Spec.Servers {
				if srv.Port != port || !take(g, srv) {
					continue
				}
				for _, r := range m.Routes {
					if !boundTo(r, g) {
						continue
					}
					var groups []routeGroup
					for _, host := range r.Rule.Hosts {
						if !admits(srv, g.Namespace, r.Namespace, host) {
							continue
						}
						domain := strings.ToLower(host)
						gh := hosts[domain]
						if gh == nil {
							// The port is ignored in host matching.
							gh = &gatewayHost{rules: map[*Route]bool{}, vh: &route.VirtualHost{Name: host + ":" + strconv.FormatUint(uint64(port), 10),
								Domains: []string{domain}, IncludeRequestAttemptCount: true}}
							hosts[domain] = gh
							rc.VirtualHosts = append(rc.VirtualHosts, gh.vh)
						}
						if srv.GetTls().GetHttpsRedirect() {
							gh.vh.RequireTls = route.VirtualHost_ALL
						}
						if gh.rules[r] {
							continue // admitted by two servers: routed once
						}
						gh.rules[r] = true
						if groups == nil {
							groups = httpRouteGroups(m, r, g, port, true)
						}
						gh.groups = append(gh.groups, groups...)
						gh.gatewayAPI = gh.gatewayAPI || r.Rule.GetGatewayApi()
					}
				}
			}
		}
		for _, vh := range rc.VirtualHosts {
			vh.Routes = hosts[vh.Domains[0]].routes()
		}
		out = append(out, rc)
	}
	for _, port := range ports {
		if listen(port) == 0 {
			continue // no listener names them (Unprivileged)
		}
		if !tls[port] {
			// Named by the port the gateway listens on, as its listener
			// refers to them.
			build(GatewayRouteName(listen(port)), port, func(_ *Gateway, srv *meshv1.GatewayServer) bool { return gatewayHTTP(srv) })
			continue
		}
		for _, g := range gws {
			for _, srv := range g.Spec.Servers {
				if srv.Port == port && gatewayTerminates(srv) {
					// Servers of one name (a port name given twice) share it.
					name := gatewayHTTPSRouteName(g, srv)
					build(name, port, func(og *Gateway, os *meshv1.GatewayServer) bool {
						return gatewayTerminates(os) && gatewayHTTPSRouteName(og, os) == name
					})
				}
			}
		}
	}
	return out
}

// gatewayHost gathers a gateway virtual host's routes: those of every rule
// bound to a gateway whose server admits the host, as istiod merges them.
type gatewayHost struct {
	vh         *route.VirtualHost
	rules      map[*Route]bool
	groups     []routeGroup
	gatewayAPI bool
}

// routes are the host's routes: its rules' in their order (the Gateway
// API's ranked by precedence across its routes, as their matches rank, up
// to the first that matches every request), then the catch-all routes,
// as istiod moves them last.
func (gh *gatewayHost) routes() []*route.Route {
	groups := gh.groups
	if gh.gatewayAPI {
		// The Gateway API's routes of a host are one list, up to the
		// first catch-all route, as istiod merges them.
		model.SortByPrecedence(groups, func(g routeGroup) *meshv1.HTTPRoute { return g.rule })
		if i := slices.IndexFunc(groups, func(g routeGroup) bool { return isCatchAll(g.routes[len(g.routes)-1].Match) }); i >= 0 {
			groups = groups[:i+1]
		}
	}
	var out, catchAll []*route.Route
	for _, g := range groups {
		for _, r := range g.routes {
			if isCatchAll(r.Match) {
				catchAll = append(catchAll, r)
			} else {
				out = append(out, r)
			}
		}
	}
	return append(out, catchAll...)
}

// isCatchAll reports whether a route matches every request: the path "/"
// as a prefix (or ".*" as an expression) and nothing else.
func isCatchAll(m *route.RouteMatch) bool {
	var all bool
	switch p := m.GetPathSpecifier().(type) {
	case *route.RouteMatch_Prefix:
		all = p.Prefix == "/"
	case *route.RouteMatch_PathSeparatedPrefix:
		all = p.PathSeparatedPrefix == "/"
	case *route.RouteMatch_SafeRegex:
		all = p.SafeRegex.GetRegex() == ".*"
	}
	return all && len(m.GetHeaders()) == 0 && len(m.GetQueryParameters()) == 0 && len(m.GetDynamicMetadata()) == 0
}

// boundTo reports whether a route rule names the gateway, and may bind to
// it: a Kubernetes Gateway's listener takes the Gateway API's routes
// alone (its allowedRoutes decided which), an Istio Gateway the
// VirtualServices alone.
func boundTo(r *Route, g *Gateway) bool {
	return namesGateway(r.Rule.Gateways, r.Namespace, g) && r.Rule.GetGatewayApi() == g.Spec.GetGatewayApi()
}

// namesGateway reports whether gateway names of a rule in namespace ns
// name the gateway g ("<ns>/<name>", or "<name>" in the rule's own
// namespace), or the sidecars ("mesh") when g is nil.
func namesGateway(names []string, ns string, g *Gateway) bool {
	for _, name := range names {
		if g == nil && name == "mesh" {
			return true
		}
		if g != nil && (name == g.Key() || (name == g.Name && ns == g.Namespace)) {
			return true
		}
	}
	return false
}

// admits reports whether a gateway server's hosts ("[<ns>/]<host>", ns "*",
// "." for the gateway's own) admit a host of a rule in namespace ruleNS.
func admits(srv *meshv1.GatewayServer, gatewayNS, ruleNS, host string) bool {
	for _, h := range srv.Hosts {
		ns, pattern, found := strings.Cut(h, "/")
		if !found {
			ns, pattern = "*", h
		}
		if ns == "." {
			ns = gatewayNS
		}
		if (ns == "*" || ns == ruleNS) && hostMatches(pattern, host) {
			return true
		}
	}
	return false
}
