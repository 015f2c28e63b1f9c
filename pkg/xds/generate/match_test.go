package generate_test

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
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
	rcs := generate.GatewayRoutes(m, []*generate.Gateway{gw}, generate.ListenPorts(m, []*generate.Gateway{gw}))
	if len(rcs) != 1 || len(rcs[0].VirtualHosts) != 1 {
		t.Fatalf("gateway routes %v", rcs)
	}
	if got := prefixes(rcs[0].VirtualHosts[0].Routes); len(got) != 2 || got[0] != "/edge" || got[1] != "/both" {
		t.Errorf("gateway routes %v, want /edge /both", got)
	}
}

// TestMatchConditions: queryParams and withoutHeaders become Envoy's query
// parameter and inverted header matchers; a sourceNamespace match applies
// to the proxies of that namespace alone (never at a gateway, whose
// namespace the routes do not know).
func TestMatchConditions(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "search", Spec: &meshv1.Service{Hostnames: []string{"search.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	exact := func(v string) *meshv1.StringMatch {
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: v}}
	}
	to := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "search.shop.svc.cluster.local"}}}
	rule := &generate.Route{Namespace: "shop", Name: "search", Rule: &meshv1.RouteRule{Hosts: []string{"search.shop.svc.cluster.local"}, Http: []*meshv1.HTTPRoute{
		{Name: "query", Match: []*meshv1.HTTPMatch{{QueryParams: map[string]*meshv1.StringMatch{"q": exact("shoe")},
			WithoutHeaders: map[string]*meshv1.StringMatch{"x-canary": exact("no")}}}, Route: to},
		{Name: "local", Match: []*meshv1.HTTPMatch{{SourceNamespace: "shop"}}, Route: to},
		{Name: "rest", Route: to},
	}}}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{rule})
	names := func(rs []*route.Route) (out []string) {
		for _, r := range rs {
			out = append(out, r.Name)
		}
		return out
	}
	inShop := generate.VirtualHost(m.For(generate.View{Namespace: "shop"}), "search.shop.svc.cluster.local", 80)
	// In shop, local matches every request: rest, after it, is not sent.
	if got := names(inShop.Routes); !slices.Equal(got, []string{"query", "local"}) {
		t.Errorf("routes in shop %v, want query, local", got)
	}
	if got := names(generate.VirtualHost(m.For(generate.View{Namespace: "web"}), "search.shop.svc.cluster.local", 80).Routes); len(got) != 2 || got[1] != "rest" {
		t.Errorf("routes in web %v, want query, rest", got)
	}
	if generate.VirtualHostInputs(m.For(generate.View{Namespace: "shop"}), "search.shop.svc.cluster.local", 80) ==
		generate.VirtualHostInputs(m.For(generate.View{Namespace: "web"}), "search.shop.svc.cluster.local", 80) {
		t.Error("the virtual host's inputs do not name the namespace its routes depend on")
	}
	match := inShop.Routes[0].Match
	if len(match.QueryParameters) != 1 || match.QueryParameters[0].Name != "q" || len(match.Headers) != 1 || !match.Headers[0].InvertMatch {
		t.Errorf("match %v", match)
	}
	if err := inShop.Validate(); err != nil {
		t.Error(err)
	}
}

// TestCorsPolicy: a route's corsPolicy configures Envoy's CORS filter on
// the route (origins as string matchers, the rest as Envoy's
// comma-separated headers, maxAge in seconds); a proxyless client's route
// carries none (grpc-go would refuse a filter it lacks).
func TestCorsPolicy(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "api", Spec: &meshv1.Service{Hostnames: []string{"api.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	rule := &generate.Route{Namespace: "shop", Name: "api", Rule: &meshv1.RouteRule{Hosts: []string{"api.shop.svc.cluster.local"}, Http: []*meshv1.HTTPRoute{{
		Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "api.shop.svc.cluster.local"}}},
		Cors: &meshv1.Cors{
			AllowOrigins: []*meshv1.StringMatch{{Kind: &meshv1.StringMatch_Exact{Exact: "https://shop.example.com"}},
				{Kind: &meshv1.StringMatch_Regex{Regex: `https://.*\.example\.com`}}},
			AllowMethods: []string{"GET", "POST"}, AllowHeaders: []string{"x-user"}, ExposeHeaders: []string{"x-trace"},
			MaxAge: durationpb.New(24 * time.Hour), AllowCredentials: meshv1.Cors_CREDENTIALS_ALLOW, IgnoreUnmatchedPreflights: true,
		},
	}}}}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{rule})
	envoy := generate.SidecarVirtualHost(m, "api.shop.svc.cluster.local", 80)
	golden.CheckValid(t, "cors-virtual-host.json", []*route.VirtualHost{envoy})
	if len(envoy.Routes[0].TypedPerFilterConfig) != 1 {
		t.Errorf("Envoy route filter configs %v", envoy.Routes[0].TypedPerFilterConfig)
	}
	if got := generate.VirtualHost(m, "api.shop.svc.cluster.local", 80).Routes[0].TypedPerFilterConfig; len(got) != 0 {
		t.Errorf("proxyless route carries %v", got)
	}
}

