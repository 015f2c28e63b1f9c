package generate_test

import (
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"math"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestDNSClusters: ServiceEntries with DNS resolution get clusters that
// resolve names (STRICT_DNS over every endpoint for DNS, LOGICAL_DNS over
// one for DNS_ROUND_ROBIN, as Istio generates them; LOGICAL_DNS for
// proxyless clients), their subsets too, the host itself without
// endpoints, and never a load assignment over EDS.
func TestDNSClusters(t *testing.T) {
	dns := &generate.Service{Namespace: "shop", Name: "payments", Spec: &meshv1.Service{
		Hostnames: []string{"api.payments.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
	}, Endpoints: []*meshv1.Endpoint{
		{Address: "eu.payments.example.com", Labels: map[string]string{"region": "eu"}, Locality: &meshv1.Locality{Region: "eu"}},
		{Address: "us.payments.example.com", Labels: map[string]string{"region": "us"}, Locality: &meshv1.Locality{Region: "us"}, Ports: map[string]uint32{"http": 8080}},
	}, Policy: &meshv1.TrafficPolicy{Host: "api.payments.example.com", Subsets: []*meshv1.Subset{{Name: "eu", Labels: map[string]string{"region": "eu"}}}}}
	roundRobin := &generate.Service{Namespace: "shop", Name: "search", Spec: &meshv1.Service{
		Hostnames: []string{"search.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN,
		Ports: []*meshv1.Port{{Name: "grpc", Number: 443, Protocol: meshv1.Protocol_PROTOCOL_GRPC}},
	}, Endpoints: []*meshv1.Endpoint{{Address: "search-a.example.com"}, {Address: "search-b.example.com"}}}
	bare := &generate.Service{Namespace: "shop", Name: "maps", Spec: &meshv1.Service{
		Hostnames: []string{"maps.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
	}}
	m := generate.NewMesh([]*generate.Service{dns, roundRobin, bare}, nil)
	for _, proxy := range []generate.Proxy{generate.Envoy, generate.Proxyless} {
		var cs []*cluster.Cluster
		for _, s := range m.Services {
			cs = append(cs, generate.ServiceClusters(m, s, proxy)...)
		}
		golden.CheckValid(t, "dns-clusters-"+proxy.String()+".json", cs)
		for _, c := range cs {
			if c.GetType() == cluster.Cluster_EDS {
				t.Errorf("%s %s: EDS", proxy, c.Name)
			}
			if c.GetType() == cluster.Cluster_LOGICAL_DNS && (len(c.LoadAssignment.Endpoints) != 1 || len(c.LoadAssignment.Endpoints[0].LbEndpoints) != 1) {
				t.Errorf("%s %s: LOGICAL_DNS with more than one endpoint", proxy, c.Name)
			}
		}
	}
	if las := generate.LoadAssignments(m); len(las) != 0 {
		t.Errorf("%d load assignments for DNS services, want none (hostnames never go over EDS)", len(las))
	}
}

// TestRegistryOnly: with REGISTRY_ONLY an Envoy's traffic to destinations
// no service names goes into the black hole (TCP) and is answered 502
// (HTTP), as Istio's; with ALLOW_ANY it passes through.
func TestRegistryOnly(t *testing.T) {
	m := testMesh().For(generate.View{RegistryOnly: true})
	var outbound []*listener.Listener
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		if l.Name == generate.VirtualOutboundListener {
			outbound = append(outbound, l)
		}
	}
	golden.CheckValid(t, "registry-only-listeners.json", outbound)
	routes := generate.Routes(m, generate.Envoy)
	golden.CheckValid(t, "registry-only-routes.json", routes)
	var proxy tcpproxy.TcpProxy
	if err := outbound[0].FilterChains[1].Filters[0].GetTypedConfig().UnmarshalTo(&proxy); err != nil || proxy.GetCluster() != generate.BlackHoleCluster {
		t.Errorf("virtual outbound default %s (%v), want the black hole", proxy.GetCluster(), err)
	}
	for _, rc := range routes {
		last := rc.VirtualHosts[len(rc.VirtualHosts)-1]
		if last.Name != "block_all" || last.Routes[0].GetDirectResponse().GetStatus() != 502 {
			t.Errorf("route %s ends with %s, want block_all answering 502", rc.Name, last.Name)
		}
	}
	for _, rc := range generate.Routes(testMesh(), generate.Envoy) {
		if last := rc.VirtualHosts[len(rc.VirtualHosts)-1]; last.Name != "allow_any" {
			t.Errorf("ALLOW_ANY: route %s ends with %s", rc.Name, last.Name)
		}
	}
}

// TestMatchAuthorityAndCase: a match's authority and scheme are
// pseudo-header matches, and ignoreUriCase makes the path match
// case-insensitive, as Istio generates them.
func TestMatchAuthorityAndCase(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "legacy", Spec: &meshv1.Service{
		Hostnames: []string{"legacy.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	rule := &generate.Route{Namespace: "shop", Name: "legacy", Version: "1", Rule: &meshv1.RouteRule{Hosts: []string{"legacy.example.com"},
		Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/Legacy"}}, IgnoreUriCase: true,
				Headers: map[string]*meshv1.StringMatch{":authority": {Kind: &meshv1.StringMatch_Exact{Exact: "legacy.example.com"}}}}},
			Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "legacy.example.com"}}},
		}}}}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{rule})
	vh := generate.VirtualHost(m, "legacy.example.com", 80)
	match := vh.Routes[0].Match
	if match.GetCaseSensitive() == nil || match.GetCaseSensitive().GetValue() || len(match.Headers) != 1 || match.Headers[0].Name != ":authority" {
		t.Errorf("match %v", match)
	}
	if err := vh.Validate(); err != nil {
		t.Error(err)
	}
}

