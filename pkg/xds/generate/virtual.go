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
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
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
func sidecarClusters() []*cluster.Cluster {
	originalDst := func(name string) *cluster.Cluster {
		return &cluster.Cluster{
			Name:                 name,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
			ConnectTimeout:       durationpb.New(10 * time.Second),
		}
	}
	return []*cluster.Cluster{
		originalDst(PassthroughCluster),
		originalDst(InboundPassthroughCluster),
		{
			Name:                 BlackHoleCluster,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
			ConnectTimeout:       durationpb.New(10 * time.Second),
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
// port, passing through what no inbound port matches.
func virtualListeners(m *Mesh, sec Security) []*listener.Listener {
	inboundFilters := []*listener.ListenerFilter{originalDstFilter()}
	if needsTLSInspector(m, sec) {
		inboundFilters = append(inboundFilters, &listener.ListenerFilter{Name: "envoy.filters.listener.tls_inspector",
			ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})}})
	}
	return []*listener.Listener{
		{
			Name:           VirtualOutboundListener,
			Address:        socketAddress("0.0.0.0", virtualOutboundPort),
			UseOriginalDst: wrapperspb.Bool(true),
			FilterChains: []*listener.FilterChain{{
				Name:    outboundDefault(m),
				Filters: []*listener.Filter{tcpProxyFilter(outboundDefault(m), outboundDefault(m))},
			}},
		},
		{
			Name:            VirtualInboundListener,
			Address:         socketAddress("0.0.0.0", virtualInboundPort),
			ListenerFilters: inboundFilters,
			FilterChains: append(inboundChains(m, sec), &listener.FilterChain{
				Name:    InboundPassthroughCluster,
				Filters: []*listener.Filter{tcpProxyFilter(InboundPassthroughCluster, InboundPassthroughCluster)},
			}),
		},
	}
}

// tcpListeners forward each TCP-only port to the service that owns it
// (the first, where several share a port: without service addresses a
// port cannot tell them apart).
func tcpListeners(m *Mesh) []*listener.Listener {
	owner := map[uint32]string{}
	http := map[uint32]bool{}
	// A TCP service with virtual IPs gets a listener on each, as in Istio:
	// TCP services sharing a port are told apart by the address dialled.
	type vip struct {
		addr string
		port uint32
	}
	vips := map[vip]string{}
	for _, s := range m.Services {
		if !s.routable() {
			continue
		}
		for _, h := range m.Owned(s) {
			for _, p := range s.Spec.Ports {
				switch {
				case isHTTP(p):
					http[p.Number] = true
				case p.Protocol == meshv1.Protocol_PROTOCOL_TCP && len(s.Spec.Addresses) > 0:
					for _, a := range s.Spec.Addresses {
						if _, taken := vips[vip{a, p.Number}]; !taken {
							vips[vip{a, p.Number}] = ClusterName(p.Number, "", h)
						}
					}
				case p.Protocol == meshv1.Protocol_PROTOCOL_TCP:
					if _, taken := owner[p.Number]; !taken {
						owner[p.Number] = ClusterName(p.Number, "", h)
					}
				}
			}
		}
	}
	var out []*listener.Listener
	for _, port := range slices.SortedFunc(maps.Keys(owner), cmp.Compare) {
		if http[port] {
			continue // HTTP wins a port both use, as in Istio
		}
		num := strconv.FormatUint(uint64(port), 10)
		out = append(out, &listener.Listener{
			Name:         "0.0.0.0_" + num,
			Address:      socketAddress("0.0.0.0", port),
			BindToPort:   wrapperspb.Bool(false),
			FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{tcpProxyFilter("outbound|"+num+"||", owner[port])}}},
		})
	}
	for _, v := range slices.SortedFunc(maps.Keys(vips), func(a, b vip) int { return cmp.Or(cmp.Compare(a.addr, b.addr), cmp.Compare(a.port, b.port)) }) {
		num := strconv.FormatUint(uint64(v.port), 10)
		out = append(out, &listener.Listener{
			Name:         v.addr + "_" + num,
			Address:      socketAddress(v.addr, v.port),
			BindToPort:   wrapperspb.Bool(false),
			FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{tcpProxyFilter(vips[v], vips[v])}}},
		})
	}
	return out
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
	allowAnyHost = &route.VirtualHost{Name: "allow_any", Domains: []string{"*"}, Routes: []*route.Route{{
		Name:  "allow_any",
		Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: PassthroughCluster},
			Timeout: durationpb.New(0)}},
	}}}
	blockAllHost = &route.VirtualHost{Name: "block_all", Domains: []string{"*"}, Routes: []*route.Route{{
		Name:   "block_all",
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_DirectResponse{DirectResponse: &route.DirectResponseAction{Status: 502}},
	}}}
)

func catchAllHost(m *Mesh) *route.VirtualHost {
	if m.RegistryOnly {
		return blockAllHost
	}
	return allowAnyHost
}