// TestDelegate: a route that delegates is replaced by its delegate's
// routes, their matches within its own (one outside it is left out) and
// its timeout where theirs sets none; the delegate's version is part of
// the virtual host's inputs.
func TestDelegate(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{Hostnames: []string{"cart.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	prefix := func(p string) *meshv1.StringMatch {
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: p}}
	}
	to := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}}}
	root := &generate.Route{Namespace: "shop", Name: "cart", Version: "1", Rule: &meshv1.RouteRule{Hosts: []string{"cart.shop.svc.cluster.local"}, Http: []*meshv1.HTTPRoute{
		{Name: "api", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api")}}, Timeout: durationpb.New(3 * time.Second),
			Delegate: &meshv1.Delegate{Name: "cart-api", Namespace: "team"}},
		{Name: "rest", Route: to},
	}}}
	delegate := &generate.Route{Namespace: "team", Name: "cart-api", Version: "7", Rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{
		{Name: "v2", Match: []*meshv1.HTTPMatch{{Uri: prefix("/api/v2")}}, Route: to, Timeout: durationpb.New(time.Second)},
		{Name: "outside", Match: []*meshv1.HTTPMatch{{Uri: prefix("/admin")}}, Route: to},
		{Name: "all", Route: to},
	}}}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{root, delegate})
	vh := generate.SidecarVirtualHost(m, "cart.shop.svc.cluster.local", 80)
	var got []string
	for _, r := range vh.Routes {
		got = append(got, r.Name+" "+r.Match.GetPrefix()+" "+r.GetRoute().GetTimeout().AsDuration().String())
	}
	want := []string{"v2 /api/v2 1s", "all /api 3s", "rest / 0s"}
	if !slices.Equal(got, want) {
		t.Errorf("routes %q, want %q", got, want)
	}
	golden.CheckValid(t, "delegate-virtual-host.json", []*route.VirtualHost{vh})
	before := generate.VirtualHostInputs(m, "cart.shop.svc.cluster.local", 80)
	delegate.Version = "8"
	if generate.VirtualHostInputs(generate.NewMesh([]*generate.Service{svc}, []*generate.Route{root, delegate}), "cart.shop.svc.cluster.local", 80) == before {
		t.Error("a new version of the delegate keeps the virtual host's inputs")
	}
}

// TestDelegatedSourceLabels: a delegating route's source labels and its
// delegate's make one selector (both must hold), which the mesh names
// among its source selectors, so that the proxies it selects have a class
// whose routes carry the merged route.
func TestDelegatedSourceLabels(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{Hostnames: []string{"cart.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	to := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}}}
	root := &generate.Route{Namespace: "shop", Name: "cart", Rule: &meshv1.RouteRule{Hosts: []string{"cart.shop.svc.cluster.local"}, Http: []*meshv1.HTTPRoute{
		{Match: []*meshv1.HTTPMatch{{SourceLabels: map[string]string{"app": "web"}}}, Delegate: &meshv1.Delegate{Name: "d", Namespace: "shop"}}}}}
	delegate := &generate.Route{Namespace: "shop", Name: "d", Rule: &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{
		{Name: "canary", Match: []*meshv1.HTTPMatch{{SourceLabels: map[string]string{"track": "canary"}}}, Route: to}}}}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{root, delegate})
	merged := generate.SelectorTag(map[string]string{"app": "web", "track": "canary"})
	if _, ok := m.SourceSelectors()[merged]; !ok || len(m.SourceSelectors()) != 1 {
		t.Fatalf("source selectors %v, want the merged one alone", m.SourceSelectors())
	}
	for sources, want := range map[string]int{merged: 1, "": 0} {
		v := generate.View{Namespace: "shop"}
		if sources != "" {
			v.Sources = []string{sources}
		}
		if got := len(generate.VirtualHost(m.For(v), "cart.shop.svc.cluster.local", 80).Routes); got != want {
			t.Errorf("sources %q: %d routes, want %d", sources, got, want)
		}
	}
}

