package generate

import (
	"cmp"
	"maps"
	"slices"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
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
				c.TransportSocket = inboundMutualTLS(m, name == catchAllHTTPChain)
			}
			return c
		}
		var set []*listener.FilterChain
		switch pm.mode {
		case meshv1.MTLSMode_MTLS_MODE_STRICT:
			set = append(set, chain(catchAllHTTPChain, "tls", mutualHTTPALPNs, true), chain(catchAllTCPChain, "tls", nil, true))
		case meshv1.MTLSMode_MTLS_MODE_PERMISSIVE:
			set = append(set, chain(catchAllHTTPChain, "tls", mutualHTTPALPNs, true), chain(catchAllHTTPChain, "raw_buffer", plaintextHTTPALP, false),
				chain(catchAllTCPChain, "tls", mutualTCPALPNs, true), chain(catchAllTCPChain, "raw_buffer", nil, false),
				chain(catchAllTCPChain, "tls", nil, false))
		default:
			set = append(set, chain(catchAllHTTPChain, "raw_buffer", plaintextHTTPALP, false))
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
// an inbound one (see inboundManager) to the inbound passthrough cluster,
// its spans named ":0/*" as istiod names them.
func passthroughManager(m *Mesh, sec Security) *listener.Filter {
	return inboundManager(m, sec, InboundPassthroughCluster, "inbound|http|0", false, ":0/*")
}

// inboundListenerFilters are the virtual inbound listener's filters: the
// original destination, then the TLS inspector and after it the HTTP
// inspector (which must follow it), each where a chain matches on what it
// finds (TLS; a plaintext HTTP ALPN), and each turned off on the ports
// whose chains do not need it, as istiod's: a declared port's chains are
// told apart by the port, the listener's own port by nothing.
func inboundListenerFilters(chains []*listener.FilterChain) []*listener.ListenerFilter {
	type needs struct{ tls, http bool }
	ports := map[uint32]needs{}
	var tls, http bool
	for _, c := range chains {
		match := c.GetFilterChainMatch()
		port := match.GetDestinationPort().GetValue()
		n := ports[port]
		n.tls = n.tls || match.GetTransportProtocol() == "tls"
		n.http = n.http || slices.ContainsFunc(match.GetApplicationProtocols(), func(a string) bool { return a == "http/1.1" || a == "h2c" })
		ports[port] = n
		tls, http = tls || n.tls, http || n.http
	}
	// where lists the ports whose chains need an inspector (or do not),
	// with or without the passthrough's (port 0).
	where := func(need func(needs) bool, want, withPassthrough bool) []uint32 {
		var out []uint32
		for p, n := range ports {
			if (p != 0 || withPassthrough) && need(n) == want {
				out = append(out, p)
			}
		}
		slices.Sort(out)
		return out
	}
	out := []*listener.ListenerFilter{originalDstFilter()}
	if tls {
		// Where the passthrough chains need it, it is off on the ports
		// that do not; otherwise on only on the ports that do.
		need := func(n needs) bool { return n.tls }
		disabled := portsPredicate(where(need, false, false))
		if !ports[0].tls {
			disabled = &listener.ListenerFilterChainMatchPredicate{Rule: &listener.ListenerFilterChainMatchPredicate_NotMatch{
				NotMatch: portsPredicate(where(need, true, false))}}
		}
		out = append(out, &listener.ListenerFilter{Name: "envoy.filters.listener.tls_inspector",
			ConfigType:     &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{InitialReadBufferSize: wrapperspb.UInt32(512)})},
			FilterDisabled: disabled})
	}
	if http {
		out = append(out, &listener.ListenerFilter{Name: "envoy.filters.listener.http_inspector",
			ConfigType:     &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&httpinspector.HttpInspector{})},
			FilterDisabled: portsPredicate(where(func(n needs) bool { return n.http }, false, true))})
	}
	return out
}

// portsPredicate matches connections to any of ports (nil for none).
func portsPredicate(ports []uint32) *listener.ListenerFilterChainMatchPredicate {
	if len(ports) == 0 {
		return nil
	}
	rules := make([]*listener.ListenerFilterChainMatchPredicate, len(ports))
	for i, p := range ports {
		rules[i] = &listener.ListenerFilterChainMatchPredicate{Rule: &listener.ListenerFilterChainMatchPredicate_DestinationPortRange{
			DestinationPortRange: &typev3.Int32Range{Start: int32(p), End: int32(p) + 1}}}
	}
	if len(rules) == 1 {
		return rules[0]
	}
	return &listener.ListenerFilterChainMatchPredicate{Rule: &listener.ListenerFilterChainMatchPredicate_OrMatch{
		OrMatch: &listener.ListenerFilterChainMatchPredicate_MatchSet{Rules: rules}}}
}