// TestPortAndSubsetPolicies: as Istio merges them, a DestinationRule's
// portLevelSettings replace its policy for the port as a whole (what they
// leave out is the default, not the destination's); a subset's policy
// overrides each part it sets, and its own settings for the port replace
// all four parts.
func TestPortAndSubsetPolicies(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{
		Hostnames: []string{"cart.shop.svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}, {Name: "admin", Number: 9090, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}},
		Policy: &meshv1.TrafficPolicy{Host: "cart.shop.svc.cluster.local",
			LoadBalancer:   meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST,
			ConnectionPool: &meshv1.ConnectionPool{MaxConnections: 10},
			PortLevelSettings: []*meshv1.PortPolicy{{Port: 9090, LoadBalancer: meshv1.LoadBalancer_LOAD_BALANCER_RANDOM,
				Tls: &meshv1.ClientTLS{Mode: meshv1.ClientTLS_MODE_SIMPLE, Sni: "admin.cart"}}},
			Subsets: []*meshv1.Subset{{Name: "v2", Labels: map[string]string{"version": "v2"},
				OutlierDetection:  &meshv1.OutlierDetection{Consecutive_5XxErrors: 3},
				PortLevelSettings: []*meshv1.PortPolicy{{Port: 9090, ConnectionPool: &meshv1.ConnectionPool{MaxConnections: 99}}}}},
		}}
	m := generate.NewMesh([]*generate.Service{svc}, nil)
	cs := generate.ServiceClusters(m, svc, generate.Envoy)
	golden.CheckValid(t, "port-subset-clusters.json", cs)
	by := map[string]*cluster.Cluster{}
	for _, c := range cs {
		by[c.Name] = c
	}
	maxConns := func(c *cluster.Cluster) uint32 {
		return c.GetCircuitBreakers().GetThresholds()[0].GetMaxConnections().GetValue()
	}
	for name, want := range map[string]struct {
		lb       cluster.Cluster_LbPolicy
		conns    uint32
		tls      bool
		outliers bool
	}{
		"outbound|80||cart.shop.svc.cluster.local":     {cluster.Cluster_LEAST_REQUEST, 10, false, false},
		"outbound|9090||cart.shop.svc.cluster.local":   {cluster.Cluster_RANDOM, math.MaxUint32, true, false},
		"outbound|80|v2|cart.shop.svc.cluster.local":   {cluster.Cluster_LEAST_REQUEST, 10, false, true},
		"outbound|9090|v2|cart.shop.svc.cluster.local": {cluster.Cluster_LEAST_REQUEST, 99, false, false},
	} {
		c := by[name]
		if c == nil || c.LbPolicy != want.lb || maxConns(c) != want.conns || (c.TransportSocket != nil) != want.tls || (c.OutlierDetection != nil) != want.outliers {
			t.Errorf("%s: lb %v, %d connections, TLS %v, outlier detection %v; want %+v", name, c.GetLbPolicy(), maxConns(c), c.GetTransportSocket() != nil, c.GetOutlierDetection() != nil, want)
		}
	}
}

// TestDirectResponse: a VirtualService's directResponse answers matching
// requests itself.
func TestDirectResponse(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "legacy", Spec: &meshv1.Service{
		Hostnames: []string{"legacy.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	rule := &generate.Route{Namespace: "shop", Name: "maintenance", Version: "1", Rule: &meshv1.RouteRule{Hosts: []string{"legacy.example.com"},
		Http: []*meshv1.HTTPRoute{{DirectResponse: &meshv1.DirectResponse{Status: 410, Body: "gone"}}}}}
	if err := model.Validate(rule.Rule); err != nil {
		t.Fatal(err)
	}
	vh := generate.VirtualHost(generate.NewMesh([]*generate.Service{svc}, []*generate.Route{rule}), "legacy.example.com", 80)
	dr := vh.Routes[0].GetDirectResponse()
	if dr.GetStatus() != 410 || dr.GetBody().GetInlineString() != "gone" {
		t.Errorf("route %v, want a direct 410 gone", vh.Routes[0])
	}
	if err := vh.Validate(); err != nil {
		t.Error(err)
	}
	both := &meshv1.RouteRule{Hosts: []string{"legacy.example.com"}, Http: []*meshv1.HTTPRoute{{DirectResponse: &meshv1.DirectResponse{Status: 200},
		Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "legacy.example.com"}}}}}}
	if err := model.Validate(both); err == nil {
		t.Error("a route with destinations and a direct response was valid")
	}
}
