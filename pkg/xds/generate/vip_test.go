package generate_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// vipMesh: an HTTP Kubernetes service with an IPv4 and an IPv6 virtual IP,
// a ServiceEntry that claims the same virtual IP, two TCP databases on
// port 3306 with virtual IPs of their own, and one without.
func vipMesh() *generate.Mesh {
	svc := func(ns, name string, hosts []string, port uint32, proto meshv1.Protocol, vips ...string) *generate.Service {
		return &generate.Service{Namespace: ns, Name: name, Spec: &meshv1.Service{Hostnames: hosts, Addresses: vips,
			Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "p", Number: port, Protocol: proto}}}}
	}
	return generate.NewMesh([]*generate.Service{
		svc("shop", "cart", []string{"cart.shop.svc.cluster.local"}, 80, meshv1.Protocol_PROTOCOL_HTTP, "10.96.0.10", "fd00::10"),
		svc("shop", "mirror", []string{"alias.example.com"}, 80, meshv1.Protocol_PROTOCOL_HTTP, "10.96.0.10"),
		svc("shop", "db", []string{"db.shop.svc.cluster.local"}, 3306, meshv1.Protocol_PROTOCOL_TCP, "10.96.0.20"),
		svc("data", "db", []string{"db.data.svc.cluster.local"}, 3306, meshv1.Protocol_PROTOCOL_TCP, "10.96.0.30"),
		svc("shop", "legacy", []string{"legacy.example.com"}, 3306, meshv1.Protocol_PROTOCOL_TCP),
	}, nil)
}

func domains(rcs []*route.RouteConfiguration) map[string][]string {
	out := map[string][]string{}
	for _, rc := range rcs {
		for _, vh := range rc.VirtualHosts {
			out[vh.Name] = vh.Domains
		}
	}
	return out
}

// TestDomains: the domains of a sidecar's virtual hosts are Istio's for a
// Kubernetes service (FQDN, name.namespace.svc, name.namespace, the short
// name within its namespace, its virtual IPs, each with and without the
// port; see Istio's "Traffic routing" docs: reviews, reviews:9080,
// reviews.default.svc.cluster.local, ...); a ServiceEntry's host is its
// own; a virtual IP two services claim stays with the first (by
// namespace and name).
func TestDomains(t *testing.T) {
	m := vipMesh()
	inShop := m.For(generate.View{Namespace: "shop"})
	got := domains(generate.Routes(inShop, generate.Envoy))
	// In Istio 1.30's order: the absolute name (trailing dot) after the
	// host, the short name before name.namespace.svc; no port, as the
	// route configuration ignores it.
	want := []string{"cart.shop.svc.cluster.local", "cart.shop.svc.cluster.local.", "cart", "cart.shop.svc", "cart.shop", "10.96.0.10", "[fd00::10]"}
	if d := got["cart.shop.svc.cluster.local:80"]; !slices.Equal(d, want) {
		t.Errorf("in shop: %v\nwant %v", d, want)
	}
	if d := got["alias.example.com:80"]; !slices.Equal(d, []string{"alias.example.com", "alias.example.com."}) {
		t.Errorf("the ServiceEntry sharing the virtual IP: %v", d)
	}
	elsewhere := domains(generate.Routes(m.For(generate.View{Namespace: "other"}), generate.Envoy))
	if d := elsewhere["cart.shop.svc.cluster.local:80"]; slices.Contains(d, "cart") || !slices.Contains(d, "cart.shop") {
		t.Errorf("from another namespace: %v (no short name, name.namespace)", d)
	}
	rcs := generate.Routes(inShop, generate.Envoy)
	golden.CheckValid(t, "vip-routes.json", rcs)
	proxyless := domains(generate.Routes(inShop, generate.Proxyless))
	if d := proxyless["cart.shop.svc.cluster.local:80"]; len(d) != 2 {
		t.Errorf("proxyless domains %v: want the host and host:port grpc-go dials", d)
	}
}

// TestTCPListenersPerVIP: TCP services that share a port get a listener on
// each of their virtual IPs (the original destination picks it), and one
// without a virtual IP keeps the port's wildcard listener.
func TestTCPListenersPerVIP(t *testing.T) {
	var tcp []*listener.Listener
	for _, l := range generate.Listeners(vipMesh(), generate.Envoy, nil) {
		if strings.HasSuffix(l.Name, "_3306") {
			tcp = append(tcp, l)
		}
	}
	var names []string
	for _, l := range tcp {
		names = append(names, l.Name)
	}
	if want := []string{"0.0.0.0_3306", "10.96.0.20_3306", "10.96.0.30_3306"}; !slices.Equal(names, want) {
		t.Errorf("listeners %v, want %v", names, want)
	}
	golden.CheckValid(t, "vip-listeners.json", tcp)
}

