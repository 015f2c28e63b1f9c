package generate

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	mongoproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/mongo_proxy/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Istio's names for the sidecar's catch-all clusters and virtual listeners.
const (
	PassthroughCluster        = "PassthroughCluster"
	BlackHoleCluster          = "BlackHoleCluster"
	InboundPassthroughCluster = "InboundPassthroughCluster"
	VirtualOutboundListener   = "virtualOutbound"
	VirtualInboundListener    = "virtualInbound"
	virtualOutboundPort       = 15001
	virtualInboundPort        = 15006
)

// sidecarClusters are the catch-all clusters every sidecar gets: traffic to
// where the client dialled (outbound and inbound passthrough), and nowhere.
func sidecarClusters(m *Mesh) []*cluster.Cluster {
	// The passthrough clusters speak the caller's HTTP version, close
	// idle connections after 5 minutes and set no limit, as istiod's; the
	// inbound one connects from 127.0.0.6, which the capture rules let
	// through, as the inbound clusters do.
	originalDst := func(name string) *cluster.Cluster {
		return &cluster.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
			ConnectTimeout:       m.connectTimeout(),
			CircuitBreakers:      &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{defaultThresholds()}},
			TypedExtensionProtocolOptions: map[string]*anypb.Any{httpProtocolOptions: mustAny(&upstreamhttp.HttpProtocolOptions{
				CommonHttpProtocolOptions: &core.HttpProtocolOptions{IdleTimeout: durationpb.New(5 * time.Minute)},
				UpstreamProtocolOptions: &upstreamhttp.HttpProtocolOptions_UseDownstreamProtocolConfig{
					UseDownstreamProtocolConfig: &upstreamhttp.HttpProtocolOptions_UseDownstreamHttpConfig{
						HttpProtocolOptions: &core.Http1ProtocolOptions{}, Http2ProtocolOptions: &core.Http2ProtocolOptions{}}},
			})},
		}
	}
	inbound := originalDst(InboundPassthroughCluster)
	inbound.UpstreamBindConfig = &core.BindConfig{SourceAddress: socketAddress("127.0.0.6", 0).GetSocketAddress()}
	return []*cluster.Cluster{
		originalDst(PassthroughCluster),
		inbound,
		{
			Name:                 BlackHoleCluster,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
			ConnectTimeout:       m.connectTimeout(),
		},
	}
}

func tcpProxyFilter(statPrefix, clusterName string) *listener.Filter {
	return &listener.Filter{
		Name: "envoy.filters.network.tcp_proxy",
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxy.TcpProxy{
			StatPrefix:       statPrefix,
			ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: clusterName},
		})},
	}
}

// virtualListeners are the sidecar's traffic-capture listeners: 15001
// takes every outbound connection and hands it to the listener of its
// original destination port, passing through what has none; 15006 takes
// inbound connections to the workload, by their original destination
// port, passing through what no inbound port matches as the workload's
// policies allow (see inboundPassthroughChains). A connection to either
// port itself goes to the black hole, which keeps a connection from
// looping through its own listener. They accept one connection per
// socket event, as istiod's.
func virtualListeners(m *Mesh, sec Security) []*listener.Listener {
	inbound := append([]*listener.FilterChain{blackholeChain(virtualInboundChainBlackhole, virtualInboundPort)},
		append(inboundChains(m, sec), inboundPassthroughChains(m, sec)...)...)
	return []*listener.Listener{
		{
			Name:           VirtualOutboundListener,
			Address:        socketAddress("0.0.0.0", virtualOutboundPort),
			UseOriginalDst: wrapperspb.Bool(true),
			FilterChains: []*listener.FilterChain{
				blackholeChain(virtualOutboundChainBlackhole, virtualOutboundPort),
				{
					Name:    virtualOutboundChainCatchAll,
					Filters: []*listener.Filter{tcpProxyFilter(outboundDefault(m), outboundDefault(m))},
				},
			},
			TrafficDirection:                     core.TrafficDirection_OUTBOUND,
			MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1),
		},
		{
			Name:                                 VirtualInboundListener,
			Address:                              socketAddress("0.0.0.0", virtualInboundPort),
			ListenerFilters:                      inboundListenerFilters(inbound),
			FilterChains:                         inbound,
			TrafficDirection:                     core.TrafficDirection_INBOUND,
			ListenerFiltersTimeout:               cmp.Or(m.Config.GetProtocolDetectionTimeout(), durationpb.New(0)),
			ContinueOnListenerFiltersTimeout:     true,
			MaxConnectionsToAcceptPerSocketEvent: wrapperspb.UInt32(1),
		},
	}
}

