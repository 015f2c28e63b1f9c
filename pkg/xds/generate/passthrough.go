package generate

import (
	"cmp"
	"maps"
	"slices"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The passthrough chains of the virtual inbound listener take what no
// inbound port matches: a port no Service declares. They are held to the
// workload's PeerAuthentication and AuthorizationPolicies as a declared
// port is, as istiod holds them: under STRICT only mutual TLS matches a
// chain (a plaintext connection matches none and is closed), and the RBAC
// filters apply. Istio's names: "virtualInbound-catchall-http" for the
// chains that parse HTTP, "virtualInbound" for the TCP ones.
const (
	catchAllHTTPChain = "virtualInbound-catchall-http"
	catchAllTCPChain  = VirtualInboundListener
)

// ALPNs of the passthrough chains' matches, as Istio's clients send them:
// HTTP over Istio's mutual TLS, TCP over it, and plaintext HTTP as the
// HTTP inspector reports it.
var (
	mutualHTTPALPNs  = []string{"istio-http/1.0", "istio-http/1.1", "istio-h2"}
	mutualTCPALPNs   = []string{"istio-peer-exchange", "istio"}
	plaintextHTTPALP = []string{"http/1.1", "h2c"}
)

// passthroughMode is the mutual TLS mode of the passthrough chains of a
// port (0: every port without chains of its own).
type passthroughMode struct {
	port uint32
	mode meshv1.MTLSMode
}

// passthroughModes returns the workload's mode for undeclared ports, then
// a mode per port a selecting PeerAuthentication sets for a port that no
// inbound chain declares, as istiod adds chains for them.
func passthroughModes(m *Mesh, sec Security) []passthroughMode {
	out := []passthroughMode{{0, m.inboundMode(sec, 0)}}
	declared := inboundPorts(m)
	ports := map[uint32]bool{}
	for _, p := range sec {
		if pa, ok := p.Spec.(*meshv1.PeerAuthentication); ok && len(pa.Selector) > 0 {
			for port := range pa.PortModes {
				if _, ok := declared[port]; !ok && port != 0 {
					ports[port] = true
				}
			}
		}
	}
	for _, port := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		out = append(out, passthroughMode{port, m.inboundMode(sec, port)})
	}
	return out
}

// httpPolicies reports whether a class has policies that look into HTTP
// (an AuthorizationPolicy or a RequestAuthentication): only then do its
// passthrough chains parse HTTP (see docs/istio-compatibility.md).
func httpPolicies(sec Security) bool {
	return slices.ContainsFunc(sec, func(p *Policy) bool {
		switch p.Spec.(type) {
		case *meshv1.AuthorizationPolicy, *meshv1.RequestAuthentication:
			return true
		}
		return false
	})
}

