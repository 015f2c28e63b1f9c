//lint:file-ignore SA1019 the tests read the deprecated fields the generators set, as istiod sets them

package generate_test

import (
	"math"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/types/known/durationpb"
)

// cartMesh is one service, cart in shop, with two subsets and the given
// policy and route rule (nil for none).
func cartMesh(policy *meshv1.TrafficPolicy, rule *meshv1.RouteRule) *generate.Mesh {
	const host = "cart.shop.svc.cluster.local"
	if policy != nil {
		policy.Host = host
		policy.Subsets = append(policy.Subsets, &meshv1.Subset{Name: "v1", Labels: map[string]string{"version": "v1"}},
			&meshv1.Subset{Name: "v2", Labels: map[string]string{"version": "v2"}})
	}
	cart := &generate.Service{Namespace: "shop", Name: "cart", Policy: policy, Spec: &meshv1.Service{
		Hostnames: []string{host}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	var routes []*generate.Route
	if rule != nil {
		rule.Hosts = []string{host}
		routes = append(routes, &generate.Route{Namespace: "shop", Name: "cart", Rule: rule})
	}
	return generate.NewMesh([]*generate.Service{cart}, routes)
}

func cartRoutes(t *testing.T, m *generate.Mesh, proxy generate.Proxy) []*route.Route {
	t.Helper()
	for _, rc := range generate.Routes(m, proxy) {
		if err := rc.Validate(); err != nil {
			t.Fatalf("route configuration %s: %v", rc.Name, err)
		}
		for _, vh := range rc.VirtualHosts {
			if vh.Name == "cart.shop.svc.cluster.local:80" {
				return vh.Routes
			}
		}
	}
	t.Fatal("no virtual host for cart")
	return nil
}

func to(d *meshv1.Destination) []*meshv1.RouteDestination {
	return []*meshv1.RouteDestination{{Destination: d}}
}

// TestRouteDefaults: a route that says nothing of timeouts and retries
// gets istiod's (no timeout; two retries on connect failures, refused
// streams, unavailable, cancelled, avoiding hosts already tried); its own
// retries replace them, attempts 0 turns them off, and a destination that
// hashes consistently retries on the same host.
func TestRouteDefaults(t *testing.T) {
	hash := &meshv1.TrafficPolicy{ConsistentHash: &meshv1.ConsistentHash{Key: &meshv1.ConsistentHash_HttpHeaderName{HttpHeaderName: "x-user"}}}
	dst := &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}
	no := false
	for name, tc := range map[string]struct {
		policy         *meshv1.TrafficPolicy
		rule           *meshv1.RouteRule
		retries        uint32 // 0: no retry policy
		retryOn        string
		codes          []uint32
		previousHosts  bool
		timeout        time.Duration
		hashes, remote bool
	}{
		"no route rule":    {retries: 2, retryOn: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", previousHosts: true},
		"silent rule":      {rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to(dst)}}}, retries: 2, retryOn: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", previousHosts: true},
		"retries off":      {rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to(dst), Retries: &meshv1.RetryPolicy{}}}}},
		"explicit retries": {rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to(dst), Timeout: durationpb.New(3 * time.Second), Retries: &meshv1.RetryPolicy{Attempts: 4, RetryOn: "gateway-error, 503"}}}}, retries: 4, retryOn: "gateway-error,retriable-status-codes", codes: []uint32{503}, previousHosts: true, timeout: 3 * time.Second},
		"same hosts again": {rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to(dst), Retries: &meshv1.RetryPolicy{Attempts: 1, RetryIgnorePreviousHosts: &no, RetryRemoteLocalities: true}}}}, retries: 1, retryOn: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", remote: true},
		"hashing service":  {policy: hash, retries: 2, retryOn: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", previousHosts: true, hashes: true},
		"hashing rule":     {policy: hash, rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to(dst)}}}, retries: 2, retryOn: "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", hashes: true},
	} {
		t.Run(name, func(t *testing.T) {
			routes := cartRoutes(t, cartMesh(tc.policy, tc.rule), generate.Envoy)
			a := routes[0].GetRoute()
			if got := a.GetTimeout().AsDuration(); a.Timeout == nil || got != tc.timeout || a.GetMaxGrpcTimeout().AsDuration() != tc.timeout { //nolint:staticcheck // istiod's field
				t.Errorf("timeout %v, grpc %v; want %v", a.GetTimeout(), a.GetMaxGrpcTimeout(), tc.timeout) //nolint:staticcheck // istiod's field
			}
			rp := a.GetRetryPolicy()
			if tc.retries == 0 {
				if rp != nil {
					t.Errorf("retry policy %v, want none", rp)
				}
				return
			}
			if rp.GetNumRetries().GetValue() != tc.retries || rp.GetRetryOn() != tc.retryOn || rp.GetHostSelectionRetryMaxAttempts() != 5 {
				t.Errorf("retries %d on %q (host selection %d), want %d on %q", rp.GetNumRetries().GetValue(), rp.GetRetryOn(), rp.GetHostSelectionRetryMaxAttempts(), tc.retries, tc.retryOn)
			}
			if len(rp.RetriableStatusCodes) != len(tc.codes) || (len(tc.codes) > 0 && rp.RetriableStatusCodes[0] != tc.codes[0]) {
				t.Errorf("status codes %v, want %v", rp.RetriableStatusCodes, tc.codes)
			}
			if got := len(rp.RetryHostPredicate) == 1 && rp.RetryHostPredicate[0].Name == "envoy.retry_host_predicates.previous_hosts"; got != tc.previousHosts {
				t.Errorf("previous hosts predicate %v, want %v", rp.RetryHostPredicate, tc.previousHosts)
			}
			if got := rp.GetRetryPriority().GetName() == "envoy.retry_priorities.previous_priorities"; got != tc.remote {
				t.Errorf("retry priority %v, want remote localities %v", rp.GetRetryPriority(), tc.remote)
			}
			if got := len(a.HashPolicy) == 1 && a.HashPolicy[0].GetHeader().GetHeaderName() == "x-user"; got != tc.hashes {
				t.Errorf("hash policy %v, want hashing %v", a.HashPolicy, tc.hashes)
			}
		})
	}
}