// TestDefaultRouteFollowsThePolicy: a host without a VirtualService gets
// its service's consistent hash on its default route; a DestinationRule
// that sets one after the virtual host was generated (a new version of
// the service's configuration) changes its inputs, so that the cached
// virtual host is not served without the hash policy.
func TestDefaultRouteFollowsThePolicy(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "cart", ConfigVersion: "1", Spec: &meshv1.Service{
		Hostnames: []string{"cart.shop.svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	before := generate.VirtualHostInputs(generate.NewMesh([]*generate.Service{svc}, nil), "cart.shop.svc.cluster.local", 80)
	hashed := *svc
	hashed.ConfigVersion = "2"
	hashed.Policy = &meshv1.TrafficPolicy{Host: "cart.shop.svc.cluster.local",
		ConsistentHash: &meshv1.ConsistentHash{Key: &meshv1.ConsistentHash_HttpCookieName{HttpCookieName: "user"}}}
	m := generate.NewMesh([]*generate.Service{&hashed}, nil)
	if generate.VirtualHostInputs(m, "cart.shop.svc.cluster.local", 80) == before {
		t.Error("a consistent hash added by a DestinationRule keeps the default virtual host's inputs")
	}
	vh := generate.SidecarVirtualHost(m, "cart.shop.svc.cluster.local", 80)
	if len(vh.Routes) == 0 || len(vh.Routes[0].GetRoute().GetHashPolicy()) == 0 {
		t.Errorf("the default route has no hash policy: %v", vh.Routes)
	}
}

// TestGatewayHostMergesRules: a gateway's virtual host holds the routes of
// every rule bound to it for that host, as istiod merges them: the
// VirtualServices' in their order, each up to its first catch-all route,
// with the catch-all routes moved last; the Gateway API's routes ranked by
// precedence across the routes (a longer prefix of one route before a
// shorter of another) up to the first catch-all: the prefix "/" ranks
// above a regular expression, which is then never sent. The first rule of
// a host used to take it alone.
func TestGatewayHostMergesRules(t *testing.T) {
	svc := &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{Hostnames: []string{"cart.shop.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	to := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}}}
	prefix := func(p string) []*meshv1.HTTPMatch {
		return []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: p}}}}
	}
	rule := func(name, host, gateway string, api bool, http ...*meshv1.HTTPRoute) *generate.Route {
		return &generate.Route{Namespace: "shop", Name: name, Rule: &meshv1.RouteRule{Hosts: []string{host}, Gateways: []string{gateway}, GatewayApi: api, Http: http}}
	}
	m := generate.NewMesh([]*generate.Service{svc}, []*generate.Route{
		rule("a", "shop.example.com", "ingress", false, &meshv1.HTTPRoute{Name: "a", Match: prefix("/a"), Route: to}, &meshv1.HTTPRoute{Name: "a-all", Route: to},
			&meshv1.HTTPRoute{Name: "a-never", Match: prefix("/z"), Route: to}),
		rule("b", "shop.example.com", "ingress", false, &meshv1.HTTPRoute{Name: "b", Match: prefix("/b"), Route: to}),
		rule("r1", "web.example.com", "web", true, &meshv1.HTTPRoute{Name: "r1.0", Match: prefix("/api"), Route: to}),
		rule("r2", "web.example.com", "web", true, &meshv1.HTTPRoute{Name: "r2.0", Match: prefix("/api/v1"), Route: to},
			&meshv1.HTTPRoute{Name: "r2.1", Match: prefix("/"), Route: to}),
		rule("r3", "web.example.com", "web", true, &meshv1.HTTPRoute{Name: "r3.0", Match: []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "/v[0-9]+/.*"}}}}, Route: to}),
	})
	server := []*meshv1.GatewayServer{{Port: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*"}}}
	gws := []*generate.Gateway{
		{Namespace: "shop", Name: "ingress", Spec: &meshv1.Gateway{Servers: server}},
		{Namespace: "shop", Name: "web", Spec: &meshv1.Gateway{Servers: server, GatewayApi: true}},
	}
	got := map[string][]string{}
	for _, rc := range generate.GatewayRoutes(m, gws, generate.ListenPorts(m, gws)) {
		for _, vh := range rc.VirtualHosts {
			for _, r := range vh.Routes {
				got[vh.Name] = append(got[vh.Name], r.Name)
			}
		}
	}
	if want := []string{"a", "b", "a-all"}; !slices.Equal(got["shop.example.com:80"], want) {
		t.Errorf("VirtualServices' routes %v, want %v", got["shop.example.com:80"], want)
	}
	if want := []string{"r2.0", "r1.0", "r2.1"}; !slices.Equal(got["web.example.com:80"], want) {
		t.Errorf("Gateway API routes %v, want %v", got["web.example.com:80"], want)
	}
}