// inboundPassthroughChains returns the passthrough chains of an Envoy sidecar's
// virtual inbound listener, for each passthrough mode: under STRICT, HTTP
// and TCP over mutual TLS alone; under PERMISSIVE, those, plaintext HTTP
// and TCP, and TLS the workload terminates itself (passed on as it is);
// otherwise plaintext HTTP and TCP. A class without policies whose Envoys
// have no certificates gets the one plaintext TCP chain.
func inboundPassthroughChains(m *Mesh, sec Security) []*listener.FilterChain {
	if len(sec) == 0 && m.NoCertificates {
		return []*listener.FilterChain{{Name: InboundPassthroughCluster,
			Filters: []*listener.Filter{tcpProxyFilter(InboundPassthroughCluster, InboundPassthroughCluster)}}}
	}
	http := httpPolicies(sec)
	var out []*listener.FilterChain
	for _, pm := range passthroughModes(m, sec) {
		chain := func(name, transport string, alpn []string, mutual bool) *listener.FilterChain {
			c := &listener.FilterChain{Name: name, FilterChainMatch: &listener.FilterChainMatch{TransportProtocol: transport, ApplicationProtocols: alpn}}
			if pm.port != 0 {
				c.FilterChainMatch.DestinationPort = wrapperspb.UInt32(pm.port)
			}
			if name == catchAllHTTPChain {
				c.Filters = []*listener.Filter{passthroughManager(m, sec)}
			} else {
				c.Filters = append(inboundTCPFilters(sec, pm.port), tcpProxyFilter(InboundPassthroughCluster, InboundPassthroughCluster))
			}
			if mutual {
				c.TransportSocket = inboundMutualTLS(m.AgentCertificates)
			}
			return c
		}
		var set []*listener.FilterChain
		switch pm.mode {
		case meshv1.MTLSMode_MTLS_MODE_STRICT:
			if http {
				set = append(set, chain(catchAllHTTPChain, "tls", mutualHTTPALPNs, true))
			}
			set = append(set, chain(catchAllTCPChain, "tls", nil, true))
		case meshv1.MTLSMode_MTLS_MODE_PERMISSIVE:
			if http {
				set = append(set, chain(catchAllHTTPChain, "tls", mutualHTTPALPNs, true), chain(catchAllHTTPChain, "raw_buffer", plaintextHTTPALP, false))
			}
			set = append(set, chain(catchAllTCPChain, "tls", mutualTCPALPNs, true), chain(catchAllTCPChain, "raw_buffer", nil, false),
				chain(catchAllTCPChain, "tls", nil, false))
		default:
			if http {
				set = append(set, chain(catchAllHTTPChain, "raw_buffer", plaintextHTTPALP, false))
			}
			// Plaintext named, as the HTTP chain beside it is: Envoy
			// narrows by transport before ALPN, and a chain naming none
			// would be passed over for the HTTP chain's.
			set = append(set, chain(catchAllTCPChain, "raw_buffer", nil, false))
		}
		out = append(out, set...)
	}
	return out
}

// passthroughManager is the connection manager of a catch-all HTTP chain:
// the class's JWT and RBAC filters, then everything to the inbound
// passthrough cluster.
func passthroughManager(m *Mesh, sec Security) *listener.Filter {
	manager := &hcm.HttpConnectionManager{
		StatPrefix: InboundPassthroughCluster,
		RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
			Name: InboundPassthroughCluster,
			VirtualHosts: []*route.VirtualHost{{
				Name:    "inbound|http|0",
				Domains: []string{"*"},
				Routes: []*route.Route{{
					Name:   "default",
					Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
					Action: &route.Route_Route{Route: inboundAction(InboundPassthroughCluster, false)},
				}},
			}},
		}},
		HttpFilters: append(inboundHTTPFilters(sec), &hcm.HttpFilter{
			Name:       "envoy.filters.http.router",
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})},
		}),
	}
	envoyManager(manager, m.Config, false)
	forwardClientCert(manager)
	return &listener.Filter{
		Name:       "envoy.filters.network.http_connection_manager",
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(manager)},
	}
}

// inboundListenerFilters are the virtual inbound listener's filters: the
// original destination, then the TLS inspector where a chain matches on
// TLS, then the HTTP inspector where one matches plaintext HTTP (after the
// TLS inspector, which it must follow).
func inboundListenerFilters(chains []*listener.FilterChain) []*listener.ListenerFilter {
	out := []*listener.ListenerFilter{originalDstFilter()}
	var tls, http bool
	for _, c := range chains {
		match := c.GetFilterChainMatch()
		tls = tls || match.GetTransportProtocol() == "tls"
		http = http || slices.Contains(match.GetApplicationProtocols(), "http/1.1")
	}
	if tls {
		out = append(out, &listener.ListenerFilter{Name: "envoy.filters.listener.tls_inspector",
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})}})
	}
	if http {
		out = append(out, &listener.ListenerFilter{Name: "envoy.filters.listener.http_inspector",
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&httpinspector.HttpInspector{})}})
	}
	return out
}
