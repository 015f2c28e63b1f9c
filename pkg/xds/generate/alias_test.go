package generate_test

import (
	"slices"
	"strings"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestExternalNameIsAnAlias: an ExternalName Service is a name of the host
// it aliases, as istiod has it. It gets no cluster, listener or virtual
// host of its own; where the host is in the mesh, the host's virtual host
// answers to the alias's names too and a route to the alias goes to the
// host's cluster; where it is not, nothing is sent for it (requests pass
// through).
func TestExternalNameIsAnAlias(t *testing.T) {
	backend, legacy, search := aliasServices()
	caller := &generate.Route{Namespace: "shop", Name: "caller", Rule: &meshv1.RouteRule{Hosts: []string{"front.example.com"},
		Http: []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "legacy.shop.svc.cluster.local"}}}}}}}
	m := generate.NewMesh([]*generate.Service{backend, legacy, search}, []*generate.Route{caller}).For(generate.View{Namespace: "shop"})

	var clusters []string
	for _, c := range generate.Clusters(m, generate.Envoy) {
		clusters = append(clusters, c.Name)
	}
	for _, name := range clusters {
		if strings.Contains(name, "legacy") || strings.Contains(name, "search") {
			t.Errorf("cluster %s: an alias has none", name)
		}
	}
	if !slices.Contains(clusters, "outbound|80||backend.shop.svc.cluster.local") {
		t.Fatalf("clusters %v: want the aliased service's", clusters)
	}
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		if strings.Contains(l.Name, "legacy") || strings.Contains(l.Name, "search") {
			t.Errorf("listener %s: an alias has none", l.Name)
		}
	}
	var domains []string
	var routed string
	for _, rc := range generate.Routes(m, generate.Envoy) {
		for _, vh := range rc.VirtualHosts {
			if strings.HasPrefix(vh.Name, "backend.") {
				domains = vh.Domains
			}
			if strings.HasPrefix(vh.Name, "legacy.") || strings.HasPrefix(vh.Name, "search.") {
				t.Errorf("virtual host %s: an alias has none", vh.Name)
			}
			if strings.HasPrefix(vh.Name, "front.example.com") {
				routed = vh.Routes[0].GetRoute().GetCluster()
			}
		}
	}
	for _, want := range []string{"backend", "legacy", "legacy.shop.svc.cluster.local", "legacy.shop"} {
		if !slices.Contains(domains, want) {
			t.Errorf("the aliased service's domains %v lack %s", domains, want)
		}
	}
	if routed != "outbound|80||backend.shop.svc.cluster.local" {
		t.Errorf("a route to the alias goes to %q, want the aliased service's cluster", routed)
	}
}

// TestProxylessClientsDialAliases: a proxyless client dialling an alias's
// name gets a listener for it, as istiod sends one. Where the aliased host
// is a service of the mesh on the port, the name is routed as that host
// (its cluster, its VirtualService); where it is not, the name gets a
// cluster of its own that resolves it by DNS, so the call still reaches
// what the name resolves to.
func TestProxylessClientsDialAliases(t *testing.T) {
	backend, legacy, search := aliasServices()
	backend.Policy = &meshv1.TrafficPolicy{Subsets: []*meshv1.Subset{{Name: "v2", Labels: map[string]string{"version": "v2"}}}}
	canary := &generate.Route{Namespace: "shop", Name: "backend", Rule: &meshv1.RouteRule{Hosts: []string{"backend.shop.svc.cluster.local"},
		Http: []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "backend.shop.svc.cluster.local", Subset: "v2"}}}}}}}
	m := generate.NewMesh([]*generate.Service{backend, legacy, search}, []*generate.Route{canary}).For(generate.View{Namespace: "shop"})

	var listeners []string
	for _, l := range generate.Listeners(m, generate.Proxyless, nil) {
		listeners = append(listeners, l.Name)
	}
	for _, want := range []string{"backend.shop.svc.cluster.local:80", "legacy.shop.svc.cluster.local:80", "search.shop.svc.cluster.local:80"} {
		if !slices.Contains(listeners, want) {
			t.Errorf("listeners %v lack %s", listeners, want)
		}
	}
	routed := map[string]string{}
	for _, rc := range generate.Routes(m, generate.Proxyless) {
		for _, vh := range rc.VirtualHosts {
			if !slices.Contains(vh.Domains, strings.TrimSuffix(rc.Name, ":80")) {
				t.Errorf("route configuration %s: virtual host %s answers to %v", rc.Name, vh.Name, vh.Domains)
			}
			if len(vh.Routes) > 0 {
				routed[rc.Name] = vh.Routes[0].GetRoute().GetCluster()
			}
		}
	}
	if got := routed["legacy.shop.svc.cluster.local:80"]; got != "outbound|80|v2|backend.shop.svc.cluster.local" {
		t.Errorf("the alias of a mesh service is routed to %q, want as that service's VirtualService says", got)
	}
	if got := routed["search.shop.svc.cluster.local:80"]; got != "outbound|80||search.shop.svc.cluster.local" {
		t.Errorf("the alias of an outside name is routed to %q, want its own cluster", got)
	}
	var aliases []string
	for _, c := range generate.Clusters(m, generate.Proxyless) {
		if !strings.Contains(c.Name, "legacy") && !strings.Contains(c.Name, "search") {
			continue
		}
		aliases = append(aliases, c.Name)
		addr := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if c.GetType().String() != "LOGICAL_DNS" || addr.GetAddress() != "search.shop.svc.cluster.local" || addr.GetPortValue() != 80 {
			t.Errorf("cluster %s: %v to %v, want LOGICAL_DNS to the alias's name", c.Name, c.GetType(), addr)
		}
	}
	if !slices.Equal(aliases, []string{"outbound|80||search.shop.svc.cluster.local"}) {
		t.Errorf("alias clusters %v, want the outside name's alone", aliases)
	}
	if len(generate.AliasClusters(m, generate.Envoy)) != 0 {
		t.Error("an Envoy gets alias clusters; its traffic to an outside name passes through")
	}
}

// aliasServices are shop's backend (a service on port 80), legacy (an
// ExternalName Service naming backend) and search (one naming a host
// outside the mesh).
func aliasServices() (backend, legacy, search *generate.Service) {
	http := []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}
	svc := func(name string, spec *meshv1.Service) *generate.Service {
		spec.Hostnames, spec.Ports = []string{name + ".shop.svc.cluster.local"}, http
		return &generate.Service{Namespace: "shop", Name: name, Spec: spec}
	}
	return svc("backend", &meshv1.Service{Resolution: meshv1.Resolution_RESOLUTION_STATIC, Addresses: []string{"10.96.0.9"}}),
		svc("legacy", &meshv1.Service{Resolution: meshv1.Resolution_RESOLUTION_DNS, AliasOf: "backend.shop.svc.cluster.local"}),
		svc("search", &meshv1.Service{Resolution: meshv1.Resolution_RESOLUTION_DNS, AliasOf: "search.example.com"})
}
