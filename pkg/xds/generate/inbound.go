package generate

import (
	"cmp"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	cors "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	originaldst "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Inbound traffic reaches the workload through inbound clusters, one per
// port the workloads listen on, named as Istio names them
// ("inbound|8080||"). They send each connection on to its original
// destination, the workload's own address and port, from 127.0.0.6 (so
// the capture rules let it through), which makes them independent of the
// workload: a class of proxies shares them. The inbound ports are every
// target port of the services the class sees, not only a workload's own;
// a connection to a port the workload does not serve is refused, as it
// would be without the proxy.

// InboundClusterName returns Istio's name for the inbound cluster of a port.
func InboundClusterName(port uint32) string {
	return "inbound|" + strconv.FormatUint(uint64(port), 10) + "||"
}

// inboundPort is what an inbound port carries.
type inboundPort struct {
	// http: HTTP (or gRPC); grpc: gRPC alone; mongo: MongoDB alone.
	http, grpc, mongo bool
}

// inboundPorts returns the target ports of the services in m whose
// workloads are in the mesh (static resolution; DNS and NONE name
// destinations outside it), and what each carries: a port that some
// service uses for plain TCP is TCP, so that no connection is parsed as
// HTTP that is not; one that some service uses for other HTTP is not
// gRPC alone.
func inboundPorts(m *Mesh) map[uint32]inboundPort {
	ports := map[uint32]inboundPort{}
	if len(m.ingress) > 0 {
		// The Sidecar's ingress listeners say them.
		for _, il := range m.ingress {
			ports[il.Port] = inboundPort{http: isHTTP(&meshv1.Port{Protocol: il.Protocol}), grpc: il.Protocol == meshv1.Protocol_PROTOCOL_GRPC}
		}
		return ports
	}
	for _, s := range m.Services {
		if s.Spec.Resolution != meshv1.Resolution_RESOLUTION_STATIC {
			continue
		}
		for _, p := range s.Spec.Ports {
			target := cmp.Or(p.TargetPort, p.Number)
			was, seen := ports[target]
			ports[target] = inboundPort{http: isHTTP(p) && (!seen || was.http), grpc: p.Protocol == meshv1.Protocol_PROTOCOL_GRPC && (!seen || was.grpc),
				mongo: p.Protocol == meshv1.Protocol_PROTOCOL_MONGO && (!seen || was.mongo)}
		}
	}
	return ports
}

// inboundAction sends a request to the workload with no timeout (the
// caller's proxy applied one) and, unless it is a gRPC call (a stream may
// have started), retries it twice when the connection was reset before
// the request went out, as istiod does.
func inboundAction(cluster string, grpc bool) *route.RouteAction {
	a := &route.RouteAction{
		ClusterSpecifier:  &route.RouteAction_Cluster{Cluster: cluster},
		Timeout:           noTimeout(),
		MaxStreamDuration: &route.RouteAction_MaxStreamDuration{MaxStreamDuration: noTimeout(), GrpcTimeoutHeaderMax: noTimeout()},
	}
	if !grpc {
		a.RetryPolicy = &route.RetryPolicy{RetryOn: "reset-before-request", NumRetries: wrapperspb.UInt32(2)}
	}
	return a
}

// InboundClusters returns the inbound clusters of a class of Envoy
// sidecars; proxyless clients have none.
func InboundClusters(m *Mesh, proxy Proxy) []*cluster.Cluster {
	if proxy != Envoy {
		return nil
	}
	ports := inboundPorts(m)
	endpoints := map[uint32]string{}
	for _, il := range m.ingress {
		endpoints[il.Port] = il.DefaultEndpoint
	}
	var out []*cluster.Cluster
	for _, port := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		c := &cluster.Cluster{
			Name:                 InboundClusterName(port),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST},
			LbPolicy:             cluster.Cluster_CLUSTER_PROVIDED,
			ConnectTimeout:       m.connectTimeout(),
			UpstreamBindConfig:   &core.BindConfig{SourceAddress: socketAddress("127.0.0.6", 0).GetSocketAddress()},
			// No limits but the workload's own, as istiod's: Envoy's
			// defaults (1024 connections and requests, 3 retries) would
			// turn away what the callers' proxies let through.
			CircuitBreakers: &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{defaultThresholds()}},
			// Connections are never swept, as istiod's: the workload's
			// address is the same for the life of the proxy.
			CleanupInterval: durationpb.New(maxDurationSeconds * time.Second),
		}
		if ports[port].grpc {
			// gRPC reaches the workload over HTTP/2, as from istiod.
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{httpProtocolOptions: mustAny(&upstreamhttp.HttpProtocolOptions{
				UpstreamProtocolOptions: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &core.Http2ProtocolOptions{}}}}})}
		}
		defaultEndpoint(c, endpoints[port])
		out = append(out, c)
	}
	return out
}

// maxDurationSeconds is the longest whole number of seconds a protobuf
// Duration holds as nanoseconds, about 292 years.
const maxDurationSeconds = (math.MaxInt64 - 999_999_999) / 1_000_000_000

