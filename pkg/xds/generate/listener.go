package generate

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	cors "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Listeners returns the listeners a kind of proxy asks for: for proxyless
// clients an API listener per HTTP service port, named "<host>:<port>"; for
// Envoy sidecars an outbound listener per HTTP or TCP port,
// "0.0.0.0_<port>", behind the virtual outbound (15001) and inbound (15006)
// listeners, whose inbound chains apply the class's security policies
// (see ServerListeners for a proxyless class's).
func Listeners(m *Mesh, proxy Proxy, sec Security) []*listener.Listener {
	return ListenersFrom(m, proxy, sec, APIListener)
}

// APIListener is a proxyless client's listener of a name ("<host>:<port>"):
// its connection manager takes the route configuration of the same name.
// It depends on the name alone: a caller may hand ListenersFrom one
// object per name.
func APIListener(name string) *listener.Listener {
	return &listener.Listener{
		Name:        name,
		ApiListener: &listener.ApiListener{ApiListener: mustAny(httpConnectionManager(nil, name, name, apiManager))},
	}
}

// ListenersFrom is Listeners with proxyless clients' listeners from api.
func ListenersFrom(m *Mesh, proxy Proxy, sec Security, api func(name string) *listener.Listener) []*listener.Listener {
	var out []*listener.Listener
	if proxy == Proxyless {
		forEachProxylessPort(m, func(host string, p *meshv1.Port) {
			out = append(out, api(ListenerName(host, p.Number)))
		})
		return out
	}
	ports := map[uint32]bool{}
	forEachHTTPPort(m, func(_ *Service, _ string, p *meshv1.Port) { ports[p.Number] = true })
	for _, port := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		num := strconv.FormatUint(uint64(port), 10)
		name := "0.0.0.0_" + num
		passthrough := PassthroughCluster
		if m.RegistryOnly {
			passthrough = BlackHoleCluster
		}
		out = append(out, &listener.Listener{
			Name:             name,
			Address:          socketAddress("0.0.0.0", port),
			TrafficDirection: core.TrafficDirection_OUTBOUND,
			// Connections reach it from the virtual outbound listener.
			BindToPort: wrapperspb.Bool(false),
			// What the HTTP inspector finds to be HTTP (or a client's
			// h2c or HTTP/1.1 ALPN) is routed; anything else passes
			// through, as istiod's sniffing listeners do.
			ListenerFilters: []*listener.ListenerFilter{{Name: "envoy.filters.listener.http_inspector",
				ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&httpinspector.HttpInspector{})}}},
			ListenerFiltersTimeout:           cmp.Or(m.Config.GetProtocolDetectionTimeout(), durationpb.New(0)),
			ContinueOnListenerFiltersTimeout: true,
			FilterChains: []*listener.FilterChain{{
				FilterChainMatch:              &listener.FilterChainMatch{TransportProtocol: "raw_buffer", ApplicationProtocols: []string{"http/1.1", "h2c"}},
				TransportSocketConnectTimeout: durationpb.New(15 * time.Second),
				Filters: []*listener.Filter{{
					Name:       "envoy.filters.network.http_connection_manager",
					ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(httpConnectionManager(m, "outbound_0.0.0.0_"+num, num, sidecarManager))},
				}},
			}},
			DefaultFilterChain: &listener.FilterChain{Name: "PassthroughFilterChain", Filters: []*listener.Filter{tcpProxyFilter(passthrough, passthrough)}},
		})
	}
	out = append(out, tcpListeners(m)...)
	return append(out, virtualListeners(m, sec)...)
}

// managerKind says where an HTTP connection manager runs.
type managerKind int

const (
	// sidecarManager is an Envoy sidecar's, for its outbound traffic.
	sidecarManager managerKind = iota
	// gatewayManager is a gateway's, for traffic from outside the mesh.
	gatewayManager
	// apiManager is a proxyless gRPC client's API listener.
	apiManager
)

