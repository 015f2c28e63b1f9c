package generate

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
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

// gatewayHTTPSRouteName names the routes of the TLS-terminating servers on a port.
func gatewayHTTPSRouteName(port uint32) string {
	return "https." + strconv.FormatUint(uint64(port), 10)
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

// gatewayRouteName returns the route configuration a server's traffic is
// routed by, or "" for a server that is not routed.
func gatewayRouteName(s *meshv1.GatewayServer) string {
	switch {
	case gatewayHTTP(s):
		return GatewayRouteName(s.Port)
	case gatewayTerminates(s):
		return gatewayHTTPSRouteName(s.Port)
	}
	return ""
}

// gatewayPorts returns the routed ports of the gateways, in order, and
// whether each terminates TLS (a port where any server does).
func gatewayPorts(gws []*Gateway) ([]uint32, map[uint32]bool) {
	tls := map[uint32]bool{}
	for _, g := range gws {
		for _, s := range g.Spec.Servers {
			if gatewayRouteName(s) != "" {
				tls[s.Port] = tls[s.Port] || gatewayTerminates(s)
			}
		}
	}
	return slices.SortedFunc(maps.Keys(tls), cmp.Compare), tls
}

// GatewayListeners returns a router's listeners: one bound listener per
// routed port of its gateways. A plain HTTP port routes through
// "http.<port>"; a TLS port has a filter chain per terminating server,
// chosen by SNI among the server's hosts, with the server's certificate
// from SDS (its credential name; "default" for ISTIO_MUTUAL), and routes
// through "https.<port>".
func GatewayListeners(gws []*Gateway) []*listener.Listener {
	ports, tls := gatewayPorts(gws)
	var out []*listener.Listener
	for _, port := range ports {
		num := strconv.FormatUint(uint64(port), 10)
		l := &listener.Listener{Name: "0.0.0.0_" + num, Address: socketAddress("0.0.0.0", port)}
		manager := func(routeName string) []*listener.Filter {
			return []*listener.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(httpConnectionManager("gateway_"+num, routeName))},
			}}
		}
		if !tls[port] {
			l.FilterChains = []*listener.FilterChain{{Filters: manager(GatewayRouteName(port))}}
			out = append(out, l)
			continue
		}
		l.ListenerFilters = []*listener.ListenerFilter{{
			Name:       "envoy.filters.listener.tls_inspector",
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})},
		}}
		seen := map[string]bool{}
		for _, g := range gws {
			for _, srv := range g.Spec.Servers {
				if srv.Port != port || !gatewayTerminates(srv) {
					continue
				}
				names := serverNames(srv)
				key := strings.Join(names, ",")
				if seen[key] {
					continue // Envoy rejects two chains with one match; the first server wins
				}
				seen[key] = true
				l.FilterChains = append(l.FilterChains, &listener.FilterChain{
					Name:             g.Key() + "/" + cmp.Or(srv.Name, num),
					FilterChainMatch: &listener.FilterChainMatch{ServerNames: names},
					TransportSocket:  downstreamTLS(srv.Tls),
					Filters:          manager(gatewayHTTPSRouteName(port)),
				})
			}
		}
		out = append(out, l)
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
	cert := t.CredentialName
	if t.Mode == "ISTIO_MUTUAL" || cert == "" {
		cert = "default"
	}
	ctx := &tlsv3.DownstreamTlsContext{CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{sds(cert)},
		AlpnProtocols:                  []string{"h2", "http/1.1"},
	}}
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

// GatewayRoutes returns a router's route configurations: per routed port
// (and, on a TLS port, for its terminating servers), a virtual host for
// every host of the VirtualServices bound to a gateway whose server on
// that port admits the host.
func GatewayRoutes(m *Mesh, gws []*Gateway) []*route.RouteConfiguration {
	ports, tls := gatewayPorts(gws)
	var out []*route.RouteConfiguration
	for _, port := range ports {
		name := GatewayRouteName(port)
		if tls[port] {
			name = gatewayHTTPSRouteName(port)
		}
		rc := &route.RouteConfiguration{Name: name, ValidateClusters: wrapperspb.Bool(false)}
		seen := map[string]bool{}
		for _, g := range gws {
			for _, srv := range g.Spec.Servers {
				if srv.Port != port || gatewayRouteName(srv) != name {
					continue
				}
				for _, r := range m.Routes {
					if !boundTo(r, g) {
						continue
					}
					for _, host := range r.Rule.Hosts {
						if seen[host] || !admits(srv, g.Namespace, r.Namespace, host) {
							continue
						}
						seen[host] = true
						vh := &route.VirtualHost{Name: host + ":" + strconv.FormatUint(uint64(port), 10), Domains: []string{host, host + ":" + strconv.FormatUint(uint64(port), 10)}}
						if srv.GetTls().GetHttpsRedirect() {
							vh.RequireTls = route.VirtualHost_ALL
						}
						vh.Routes = httpRoutes(m, r, g, port)
						rc.VirtualHosts = append(rc.VirtualHosts, vh)
					}
				}
			}
		}
		out = append(out, rc)
	}
	return out
}

// boundTo reports whether a route rule names the gateway.
func boundTo(r *Route, g *Gateway) bool { return namesGateway(r.Rule.Gateways, r.Namespace, g) }

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
