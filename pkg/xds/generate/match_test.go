package generate_test

import (
	"testing"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

func prefixes(routes []*route.Route) []string {
	var out []string
	for _, r := range routes {
		out = append(out, r.GetMatch().GetPrefix())
	}
	return out
}

// TestMatchGateways: a match's gateways override its rule's: a match for
// "mesh" applies at sidecars only, one naming a gateway at that gateway
// only (a gateway named without namespace is in the rule's).
func TestMatchGateways(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{Hostnames: []string{"cart.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	to := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}}}
	prefix := func(p string) *meshv1.StringMatch {
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: p}}
	}
	rule := &generate.Route{Namespace: "shop", Name: "cart", Rule: &meshv1.RouteRule{
		Hosts: []string{"cart.shop.svc.cluster.local"}, Gateways: []string{"mesh", "ingress"},
		Http: []*meshv1.HTTPRoute{
			{Match: []*meshv1.HTTPMatch{{Uri: prefix("/mesh"), Gateways: []string{"mesh"}}, {Uri: prefix("/edge"), Gateways: []string{"shop/ingress"}}}, Route: to},
			{Match: []*meshv1.HTTPMatch{{Uri: prefix("/both")}}, Route: to},
		}}}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{rule})
	if got := prefixes(generate.VirtualHost(m, "cart.shop.svc.cluster.local", 80).Routes); len(got) != 2 || got[0] != "/mesh" || got[1] != "/both" {
		t.Errorf("sidecar routes %v, want /mesh /both", got)
	}
	gw := &generate.Gateway{Namespace: "shop", Name: "ingress", Spec: &meshv1.Gateway{Servers: []*meshv1.GatewayServer{
		{Port: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*"}}}}}
	rcs := generate.GatewayRoutes(m, []*generate.Gateway{gw})
	if len(rcs) != 1 || len(rcs[0].VirtualHosts) != 1 {
		t.Fatalf("gateway routes %v", rcs)
	}
	if got := prefixes(rcs[0].VirtualHosts[0].Routes); len(got) != 2 || got[0] != "/edge" || got[1] != "/both" {
		t.Errorf("gateway routes %v, want /edge /both", got)
	}
}