// Istio's names of the virtual listeners' own chains.
const (
	virtualInboundChainBlackhole  = "virtualInbound-blackhole"
	virtualOutboundChainBlackhole = "virtualOutbound-blackhole"
	virtualOutboundChainCatchAll  = "virtualOutbound-catchall-tcp"
)

// blackholeChain sends connections to a virtual listener's own port to the
// black hole.
func blackholeChain(name string, port uint32) *listener.FilterChain {
	return &listener.FilterChain{
		Name:             name,
		FilterChainMatch: &listener.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port)},
		Filters:          []*listener.Filter{tcpProxyFilter(BlackHoleCluster, BlackHoleCluster)},
	}
}

// tcpListeners are a sidecar's outbound listeners for opaque TCP and TLS,
// as Istio generates them: a TCP service with virtual IPs gets a listener
// on each ("<vip>_<port>"), so TCP services sharing a port are told apart
// by the address dialled; a port's wildcard listener ("0.0.0.0_<port>")
// sends TLS by SNI to the service of that name (TLS and HTTPS ports), and
// the rest to the first TCP service without virtual IPs on the port, or
// where the outbound traffic policy sends unknown destinations. Where a
// VirtualService names the host, its tcp or tls routes decide.
func tcpListeners(m *Mesh) []*listener.Listener {
	t := tcpPortsOf(m)
	return append(t.portListeners(m), t.vipListeners(m)...)
}

// vip is a service's virtual IP and port.
type vip struct {
	addr string
	port uint32
}

// tcpPorts are the TCP and TLS ports of the mesh's services, as the
// outbound listeners serve them: at a virtual IP, by SNI, or the port's
// first owner.
type tcpPorts struct {
	vips  map[vip][]*listener.Filter
	owner map[uint32][]*listener.Filter
	sni   map[uint32][]*listener.FilterChain
	named map[uint32]map[string]bool
	http  map[uint32]bool
}

func tcpPortsOf(m *Mesh) tcpPorts {
	t := tcpPorts{vips: map[vip][]*listener.Filter{}, owner: map[uint32][]*listener.Filter{}, sni: map[uint32][]*listener.FilterChain{},
		named: map[uint32]map[string]bool{}, http: map[uint32]bool{}}
	for _, s := range m.Services {
		if !s.routable() {
			continue
		}
		for _, h := range m.Owned(s) {
			for _, p := range s.Spec.Ports {
				t.add(m, s, h, p)
			}
		}
	}
	return t
}

// add takes a port of a service's host.
func (t tcpPorts) add(m *Mesh, s *Service, h string, p *meshv1.Port) {
	switch {
	case isHTTP(p):
		t.http[p.Number] = true
	case (isTCP(p) || isTLS(p)) && len(s.Spec.Addresses) > 0 && !m.routesTLS(h):
		// At its virtual IPs, whatever SNI a client sends, as istiod has
		// it (a TLS port without tls routes).
		for _, a := range s.Spec.Addresses {
			if _, taken := t.vips[vip{a, p.Number}]; !taken {
				t.vips[vip{a, p.Number}] = l4Filters(p, l4Proxy(ClusterName(p.Number, "", h), l4Targets(m, h, p.Number, false)))
			}
		}
	case isTLS(p):
		if t.named[p.Number] == nil {
			t.named[p.Number] = map[string]bool{}
		}
		if t.named[p.Number][h] {
			return // one chain per name: Envoy refuses two
		}
		t.named[p.Number][h] = true
		t.sni[p.Number] = append(t.sni[p.Number], &listener.FilterChain{
			Name:             ClusterName(p.Number, "", h),
			FilterChainMatch: &listener.FilterChainMatch{ServerNames: []string{h}},
			Filters:          l4Filters(p, l4Proxy(ClusterName(p.Number, "", h), l4Targets(m, h, p.Number, true))),
		})
	case isTCP(p):
		if _, taken := t.owner[p.Number]; !taken {
			t.owner[p.Number] = l4Filters(p, l4Proxy("outbound|"+strconv.FormatUint(uint64(p.Number), 10)+"||", l4Targets(m, h, p.Number, false)))
		}
	}
}

