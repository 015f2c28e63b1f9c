package generate

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
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

// GatewayRouteName is Istio's name for a gateway's routes on a port.
func GatewayRouteName(port uint32) string { return "http." + strconv.FormatUint(uint64(port), 10) }

// gatewayHTTP reports whether a gateway server serves plain HTTP that the
// router routes (TLS termination and passthrough are not generated yet).
func gatewayHTTP(s *meshv1.GatewayServer) bool {
	switch s.Protocol {
	case meshv1.Protocol_PROTOCOL_HTTP, meshv1.Protocol_PROTOCOL_HTTP2, meshv1.Protocol_PROTOCOL_GRPC:
		return true
	}
	return false
}

// gatewayPorts returns the HTTP ports of the gateways, in order.
func gatewayPorts(gws []*Gateway) []uint32 {
	ports := map[uint32]bool{}
	for _, g := range gws {
		for _, s := range g.Spec.Servers {
			if gatewayHTTP(s) {
				ports[s.Port] = true
			}
		}
	}
	return slices.SortedFunc(maps.Keys(ports), cmp.Compare)
}

// GatewayListeners returns a router's listeners: one bound listener per HTTP
// port of its gateways, routing through "http.<port>".
func GatewayListeners(gws []*Gateway) []*listener.Listener {
	var out []*listener.Listener
	for _, port := range gatewayPorts(gws) {
		num := strconv.FormatUint(uint64(port), 10)
		out = append(out, &listener.Listener{
			Name:    "0.0.0.0_" + num,
			Address: socketAddress("0.0.0.0", port),
			FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
				Name:       "envoy.filters.network.http_connection_manager",
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(httpConnectionManager("gateway_"+num, GatewayRouteName(port)))},
			}}}},
		})
	}
	return out
}

// GatewayRoutes returns a router's route configurations: per port, a
// virtual host for every host of the VirtualServices bound to a gateway
// whose server on that port admits the host.
func GatewayRoutes(m *Mesh, gws []*Gateway) []*route.RouteConfiguration {
	var out []*route.RouteConfiguration
	for _, port := range gatewayPorts(gws) {
		rc := &route.RouteConfiguration{Name: GatewayRouteName(port), ValidateClusters: wrapperspb.Bool(false)}
		seen := map[string]bool{}
		for _, g := range gws {
			for _, srv := range g.Spec.Servers {
				if srv.Port != port || !gatewayHTTP(srv) {
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
						vh.Routes = httpRoutes(m, r.Rule, port)
						rc.VirtualHosts = append(rc.VirtualHosts, vh)
					}
				}
			}
		}
		out = append(out, rc)
	}
	return out
}

// boundTo reports whether a route rule names the gateway: "<ns>/<name>",
// or "<name>" in the rule's own namespace.
func boundTo(r *Route, g *Gateway) bool {
	for _, name := range r.Rule.Gateways {
		if name == g.Key() || (name == g.Name && r.Namespace == g.Namespace) {
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
