package generate

import (
	"cmp"
	"maps"
	"slices"
	"strconv"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	cors "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Listeners returns the listeners a kind of proxy asks for: for proxyless
// clients an API listener per HTTP service port, named "<host>:<port>"; for
// Envoy sidecars an outbound listener per HTTP or TCP port,
// "0.0.0.0_<port>", behind the virtual outbound (15001) and inbound (15006)
// listeners, whose inbound chains apply the class's security policies
// (see ServerListeners for a proxyless class's).
func Listeners(m *Mesh, proxy Proxy, sec Security) []*listener.Listener {
	var out []*listener.Listener
	if proxy == Proxyless {
		forEachHTTPPort(m, func(_ *Service, host string, p *meshv1.Port) {
			name := ListenerName(host, p.Number)
			out = append(out, &listener.Listener{
				Name:        name,
				ApiListener: &listener.ApiListener{ApiListener: mustAny(httpConnectionManager(name, name, false))},
			})
		})
		return out
	}
	ports := map[uint32]bool{}
	forEachHTTPPort(m, func(_ *Service, _ string, p *meshv1.Port) { ports[p.Number] = true })
	for _, port := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		num := strconv.FormatUint(uint64(port), 10)
		name := "0.0.0.0_" + num
		out = append(out, &listener.Listener{
			Name:    name,
			Address: socketAddress("0.0.0.0", port),
			// Connections reach it from the virtual outbound listener.
			BindToPort: wrapperspb.Bool(false),
			FilterChains: []*listener.FilterChain{{
				Filters: []*listener.Filter{{
					Name:       "envoy.filters.network.http_connection_manager",
					ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(httpConnectionManager("outbound_0.0.0.0_"+num, num, true))},
				}},
			}},
		})
	}
	out = append(out, tcpListeners(m)...)
	return append(out, virtualListeners(m, sec)...)
}

// httpConnectionManager fetches its routes over RDS; its filters are, for
// an Envoy, the CORS filter, then the fault filter (both configured per
// route) and the router, which grpc-go requires to be last and typed.
func httpConnectionManager(statPrefix, routeName string, envoy bool) *hcm.HttpConnectionManager {
	m := &hcm.HttpConnectionManager{
		StatPrefix: statPrefix,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource:    ads(),
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
	if envoy {
		m.HttpFilters = append([]*hcm.HttpFilter{{Name: corsFilterName,
			ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&cors.Cors{})}}}, m.HttpFilters...)
	}
	return m
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
