package generate_test

import (
	"fmt"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	mongoproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/mongo_proxy/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// l4Mesh: two TCP databases with virtual IPs on 3306 (the primary's
// VirtualService splits 90/10 to its replica), an HTTPS and a TLS
// ServiceEntry on 443 (a VirtualService routes one's SNI to the other),
// and a TCP ServiceEntry on 443 without a virtual IP.
func l4Mesh() *generate.Mesh {
	svc := func(ns, name, host string, port uint32, proto meshv1.Protocol, vips ...string) *generate.Service {
		return &generate.Service{Namespace: ns, Name: name, Spec: &meshv1.Service{Hostnames: []string{host}, Addresses: vips,
			Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "p", Number: port, Protocol: proto}}}}
	}
	db := svc("data", "db", "db.data.svc.cluster.local", 3306, meshv1.Protocol_PROTOCOL_TCP, "10.96.1.1")
	db.Policy = &meshv1.TrafficPolicy{Host: "db.data.svc.cluster.local", Subsets: []*meshv1.Subset{{Name: "primary", Labels: map[string]string{"role": "primary"}}}}
	services := []*generate.Service{
		db,
		svc("data", "db-replica", "db-replica.data.svc.cluster.local", 3306, meshv1.Protocol_PROTOCOL_TCP, "10.96.1.2"),
		svc("edge", "partners", "api.partners.example.com", 443, meshv1.Protocol_PROTOCOL_HTTPS),
		svc("edge", "mirror", "mirror.partners.example.com", 443, meshv1.Protocol_PROTOCOL_TLS),
		svc("edge", "legacy", "legacy.example.com", 443, meshv1.Protocol_PROTOCOL_TCP),
	}
	to := func(host string, subset string, weight uint32) *meshv1.RouteDestination {
		return &meshv1.RouteDestination{Destination: &meshv1.Destination{Host: host, Subset: subset}, Weight: weight}
	}
	routes := []*generate.Route{
		{Namespace: "data", Name: "db", Rule: &meshv1.RouteRule{Hosts: []string{"db.data.svc.cluster.local"}, Tcp: []*meshv1.L4Route{{
			Match: []*meshv1.L4Match{{Port: 3306}},
			Route: []*meshv1.RouteDestination{to("db.data.svc.cluster.local", "primary", 90), to("db-replica.data.svc.cluster.local", "", 10)}}}}},
		{Namespace: "edge", Name: "partners", Rule: &meshv1.RouteRule{Hosts: []string{"api.partners.example.com"}, Tls: []*meshv1.L4Route{
			{Match: []*meshv1.L4Match{{SniHosts: []string{"api.partners.example.com"}, Gateways: []string{"edge/egress"}}},
				Route: []*meshv1.RouteDestination{to("legacy.example.com", "", 0)}}, // not for sidecars
			{Match: []*meshv1.L4Match{{Port: 443, SniHosts: []string{"*.partners.example.com"}}},
				Route: []*meshv1.RouteDestination{to("mirror.partners.example.com", "", 0)}},
		}}},
	}
	return generate.NewMesh(services, routes)
}

// TestL4Routes: TCP and TLS listeners of a sidecar as Istio generates them:
// a listener per TCP virtual IP (the VirtualService's weighted tcp route
// on the primary's), and the 443 wildcard listener choosing by SNI (the tls
// route sending api.partners to the mirror), its TCP service as the
// default chain.
func TestL4Routes(t *testing.T) {
	var l4 []*listener.Listener
	for _, l := range generate.Listeners(l4Mesh(), generate.Envoy, nil) {
		if strings.HasSuffix(l.Name, "_3306") || strings.HasSuffix(l.Name, "_443") {
			l4 = append(l4, l)
		}
	}
	golden.CheckValid(t, "l4-listeners.json", l4)
}