// defaultEndpoint points an inbound cluster at a Sidecar ingress
// listener's default endpoint, as Istio does: a loopback address or a unix
// socket directly, the workload's own address (0.0.0.0 or [::]) on
// another port through the original destination with the port replaced.
func defaultEndpoint(c *cluster.Cluster, endpoint string) {
	if endpoint == "" {
		return
	}
	static := func(addr *core.Address) {
		c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_STATIC}
		c.LbPolicy = cluster.Cluster_ROUND_ROBIN
		c.UpstreamBindConfig, c.CleanupInterval = nil, nil
		c.LoadAssignment = &endpointv3.ClusterLoadAssignment{ClusterName: c.Name, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: addr}}}}}}}
	}
	if path, ok := strings.CutPrefix(endpoint, "unix://"); ok {
		static(&core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: path}}})
		return
	}
	ap, err := netip.ParseAddrPort(endpoint)
	if err != nil {
		return // refused at ingest
	}
	if ap.Addr().IsUnspecified() {
		c.LbConfig = &cluster.Cluster_OriginalDstLbConfig_{OriginalDstLbConfig: &cluster.Cluster_OriginalDstLbConfig{
			UpstreamPortOverride: wrapperspb.UInt32(uint32(ap.Port()))}}
		return
	}
	static(socketAddress(ap.Addr().String(), uint32(ap.Port())))
}

// inboundChains returns the virtual inbound listener's filter chains, one
// per inbound port: HTTP ports through a connection manager whose one
// route sends everything to the port's inbound cluster (with no timeout,
// the caller's proxy already applied one), other ports through a TCP proxy.
func inboundChains(m *Mesh, sec Security) []*listener.FilterChain {
	ports := inboundPorts(m)
	var out []*listener.FilterChain
	for _, port := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		name := InboundClusterName(port)
		chain := &listener.FilterChain{
			Name:             "0.0.0.0_" + strconv.FormatUint(uint64(port), 10),
			FilterChainMatch: &listener.FilterChainMatch{DestinationPort: wrapperspb.UInt32(port)},
		}
		if !ports[port].http {
			chain.Filters = inboundTCPFilters(sec, port)
			if ports[port].mongo {
				chain.Filters = append(chain.Filters, mongoFilter(name))
			}
			chain.Filters = append(chain.Filters, tcpProxyFilter(name, name))
			out = append(out, inboundTLS(m, chain, m.inboundMode(sec, port), false)...)
			continue
		}
		chain.Filters = []*listener.Filter{inboundManager(m, sec, name, "inbound|http|"+strconv.FormatUint(uint64(port), 10), ports[port].grpc, "")}
		out = append(out, inboundTLS(m, chain, m.inboundMode(sec, port), true)...)
	}
	return out
}

// inboundManager is the connection manager of an inbound HTTP chain, as
// istiod's: the class's JWT and RBAC filters, the fault and CORS filters,
// then one route sending everything to cluster (the route configuration
// is named after it) with no timeout, the caller's proxy having applied
// one; it answers as istio-envoy and passes the caller's certificate
// details on. operation names the route's spans ("": the default).
func inboundManager(m *Mesh, sec Security, cluster, vhost string, grpc bool, operation string) *listener.Filter {
	r := &route.Route{
		Name:   "default",
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: inboundAction(cluster, grpc)},
	}
	if operation != "" {
		r.Decorator = &route.Decorator{Operation: operation}
	}
	filters := append(inboundHTTPFilters(sec),
		&hcm.HttpFilter{Name: faultFilterName, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&fault.HTTPFault{})}},
		&hcm.HttpFilter{Name: corsFilterName, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&cors.Cors{})}},
		&hcm.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}})
	manager := &hcm.HttpConnectionManager{
		StatPrefix: cluster,
		RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
			Name:             cluster,
			ValidateClusters: wrapperspb.Bool(false),
			VirtualHosts:     []*route.VirtualHost{{Name: vhost, Domains: []string{"*"}, Routes: []*route.Route{r}}},
		}},
		HttpFilters: filters,
	}
	envoyManager(manager, m.Config, false)
	manager.ServerName = "istio-envoy"
	forwardClientCert(manager)
	return &listener.Filter{
		Name:       "envoy.filters.network.http_connection_manager",
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(manager)},
	}
}

// forwardClientCert makes an inbound connection manager pass the caller's
// certificate details to the workload, as istiod's do: the
// x-forwarded-client-cert header the caller's proxy set, with the
// connection's own peer (subject, URI and DNS names) appended.
func forwardClientCert(m *hcm.HttpConnectionManager) {
	m.ForwardClientCertDetails = hcm.HttpConnectionManager_APPEND_FORWARD
	m.SetCurrentClientCertDetails = &hcm.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Uri: true, Dns: true}
}

// originalDstFilter restores a redirected connection's original
// destination, which the inbound chains match on.
func originalDstFilter() *listener.ListenerFilter {
	return &listener.ListenerFilter{
		Name:       "envoy.filters.listener.original_dst",
		ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&originaldst.OriginalDst{})},
	}
}