// TestEgressPorts: a Sidecar's egress listener for a port decides what the
// proxy sees on that port, its listener without a port on the others, as
// in Istio: a service named only on some ports is seen on those alone.
func TestEgressPorts(t *testing.T) {
	svc := func(ns, name string, ports ...uint32) *generate.Service {
		s := &generate.Service{Namespace: ns, Name: name, Version: "1", ConfigVersion: "1", Spec: &meshv1.Service{
			Hostnames: []string{name + "." + ns + ".svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC}}
		for _, p := range ports {
			s.Spec.Ports = append(s.Spec.Ports, &meshv1.Port{Name: fmt.Sprint("p", p), Number: p, Protocol: meshv1.Protocol_PROTOCOL_HTTP})
		}
		return s
	}
	cart, db := svc("shop", "cart", 80, 9090), svc("data", "db", 9090, 5432)
	m := generate.NewMesh([]*generate.Service{cart, db, svc("web", "front", 80)}, nil)
	seen := m.For(generate.View{Namespace: "shop", Egress: []string{"./*"}, EgressPorts: map[uint32][]string{9090: {"data/*"}}})
	var got []string
	for _, s := range seen.Services {
		for _, c := range generate.ServiceClusters(seen, s, generate.Envoy) {
			got = append(got, c.Name)
		}
		if s.Name == "cart" && s.ConfigVersion == cart.ConfigVersion {
			t.Error("the copy seen on fewer ports keeps the service's version (its cached resources would be the whole service's)")
		}
	}
	want := []string{"outbound|9090||db.data.svc.cluster.local", "outbound|80||cart.shop.svc.cluster.local"}
	if !slices.Equal(got, want) {
		t.Errorf("clusters %v, want %v", got, want)
	}
	if len(cart.Spec.Ports) != 2 {
		t.Error("the mesh's service lost ports")
	}
}

// TestSidecarIngress: a Sidecar's ingress listeners are the proxy's inbound
// ports, each sent to its default endpoint as Istio does: a loopback
// address or a unix socket as a static cluster, the workload's own address
// on another port through the original destination, the port itself
// without one.
func TestSidecarIngress(t *testing.T) {
	m := vipMesh().For(generate.View{Namespace: "shop", Ingress: []*meshv1.IngressListener{
		{Port: 9080, Protocol: meshv1.Protocol_PROTOCOL_HTTP, DefaultEndpoint: "127.0.0.1:8080"},
		{Port: 9090, Protocol: meshv1.Protocol_PROTOCOL_TCP, DefaultEndpoint: "unix:///var/run/admin.sock"},
		{Port: 9091, Protocol: meshv1.Protocol_PROTOCOL_GRPC, DefaultEndpoint: "0.0.0.0:7070"},
		{Port: 9092, Protocol: meshv1.Protocol_PROTOCOL_TCP},
	}})
	clusters := generate.InboundClusters(m, generate.Envoy)
	var names []string
	for _, c := range clusters {
		names = append(names, c.Name)
	}
	if want := []string{"inbound|9080||", "inbound|9090||", "inbound|9091||", "inbound|9092||"}; !slices.Equal(names, want) {
		t.Errorf("inbound clusters %v, want %v (the ingress ports, not the services')", names, want)
	}
	golden.CheckValid(t, "ingress-clusters.json", clusters)
	var chains []string
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		if l.Name == generate.VirtualInboundListener {
			for _, c := range l.FilterChains {
				chains = append(chains, c.Name)
			}
		}
	}
	// Each port's mutual TLS and plaintext chains (Istio's default,
	// PERMISSIVE), and a TCP port's for TLS the workload terminates, named
	// as istiod names them, after the listener's own port's; then the
	// passthrough's.
	if want := []string{"virtualInbound-blackhole", "0.0.0.0_9080", "0.0.0.0_9080", "0.0.0.0_9090", "0.0.0.0_9090", "0.0.0.0_9090",
		"0.0.0.0_9091", "0.0.0.0_9091", "0.0.0.0_9092", "0.0.0.0_9092", "0.0.0.0_9092", "virtualInbound-catchall-http", "virtualInbound-catchall-http",
		generate.VirtualInboundListener, generate.VirtualInboundListener, generate.VirtualInboundListener}; !slices.Equal(chains, want) {
		t.Errorf("inbound chains %v, want %v", chains, want)
	}
}