// httpConnectionManager fetches its routes over RDS; its filters are, for
// an Envoy, the fault filter, then the CORS filter (both configured per
// route) and the router, which grpc-go requires to be last and typed.
func httpConnectionManager(mesh *Mesh, statPrefix, routeName string, kind managerKind) *hcm.HttpConnectionManager {
	rds := ads()
	if kind != apiManager {
		// An Envoy waits for its routes however long they take.
		rds.InitialFetchTimeout = durationpb.New(0)
	}
	m := &hcm.HttpConnectionManager{
		StatPrefix: statPrefix,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    rds,
			RouteConfigName: routeName,
		}},
		HttpFilters: []*hcm.HttpFilter{
			{
				Name:       faultFilterName,
				ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&fault.HTTPFault{})},
			},
			{
				Name:       "envoy.filters.http.router",
				ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})},
			},
		},
	}
	if kind == apiManager {
		return m
	}
	m.HttpFilters = slices.Insert(m.HttpFilters, 1, &hcm.HttpFilter{Name: corsFilterName,
		ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&cors.Cors{})}})
	envoyManager(m, mesh.Config, kind == gatewayManager)
	return m
}

// envoyManager sets what istiod sets on every Envoy's HTTP connection
// manager: 100-continue proxied, websocket upgrades allowed, no stream
// idle timeout, paths normalized as the mesh says (by default RFC 3986's
// normalization, escaped slashes kept); and at a gateway, which takes
// traffic from outside, the client's address from the connection (past
// the trusted proxies in front) and its certificate's details handled as
// the mesh's gateway topology says (sanitized and set by default).
func envoyManager(m *hcm.HttpConnectionManager, mc *meshv1.MeshConfig, gateway bool) {
	m.CodecType = hcm.HttpConnectionManager_AUTO
	m.Proxy_100Continue = true
	m.UpgradeConfigs = []*hcm.HttpConnectionManager_UpgradeConfig{{UpgradeType: "websocket"}}
	m.StreamIdleTimeout = durationpb.New(0)
	m.NormalizePath = wrapperspb.Bool(true)
	m.PathWithEscapedSlashesAction = hcm.HttpConnectionManager_KEEP_UNCHANGED
	switch mc.GetPathNormalization() {
	case meshv1.PathNormalization_PATH_NORMALIZATION_NONE:
		m.NormalizePath = wrapperspb.Bool(false)
	case meshv1.PathNormalization_PATH_NORMALIZATION_MERGE_SLASHES:
		m.MergeSlashes = true
	case meshv1.PathNormalization_PATH_NORMALIZATION_DECODE_AND_MERGE_SLASHES:
		m.MergeSlashes = true
		m.PathWithEscapedSlashesAction = hcm.HttpConnectionManager_UNESCAPE_AND_FORWARD
	}
	m.UseRemoteAddress = wrapperspb.Bool(gateway)
	if !gateway {
		return
	}
	m.ServerName = "istio-envoy"
	m.XffNumTrustedHops = mc.GetGatewayTrustedProxies()
	m.ForwardClientCertDetails = clientCertDetails[mc.GetGatewayClientCert()]
	if m.ForwardClientCertDetails == hcm.HttpConnectionManager_SANITIZE_SET || m.ForwardClientCertDetails == hcm.HttpConnectionManager_APPEND_FORWARD {
		m.SetCurrentClientCertDetails = &hcm.HttpConnectionManager_SetCurrentClientCertDetails{Subject: wrapperspb.Bool(true), Cert: true, Dns: true, Uri: true}
	}
}

// clientCertDetails maps the mesh's gateway setting to Envoy's.
var clientCertDetails = map[meshv1.ClientCertDetails]hcm.HttpConnectionManager_ForwardClientCertDetails{
	meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_DEFAULT:             hcm.HttpConnectionManager_SANITIZE_SET,
	meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_SANITIZE:            hcm.HttpConnectionManager_SANITIZE,
	meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_FORWARD_ONLY:        hcm.HttpConnectionManager_FORWARD_ONLY,
	meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_APPEND_FORWARD:      hcm.HttpConnectionManager_APPEND_FORWARD,
	meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_SANITIZE_SET:        hcm.HttpConnectionManager_SANITIZE_SET,
	meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_ALWAYS_FORWARD_ONLY: hcm.HttpConnectionManager_ALWAYS_FORWARD_ONLY,
}

// mustAny wraps a message; marshalling a valid generated message cannot fail.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic("generate: marshal " + string(proto.MessageName(m)) + ": " + err.Error())
	}
	return a
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