// portListeners are the listeners of the ports (0.0.0.0_<port>) no HTTP
// service uses: by SNI, else to the port's owner.
func (t tcpPorts) portListeners(m *Mesh) []*listener.Listener {
	var out []*listener.Listener
	ports := map[uint32]bool{}
	for p := range t.owner {
		ports[p] = true
	}
	for p := range t.sni {
		ports[p] = true
	}
	for _, port := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		if t.http[port] {
			continue // HTTP wins a port both use, as in Istio
		}
		num := strconv.FormatUint(uint64(port), 10)
		l := &listener.Listener{
			Name:       "0.0.0.0_" + num,
			Address:    socketAddress("0.0.0.0", port),
			BindToPort: wrapperspb.Bool(false),
		}
		if chains := t.sni[port]; len(chains) > 0 {
			l.ListenerFilters = []*listener.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector",
				ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})}}}
			l.FilterChains = chains
			fallback := t.owner[port]
			if fallback == nil {
				fallback = []*listener.Filter{tcpProxyFilter("outbound|"+num+"||", outboundDefault(m))}
			}
			l.DefaultFilterChain = &listener.FilterChain{Name: "default", Filters: fallback}
		} else {
			l.FilterChains = []*listener.FilterChain{{Filters: t.owner[port]}}
		}
		out = append(out, l)
	}
	return out
}

// vipListeners are the listeners of the services' virtual IPs
// (<address>_<port>).
func (t tcpPorts) vipListeners(m *Mesh) []*listener.Listener {
	var out []*listener.Listener
	for _, v := range slices.SortedFunc(maps.Keys(t.vips), func(a, b vip) int { return cmp.Or(cmp.Compare(a.addr, b.addr), cmp.Compare(a.port, b.port)) }) {
		num := strconv.FormatUint(uint64(v.port), 10)
		out = append(out, &listener.Listener{
			Name:                             v.addr + "_" + num,
			Address:                          socketAddress(v.addr, v.port),
			BindToPort:                       wrapperspb.Bool(false),
			TrafficDirection:                 core.TrafficDirection_OUTBOUND,
			ListenerFiltersTimeout:           cmp.Or(m.Config.GetProtocolDetectionTimeout(), durationpb.New(0)),
			ContinueOnListenerFiltersTimeout: true,
			FilterChains: []*listener.FilterChain{{Filters: t.vips[v],
				TransportSocketConnectTimeout: durationpb.New(15 * time.Second)}},
		})
	}
	return out
}

// isTCP reports whether a port carries TCP the proxy proxies as such
// (MongoDB's included).
func isTCP(p *meshv1.Port) bool {
	return p.Protocol == meshv1.Protocol_PROTOCOL_TCP || p.Protocol == meshv1.Protocol_PROTOCOL_MONGO
}

// l4Filters are the network filters of a port's TCP proxy: for MongoDB,
// Envoy's mongo_proxy first with the proxy's stat prefix, as istiod sends
// them.
func l4Filters(p *meshv1.Port, proxy *listener.Filter) []*listener.Filter {
	if p.Protocol != meshv1.Protocol_PROTOCOL_MONGO {
		return []*listener.Filter{proxy}
	}
	return []*listener.Filter{mongoFilter(statPrefixOf(proxy)), proxy}
}

// mongoFilter is Envoy's MongoDB filter, counting under statPrefix.
func mongoFilter(statPrefix string) *listener.Filter {
	return &listener.Filter{Name: "envoy.filters.network.mongo_proxy",
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&mongoproxy.MongoProxy{StatPrefix: statPrefix})}}
}

// statPrefixOf reads the stat prefix of a TCP proxy filter.
func statPrefixOf(f *listener.Filter) string {
	var t tcpproxy.TcpProxy
	if err := f.GetTypedConfig().UnmarshalTo(&t); err != nil {
		return ""
	}
	return t.StatPrefix
}

// isTLS reports whether a port carries TLS the proxy does not terminate.
func isTLS(p *meshv1.Port) bool {
	return p.Protocol == meshv1.Protocol_PROTOCOL_TLS || p.Protocol == meshv1.Protocol_PROTOCOL_HTTPS
}

// routesTLS reports whether a route rule routes a host's TLS by SNI.
func (m *Mesh) routesTLS(host string) bool {
	r := m.routeByHost[host]
	return r != nil && len(r.Rule.GetTls()) > 0
}

// l4Target is a weighted cluster of a tcp or tls route.
type l4Target struct {
	cluster string
	weight  uint32
}

// l4Targets are where a sidecar sends a connection for host:port: the
// destinations of the first tcp (or, for TLS, tls) route of the
// VirtualService naming the host that matches it, else the host's cluster.
func l4Targets(m *Mesh, host string, port uint32, tls bool) []l4Target {
	rr := m.routeByHost[host]
	if rr != nil {
		routes := rr.Rule.Tcp
		if tls {
			routes = rr.Rule.Tls
		}
		for _, r := range routes {
			if !l4Matches(m, r, rr.Namespace, nil, host, port, tls) {
				continue
			}
			if targets := resolveTargets(m, r.Route, port); len(targets) > 0 {
				return targets
			}
		}
	}
	return []l4Target{{cluster: ClusterName(port, "", host), weight: 1}}
}

