package generate

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ServerListenerName is the listener a proxyless gRPC server listening on
// addr ("0.0.0.0:50051", "[::]:50051") asks for: grpc-go's default name.
func ServerListenerName(addr string) string {
	return "grpc/server?xds.resource.listening_address=" + addr
}

// IstioServerListenerName is the name a server asks for with the bootstrap
// Istio's agent writes (server_listener_resource_name_template).
func IstioServerListenerName(addr string) string {
	return "xds.istio.io/grpc/lds/inbound/" + addr
}

// servicePorts returns the ports a service's workloads serve gRPC or HTTP
// on: the target ports of its HTTP ports and the ports its endpoints give
// them; none for a service outside the mesh (not static).
func servicePorts(s *Service, into map[uint32]bool) {
	if s.Spec.Resolution != meshv1.Resolution_RESOLUTION_STATIC {
		return
	}
	for _, p := range s.Spec.Ports {
		if !isHTTP(p) {
			continue
		}
		into[cmp.Or(p.TargetPort, p.Number)] = true
		for _, ep := range s.Endpoints {
			if n := ep.Ports[p.Name]; n != 0 {
				into[n] = true
			}
		}
	}
}

// ServicePortsPrint names the ports a service's proxyless servers get
// listeners for, so that a change of its endpoints that changes them
// regenerates those listeners.
func ServicePortsPrint(s *Service) string {
	ports := map[uint32]bool{}
	servicePorts(s, ports)
	var b strings.Builder
	for _, p := range slices.SortedFunc(maps.Keys(ports), cmp.Compare) {
		b.WriteString(strconv.FormatUint(uint64(p), 10) + ",")
	}
	return b.String()
}

// serverPorts returns the ports a namespace's workloads serve on; for
// namespace "", those of every namespace without security policies (whose
// proxies share one class).
func serverPorts(m *Mesh, namespace string) []uint32 {
	secured := map[string]bool{}
	for _, p := range m.Policies {
		secured[p.Namespace] = true
		if p.Root {
			return nil // every namespace has classes of its own
		}
	}
	ports := map[uint32]bool{}
	for _, s := range m.Services {
		if namespace == "" && !secured[s.Namespace] || s.Namespace == namespace {
			servicePorts(s, ports)
		}
	}
	return slices.SortedFunc(maps.Keys(ports), cmp.Compare)
}

// ServerListeners returns the listeners of a class of proxyless gRPC
// servers of a namespace ("": of the namespaces without security
// policies): for every port its workloads serve on, one per
// wildcard address (servers listen on every interface), whose one filter
// chain takes mutual TLS when the port's PeerAuthentication mode is STRICT
// (certificates from the bootstrap's provider "default"; PERMISSIVE is
// plaintext: grpc-go cannot tell TLS from plaintext on one port) and
// applies the class's AuthorizationPolicies as RBAC filters.
func ServerListeners(m *Mesh, namespace string, sec Security) []*listener.Listener {
	filters := append(RBACFilters(sec), &hcm.HttpFilter{
		Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}})
	var out []*listener.Listener
	for _, port := range serverPorts(m, namespace) {
		num := strconv.FormatUint(uint64(port), 10)
		manager := &hcm.HttpConnectionManager{
			StatPrefix: "inbound_" + num,
			RouteSpecifier: &hcm.HttpConnectionManager_RouteConfig{RouteConfig: &route.RouteConfiguration{
				Name: "inbound|" + num,
				VirtualHosts: []*route.VirtualHost{{
					Name:    "inbound|" + num,
					Domains: []string{"*"},
					Routes: []*route.Route{{
						Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
						Action: &route.Route_NonForwardingAction{NonForwardingAction: &route.NonForwardingAction{}},
					}},
				}},
			}},
			HttpFilters: filters,
		}
		chain := &listener.FilterChain{
			Name: "inbound|" + num,
			Filters: []*listener.Filter{{Name: "envoy.filters.network.http_connection_manager",
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(manager)}}},
		}
		if sec.MTLSMode(port) == meshv1.MTLSMode_MTLS_MODE_STRICT {
			chain.TransportSocket = downstreamMutualTLS(Proxyless, false)
		}
		for _, host := range []string{"0.0.0.0", "::"} {
			addr := netip.AddrPortFrom(netip.MustParseAddr(host), uint16(port)).String()
			// By grpc-go's default name and by the one Istio's agent has
			// servers ask for.
			for _, name := range []string{ServerListenerName(addr), IstioServerListenerName(addr)} {
				out = append(out, &listener.Listener{
					Name:         name,
					Address:      socketAddress(host, port),
					FilterChains: []*listener.FilterChain{chain},
				})
			}
		}
	}
	return out
}

// downstreamMutualTLS requires a client certificate of the mesh's root:
// for an Envoy from SDS ("default" and "ROOTCA"), for a proxyless server
// from its bootstrap's certificate provider "default", as Istio's.
func downstreamMutualTLS(proxy Proxy, agent bool) *core.TransportSocket {
	return tlsSocket(&tlsv3.DownstreamTlsContext{CommonTlsContext: meshCertificates(proxy, agent), RequireClientCertificate: wrapperspb.Bool(true)})
}