// TestGatewayL4: a gateway's 443 terminates TLS for one host and passes
// the partners' SNI through by their tls route; 15443 is AUTO_PASSTHROUGH
// (SNI names the cluster: Istio's "outbound_.<port>_.<subset>_.<host>",
// whose clusters take the same load assignments); 3306 is a TCP server
// routed by a tcp route bound to the gateway.
func TestGatewayL4(t *testing.T) {
	m := l4Mesh()
	gw := &generate.Gateway{Namespace: "edge", Name: "egress", Spec: &meshv1.Gateway{Servers: []*meshv1.GatewayServer{
		{Port: 443, Protocol: meshv1.Protocol_PROTOCOL_HTTPS, Hosts: []string{"www.example.com"}, Tls: &meshv1.GatewayTLS{Mode: "SIMPLE", CredentialName: "www"}},
		{Name: "partners", Port: 443, Protocol: meshv1.Protocol_PROTOCOL_TLS, Hosts: []string{"*.partners.example.com"}, Tls: &meshv1.GatewayTLS{Mode: "PASSTHROUGH"}},
		{Name: "cross-network", Port: 15443, Protocol: meshv1.Protocol_PROTOCOL_TLS, Hosts: []string{"*.local"}, Tls: &meshv1.GatewayTLS{Mode: "AUTO_PASSTHROUGH"}},
		{Name: "db", Port: 3306, Protocol: meshv1.Protocol_PROTOCOL_TCP, Hosts: []string{"data/*"}},
	}}}
	rules := append(m.Routes, &generate.Route{Namespace: "data", Name: "db-edge", Rule: &meshv1.RouteRule{
		Hosts: []string{"db.data.svc.cluster.local"}, Gateways: []string{"edge/egress"},
		Tcp: []*meshv1.L4Route{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "db-replica.data.svc.cluster.local"}}}}}}})
	m = generate.NewMesh(m.Services, rules)
	for _, r := range m.Routes {
		if r.Name == "partners" {
			r.Rule.Gateways = []string{"mesh", "edge/egress"} // at the gateway too
		}
	}
	gws := []*generate.Gateway{gw}
	golden.CheckValid(t, "gateway-l4-listeners.json", generate.GatewayListeners(m, gws, generate.ListenPorts(m, gws)))
	var clusters []*cluster.Cluster
	for _, s := range m.Services {
		clusters = append(clusters, generate.ServiceClusters(m, s, generate.Envoy)...)
	}
	if !generate.AutoPassthrough(gws) {
		t.Error("the gateway's AUTO_PASSTHROUGH server is not seen")
	}
	auto := generate.SNIClusters(clusters)
	if len(auto) != len(clusters) || auto[0].Name != "outbound_.3306_._.db.data.svc.cluster.local" || auto[0].EdsClusterConfig.ServiceName != "outbound|3306||db.data.svc.cluster.local" {
		t.Errorf("auto passthrough clusters: %d of %d, first %s", len(auto), len(clusters), auto[0].Name)
	}
	golden.CheckValid(t, "gateway-sni-clusters.json", auto[:2])
	if generate.AutoPassthrough(nil) || generate.AutoPassthrough([]*generate.Gateway{{Spec: &meshv1.Gateway{Servers: gw.Spec.Servers[:1]}}}) {
		t.Error("clusters for AUTO_PASSTHROUGH without such a server")
	}
}

// TestMongoPorts: a MongoDB port's TCP proxies, outbound at its virtual
// IP and on the wildcard port and inbound, follow Envoy's mongo_proxy with
// the proxy's own stat prefix, as istiod sends them; a plain TCP port
// keeps the TCP proxy alone.
func TestMongoPorts(t *testing.T) {
	svc := func(name string, proto meshv1.Protocol, port uint32, vips ...string) *generate.Service {
		return &generate.Service{Namespace: "data", Name: name, Spec: &meshv1.Service{Hostnames: []string{name + ".data.svc.cluster.local"},
			Addresses: vips, Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "p", Number: port, Protocol: proto}}}}
	}
	m := generate.NewMesh([]*generate.Service{
		svc("orders", meshv1.Protocol_PROTOCOL_MONGO, 27017, "10.96.2.1"),
		svc("events", meshv1.Protocol_PROTOCOL_MONGO, 27018),
		svc("cache", meshv1.Protocol_PROTOCOL_TCP, 6379),
	}, nil)
	filters := func(fs []*listener.Filter) string {
		var out []string
		for _, f := range fs {
			out = append(out, f.Name)
		}
		return strings.Join(out, " ")
	}
	const mongo = "envoy.filters.network.mongo_proxy envoy.filters.network.tcp_proxy"
	got := map[string]string{}
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		if err := l.Validate(); err != nil {
			t.Fatalf("%s: %v", l.Name, err)
		}
		for _, c := range l.FilterChains {
			got[l.Name+" "+c.Name] = filters(c.Filters)
			if len(c.Filters) == 2 && c.Filters[0].Name == "envoy.filters.network.mongo_proxy" {
				var mp mongoproxy.MongoProxy
				var tp tcpproxy.TcpProxy
				if c.Filters[0].GetTypedConfig().UnmarshalTo(&mp) != nil || c.Filters[1].GetTypedConfig().UnmarshalTo(&tp) != nil || mp.StatPrefix != tp.StatPrefix {
					t.Errorf("%s: mongo_proxy counts under %q, the TCP proxy under %q", l.Name, mp.StatPrefix, tp.StatPrefix)
				}
			}
		}
	}
	for chain, want := range map[string]string{
		"10.96.2.1_27017 ": mongo, "0.0.0.0_27018 ": mongo, "0.0.0.0_6379 ": "envoy.filters.network.tcp_proxy",
	} {
		if got[chain] != want {
			t.Errorf("%s: filters %q, want %q", chain, got[chain], want)
		}
	}
	for chain, fs := range got {
		if strings.HasPrefix(chain, "virtualInbound 0.0.0.0_2701") && !strings.HasSuffix(fs, mongo) {
			t.Errorf("%s: filters %q, want them to end with %q", chain, fs, mongo)
		}
		if strings.HasPrefix(chain, "virtualInbound 0.0.0.0_6379") && strings.Contains(fs, "mongo") {
			t.Errorf("%s: filters %q, want no mongo_proxy", chain, fs)
		}
	}
	if !strings.Contains(fmt.Sprint(got), "virtualInbound 0.0.0.0_27017") {
		t.Errorf("no inbound chain for 27017: %v", got)
	}
}