// TestProxylessRouteDefaults: a proxyless client reads the route's timeout
// as the stream's maximum duration (grpc-go ignores max_grpc_timeout).
func TestProxylessRouteDefaults(t *testing.T) {
	dst := &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}
	routes := cartRoutes(t, cartMesh(nil, &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to(dst), Timeout: durationpb.New(2 * time.Second)}}}), generate.Proxyless)
	a := routes[0].GetRoute()
	if a.GetMaxStreamDuration().GetMaxStreamDuration().AsDuration() != 2*time.Second || a.MaxGrpcTimeout != nil { //nolint:staticcheck // istiod's field
		t.Errorf("max stream duration %v, grpc timeout %v", a.GetMaxStreamDuration(), a.MaxGrpcTimeout) //nolint:staticcheck // istiod's field
	}
}

// TestDestinationHeaders: a weighted destination's headers apply to its
// share alone (traffic shifting's x-canary), a single destination's to the
// route; an authority among them rewrites the host.
func TestDestinationHeaders(t *testing.T) {
	canary := &meshv1.Headers{Request: &meshv1.HeaderOperations{Set: map[string]string{"x-canary": "true", ":authority": "cart-canary"}}}
	rule := &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{
		{Match: []*meshv1.HTTPMatch{{Name: "split", Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/a"}}}}, Name: "shift", Route: []*meshv1.RouteDestination{
			{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local", Subset: "v1"}, Weight: 90},
			{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local", Subset: "v2"}, Weight: 10, Headers: canary}}},
		{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local", Subset: "v2"}, Headers: canary}}},
	}}
	routes := cartRoutes(t, cartMesh(&meshv1.TrafficPolicy{}, rule), generate.Envoy)
	if routes[0].Name != "shift.split" {
		t.Errorf("route name %q, want the rule's and the match's (shift.split)", routes[0].Name)
	}
	ws := routes[0].GetRoute().GetWeightedClusters().GetClusters()
	if len(ws) != 2 || len(ws[0].RequestHeadersToAdd) != 0 || len(ws[1].RequestHeadersToAdd) != 1 ||
		ws[1].RequestHeadersToAdd[0].Header.Key != "x-canary" || ws[1].GetHostRewriteLiteral() != "cart-canary" {
		t.Errorf("weighted clusters %v", ws)
	}
	single := routes[1]
	if len(single.RequestHeadersToAdd) != 1 || single.RequestHeadersToAdd[0].Header.Key != "x-canary" || single.GetRoute().GetHostRewriteLiteral() != "cart-canary" {
		t.Errorf("single destination: headers %v, host rewrite %q", single.RequestHeadersToAdd, single.GetRoute().GetHostRewriteLiteral())
	}
}

func cartCluster(t *testing.T, m *generate.Mesh, name string, proxy generate.Proxy) *cluster.Cluster {
	t.Helper()
	for _, c := range generate.Clusters(m, proxy) {
		if err := c.Validate(); err != nil {
			t.Fatalf("cluster %s: %v", c.Name, err)
		}
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no cluster %s", name)
	return nil
}

// TestClusterDefaults: an Envoy's cluster without a policy has no circuit
// breaking limit and balances by least request; outlier detection turns
// success-rate ejection and (unless set) the panic threshold off; the
// connection pool's idle timeout and HTTP/2 upgrade become protocol
// options; proxyless clients keep grpc-go's round robin and get only
// max_requests.
func TestClusterDefaults(t *testing.T) {
	c := cartCluster(t, cartMesh(nil, nil), "outbound|80||cart.shop.svc.cluster.local", generate.Envoy)
	th := c.GetCircuitBreakers().GetThresholds()
	if c.LbPolicy != cluster.Cluster_LEAST_REQUEST || len(th) != 1 || th[0].GetMaxConnections().GetValue() != math.MaxUint32 ||
		th[0].GetMaxRetries().GetValue() != math.MaxUint32 || c.OutlierDetection != nil || c.TypedExtensionProtocolOptions != nil {
		t.Errorf("default cluster: lb %v, thresholds %v, outlier %v, options %v", c.LbPolicy, th, c.OutlierDetection, c.TypedExtensionProtocolOptions)
	}

	policy := &meshv1.TrafficPolicy{
		ConnectionPool:   &meshv1.ConnectionPool{MaxRequests: 50, IdleTimeout: durationpb.New(10 * time.Second), H2UpgradePolicy: meshv1.ConnectionPool_H2_UPGRADE_UPGRADE},
		OutlierDetection: &meshv1.OutlierDetection{Consecutive_5XxErrors: 7},
	}
	m := cartMesh(policy, nil)
	c = cartCluster(t, m, "outbound|80|v1|cart.shop.svc.cluster.local", generate.Envoy)
	th = c.GetCircuitBreakers().GetThresholds()
	od := c.GetOutlierDetection()
	if th[0].GetMaxRequests().GetValue() != 50 || th[0].GetMaxPendingRequests().GetValue() != math.MaxUint32 {
		t.Errorf("thresholds %v", th)
	}
	if od.GetConsecutive_5Xx().GetValue() != 7 || od.GetEnforcingConsecutive_5Xx().GetValue() != 100 || od.EnforcingSuccessRate == nil ||
		od.GetEnforcingSuccessRate().GetValue() != 0 || c.GetCommonLbConfig().GetHealthyPanicThreshold() == nil || c.GetCommonLbConfig().GetHealthyPanicThreshold().GetValue() != 0 {
		t.Errorf("outlier detection %v, panic threshold %v", od, c.GetCommonLbConfig().GetHealthyPanicThreshold())
	}
	var opts upstreamhttp.HttpProtocolOptions
	if err := c.TypedExtensionProtocolOptions["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil {
		t.Fatal(err)
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil || opts.GetCommonHttpProtocolOptions().GetIdleTimeout().AsDuration() != 10*time.Second {
		t.Errorf("protocol options %v: want HTTP/2 and a 10s idle timeout", &opts)
	}

	p := cartCluster(t, m, "outbound|80|v1|cart.shop.svc.cluster.local", generate.Proxyless)
	pth := p.GetCircuitBreakers().GetThresholds()
	if p.LbPolicy != cluster.Cluster_ROUND_ROBIN || len(pth) != 1 || pth[0].GetMaxRequests().GetValue() != 50 || pth[0].MaxConnections != nil || p.TypedExtensionProtocolOptions != nil {
		t.Errorf("proxyless cluster: lb %v, thresholds %v, options %v", p.LbPolicy, pth, p.TypedExtensionProtocolOptions)
	}
}

// TestAutoMTLS: where no DestinationRule sets TLS, an Envoy's cluster of a
// service in the mesh speaks Istio's mutual TLS to endpoints labelled
// tlsMode: istio (their load assignments say so) and plaintext to the
// rest; not to a service outside the mesh, not when the mesh turns it off,
// never to a proxyless client. ISTIO_MUTUAL gets istiod's SNI and the
// service's identities.
func TestAutoMTLS(t *testing.T) {
	m := cartMesh(nil, nil)
	svc := m.Service("cart.shop.svc.cluster.local")
	svc.ServiceAccounts = []string{"cart"}
	svc.Endpoints = []*meshv1.Endpoint{{Address: "10.0.0.1", Labels: map[string]string{generate.TLSModeLabel: "istio"}}, {Address: "10.0.0.2"}}
	c := cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy)
	ms := c.GetTransportSocketMatches()
	if len(ms) != 2 || ms[0].Name != "tlsMode-istio" || ms[0].Match.Fields["tlsMode"].GetStringValue() != "istio" || ms[1].Name != "tlsMode-disabled" || c.TransportSocket != nil {
		t.Fatalf("transport socket matches %v", ms)
	}
	var tlsCtx tlsv3.UpstreamTlsContext
	if err := ms[0].TransportSocket.GetTypedConfig().UnmarshalTo(&tlsCtx); err != nil {
		t.Fatal(err)
	}
	sans := tlsCtx.GetCommonTlsContext().GetCombinedValidationContext().GetDefaultValidationContext().GetMatchSubjectAltNames() //nolint:staticcheck // istiod's field
	if tlsCtx.Sni != "outbound_.80_._.cart.shop.svc.cluster.local" || len(sans) != 1 || sans[0].GetExact() != "spiffe://cluster.local/ns/shop/sa/cart" {
		t.Errorf("mutual TLS: SNI %q, names %v", tlsCtx.Sni, sans)
	}
	las := generate.LoadAssignments(m)
	for _, la := range las {
		for _, l := range la.Endpoints {
			for _, e := range l.LbEndpoints {
				_, tagged := e.GetMetadata().GetFilterMetadata()["envoy.transport_socket_match"]
				if addr := e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(); tagged != (addr == "10.0.0.1") {
					t.Errorf("endpoint %s: transport socket match metadata %v", addr, e.GetMetadata())
				}
			}
		}
	}
	if p := cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Proxyless); p.TransportSocketMatches != nil || p.TransportSocket != nil {
		t.Errorf("proxyless cluster with TLS: %v", p)
	}
	m.AgentCertificates = true
	c = cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy)
	if err := c.GetTransportSocketMatches()[0].TransportSocket.GetTypedConfig().UnmarshalTo(&tlsCtx); err != nil {
		t.Fatal(err)
	}
	if sds := tlsCtx.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()[0].GetSdsConfig().GetApiConfigSource(); sds.GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "sds-grpc" {
		t.Errorf("certificates from Istio's agent: SDS config %v, want the sds-grpc cluster", sds)
	}
	m.AgentCertificates = false
	m.NoAutoMTLS = true
	if c := cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy); c.TransportSocketMatches != nil {
		t.Errorf("auto mTLS off, yet %v", c.TransportSocketMatches)
	}
	m.NoAutoMTLS = false
	svc.PlaintextPeers, svc.PlaintextDefault = true, true
	if c := cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy); c.TransportSocketMatches != nil {
		t.Errorf("its PeerAuthentication disables mutual TLS, yet %v", c.TransportSocketMatches)
	}
	for _, la := range generate.LoadAssignments(m) {
		if md := la.Endpoints[0].LbEndpoints[0].GetMetadata(); md != nil {
			t.Errorf("its PeerAuthentication disables mutual TLS, yet its endpoints say %v", md)
		}
	}
	// A workload's own PeerAuthentication decides its endpoints, as
	// istiod checks each: STRICT marks them, DISABLE (on their port) not.
	marked := func() bool {
		md := generate.LoadAssignments(m)[0].Endpoints[0].LbEndpoints[0].GetMetadata()
		return md.GetFilterMetadata()["envoy.transport_socket_match"].GetFields()["tlsMode"].GetStringValue() == "istio"
	}
	svc.PeerPolicies = []*meshv1.PeerAuthentication{{Selector: map[string]string{"app": "nothing"}, Mode: meshv1.MTLSMode_MTLS_MODE_STRICT},
		{Selector: svc.Endpoints[0].Labels, Mode: meshv1.MTLSMode_MTLS_MODE_STRICT}}
	if !marked() {
		t.Error("a workload whose policy is STRICT in a DISABLE namespace: endpoint not marked")
	}
	svc.PlaintextPeers, svc.PlaintextDefault = false, false
	svc.PeerPolicies = []*meshv1.PeerAuthentication{{Selector: svc.Endpoints[0].Labels, Mode: meshv1.MTLSMode_MTLS_MODE_STRICT,
		PortModes: map[uint32]meshv1.MTLSMode{80: meshv1.MTLSMode_MTLS_MODE_DISABLE}}}
	if marked() {
		t.Error("a workload whose policy disables mutual TLS on its port: endpoint marked")
	}
	svc.PeerPolicies = nil
	svc.Spec.MeshExternal = true
	if c := cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy); c.TransportSocketMatches != nil {
		t.Errorf("a service outside the mesh, yet %v", c.TransportSocketMatches)
	}
	svc.Spec.MeshExternal = false
	svc.Policy = &meshv1.TrafficPolicy{Host: "cart.shop.svc.cluster.local", Tls: &meshv1.ClientTLS{Mode: meshv1.ClientTLS_MODE_ISTIO_MUTUAL}}
	c = cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy)
	if err := c.GetTransportSocket().GetTypedConfig().UnmarshalTo(&tlsCtx); err != nil || c.TransportSocketMatches != nil || tlsCtx.Sni != "outbound_.80_._.cart.shop.svc.cluster.local" {
		t.Errorf("ISTIO_MUTUAL: %v, matches %v, SNI %q", err, c.TransportSocketMatches, tlsCtx.Sni)
	}
}