// l4Matches reports whether a tcp or tls route applies to connections for
// host:port at a gateway (nil: at a sidecar): a route without matches
// applies to all; a tls match must name the host among its SNI hosts.
func l4Matches(m *Mesh, r *meshv1.L4Route, ns string, gw *Gateway, host string, port uint32, tls bool) bool {
	if len(r.Match) == 0 {
		return !tls
	}
	for _, lm := range r.Match {
		if lm.Port != 0 && lm.Port != port {
			continue
		}
		if len(lm.Gateways) > 0 && !namesGateway(lm.Gateways, ns, gw) {
			continue
		}
		if !m.fromSource(gw, lm.SourceLabels, lm.SourceNamespace) {
			continue
		}
		if tls && !slices.ContainsFunc(lm.SniHosts, func(p string) bool { return hostMatches(p, host) }) {
			continue
		}
		return true
	}
	return false
}

// resolveTargets turns route destinations into weighted clusters, leaving
// out those that name no service port or subset.
func resolveTargets(m *Mesh, ds []*meshv1.RouteDestination, listenerPort uint32) []l4Target {
	var out []l4Target
	for _, d := range ds {
		dst := d.GetDestination()
		s := m.Service(dst.GetHost())
		if s == nil || !s.routable() {
			continue
		}
		port := destinationPort(s, dst.GetPort(), listenerPort)
		if port == 0 || (dst.GetSubset() != "" && s.subset(dst.GetSubset()) == nil) || (len(ds) > 1 && d.Weight == 0) {
			continue
		}
		out = append(out, l4Target{ClusterName(port, dst.GetSubset(), m.Resolve(dst.GetHost())), max(d.Weight, 1)})
	}
	return out
}

// l4Proxy is a TCP proxy to targets: one cluster, or weighted clusters.
func l4Proxy(statPrefix string, targets []l4Target) *listener.Filter {
	if len(targets) == 1 {
		return tcpProxyFilter(statPrefix, targets[0].cluster)
	}
	weighted := &tcpproxy.TcpProxy_WeightedCluster{}
	for _, t := range targets {
		weighted.Clusters = append(weighted.Clusters, &tcpproxy.TcpProxy_WeightedCluster_ClusterWeight{Name: t.cluster, Weight: t.weight})
	}
	return &listener.Filter{
		Name: "envoy.filters.network.tcp_proxy",
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxy.TcpProxy{
			StatPrefix: statPrefix, ClusterSpecifier: &tcpproxy.TcpProxy_WeightedClusters{WeightedClusters: weighted}})},
	}
}

// outboundDefault is where an Envoy sends traffic to a destination no
// service names: passed through (ALLOW_ANY) or into the black hole
// (REGISTRY_ONLY).
func outboundDefault(m *Mesh) string {
	if m.RegistryOnly {
		return BlackHoleCluster
	}
	return PassthroughCluster
}

// The virtual host an Envoy's route configuration ends with, for HTTP to
// hosts no service names, as Istio's: sent on where it was going
// (ALLOW_ANY) or answered 502 (REGISTRY_ONLY). One object each, shared by
// every route configuration.
var (
	allowAnyHost = &route.VirtualHost{Name: "allow_any", Domains: []string{"*"}, IncludeRequestAttemptCount: true, Routes: []*route.Route{{
		Name:   "allow_any",
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: passthroughAction()},
	}}}
	blockAllHost = &route.VirtualHost{Name: "block_all", Domains: []string{"*"}, IncludeRequestAttemptCount: true, Routes: []*route.Route{{
		Name:   "block_all",
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_DirectResponse{DirectResponse: &route.DirectResponseAction{Status: 502}},
	}}}
)

// passthroughAction sends a request on to where it was going, without a
// timeout, gRPC's included, as istiod's.
func passthroughAction() *route.RouteAction {
	a := &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: PassthroughCluster}, Timeout: durationpb.New(0)}
	//lint:ignore SA1019 the field istiod sets
	a.MaxGrpcTimeout = durationpb.New(0)
	return a
}

func catchAllHost(m *Mesh) *route.VirtualHost {
	if m.RegistryOnly {
		return blockAllHost
	}
	return allowAnyHost
}