// TestPortlessHosts: as istiod does, a rule none of whose hosts is a
// service with an HTTP port 80 also gets a virtual host on route
// configuration "80" (where one exists), each host by itself, its
// destinations on their service's only port.
func TestPortlessHosts(t *testing.T) {
	web := &generate.Service{Namespace: "shop", Name: "web", Spec: &meshv1.Service{Hostnames: []string{"web.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	cart := &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{Hostnames: []string{"cart.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Number: 9080, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	rules := []*generate.Route{
		{Namespace: "shop", Name: "cart", Rule: &meshv1.RouteRule{Hosts: []string{"cart.shop.svc.cluster.local"},
			Http: []*meshv1.HTTPRoute{{Route: to(&meshv1.Destination{Host: "cart.shop.svc.cluster.local"})}}}},
		{Namespace: "shop", Name: "web", Rule: &meshv1.RouteRule{Hosts: []string{"web.shop.svc.cluster.local"},
			Http: []*meshv1.HTTPRoute{{Route: to(&meshv1.Destination{Host: "web.shop.svc.cluster.local"})}}}},
	}
	m := generate.NewMesh([]*generate.Service{web, cart}, rules)
	for _, rc := range generate.Routes(m, generate.Envoy) {
		if err := rc.Validate(); err != nil {
			t.Fatal(err)
		}
		if rc.Name != "80" {
			continue
		}
		var names []string
		for _, vh := range rc.VirtualHosts {
			names = append(names, vh.Name)
			if vh.Name == "cart.shop.svc.cluster.local:80" {
				if len(vh.Domains) != 1 || vh.Routes[0].GetRoute().GetCluster() != "outbound|9080||cart.shop.svc.cluster.local" {
					t.Errorf("cart on 80: domains %v, routes %v", vh.Domains, vh.Routes)
				}
			}
		}
		if len(names) != 3 || names[1] != "cart.shop.svc.cluster.local:80" {
			t.Errorf("virtual hosts of 80: %v, want web's, cart's by its rule, allow_any", names)
		}
	}
}

// TestSniffingListener: an Envoy's outbound listener of an HTTP port routes
// what the HTTP inspector finds to be HTTP and passes the rest through (to
// the black hole under REGISTRY_ONLY), as istiod's does.
func TestSniffingListener(t *testing.T) {
	for _, registryOnly := range []bool{false, true} {
		m := cartMesh(nil, nil)
		m.RegistryOnly = registryOnly
		var l *listener.Listener
		for _, x := range generate.Listeners(m, generate.Envoy, nil) {
			if err := x.Validate(); err != nil {
				t.Fatal(err)
			}
			if x.Name == "0.0.0.0_80" {
				l = x
			}
		}
		if l == nil {
			t.Fatal("no listener 0.0.0.0_80")
		}
		var tcp tcpproxy.TcpProxy
		if err := l.GetDefaultFilterChain().GetFilters()[0].GetTypedConfig().UnmarshalTo(&tcp); err != nil {
			t.Fatal(err)
		}
		want := "PassthroughCluster"
		if registryOnly {
			want = "BlackHoleCluster"
		}
		if len(l.ListenerFilters) != 1 || l.ListenerFilters[0].Name != "envoy.filters.listener.http_inspector" ||
			l.FilterChains[0].GetFilterChainMatch().GetTransportProtocol() != "raw_buffer" || tcp.GetCluster() != want {
			t.Errorf("registry only %v: listener filters %v, match %v, default chain to %s", registryOnly, l.ListenerFilters, l.FilterChains[0].GetFilterChainMatch(), tcp.GetCluster())
		}
	}
}
