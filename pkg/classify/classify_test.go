package classify

import (
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/types/known/structpb"
)

func node(id string, meta map[string]any) *core.Node {
	s, err := structpb.NewStruct(meta)
	if err != nil {
		panic(err)
	}
	return &core.Node{Id: id, Metadata: s}
}

func index(t *testing.T, objs ...model.Stored) *Index {
	t.Helper()
	b := meshbuild.New()
	b.Reset(objs)
	return NewIndex(b.Build())
}

func TestClassify(t *testing.T) {
	sidecar := func(ns, name string, selector map[string]string, hosts ...string) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindScope, Namespace: ns, Name: name},
			Object: &meshv1.Scope{WorkloadSelector: selector, Egress: []*meshv1.EgressListener{{Hosts: hosts}}}}
	}
	gateway := model.Stored{Key: model.Key{Kind: model.KindGateway, Namespace: "edge", Name: "public"},
		Object: &meshv1.Gateway{Selector: map[string]string{"istio": "ingressgateway"}}}
	ix := index(t, sidecar("shop", "default", nil, "./*"), sidecar("shop", "cart", map[string]string{"app": "cart"}, "shop/*", "pay/*"), gateway)
	tests := []struct {
		node *core.Node
		want string
	}{
		{node("sidecar~10.0.0.1~a.other~other.svc.cluster.local", nil), "envoy"},
		{node("grpc-client", map[string]any{"GENERATOR": "grpc", "NAMESPACE": "other"}), "proxyless"},
		{node("sidecar~10.0.0.2~web.shop~shop.svc.cluster.local", nil), "envoy/shop/default"},
		{node("x", map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": "cart"}}), "envoy/shop/cart"},
		{node("router~10.0.0.3~gw.edge~edge.svc.cluster.local", map[string]any{"LABELS": map[string]any{"istio": "ingressgateway"}}), "router/edge/public;edge;"},
		{node("router~10.0.0.4~gw.edge~edge.svc.cluster.local", nil), "router/;edge;"},
	}
	for _, tc := range tests {
		if got := ix.Classify(tc.node); string(got) != tc.want {
			t.Errorf("%s: class %q, want %q", tc.node.Id, got, tc.want)
		}
	}
	if _, v := ix.View("envoy/shop/cart"); v.Namespace != "shop" || len(v.Egress) != 2 {
		t.Errorf("view of envoy/shop/cart: %+v, want namespace shop and its Sidecar's two hosts", v)
	}
	if gws, ok := Gateways("router/edge/public"); !ok || len(gws) != 1 || gws[0] != "edge/public" {
		t.Errorf("gateways of the router class: %v %v", gws, ok)
	}
	var none *Index
	if got := none.Classify(node("x", map[string]any{"NAMESPACE": "shop"})); got != "envoy" {
		t.Errorf("before the first build: class %q, want envoy", got)
	}
	// With a service exported to its own namespace only, each namespace
	// with something of its own is a class, and every other namespace
	// shares one, however many clients claim.
	private := model.Stored{Key: model.Key{Kind: model.KindService, Namespace: "pay", Name: "ledger"},
		Object: &meshv1.Service{Hostnames: []string{"ledger.pay"}, ExportTo: []string{".", "audit"}}}
	restricted := index(t, private)
	for ns, want := range map[string]cache.Class{"pay": "envoy/pay/", "audit": "envoy/audit/", "made-up-1": "envoy/~/", "made-up-2": "envoy/~/"} {
		if got := restricted.Classify(node("x", map[string]any{"NAMESPACE": ns})); got != want {
			t.Errorf("namespace %s: class %q, want %q", ns, got, want)
		}
	}
	if _, v := restricted.View("envoy/~/"); v.Namespace != Elsewhere {
		t.Errorf("view of the shared class: %+v", v)
	}
	if !ix.Same(index(t, sidecar("shop", "default", nil, "other/*"), sidecar("shop", "cart", map[string]string{"app": "cart"}), gateway)) {
		t.Error("an egress change moved proxies to other classes")
	}
	if ix.Same(index(t, sidecar("shop", "default", nil, "./*"), gateway)) {
		t.Error("a Sidecar removed left every proxy in its class")
	}
}

// TestClassifyBySecurityPolicies: a namespace with policies has classes of
// its own, listing the selector policies that select a workload (its own
// namespace's and the root namespace's); a change of selectors changes
// the index.
func TestClassifyBySecurityPolicies(t *testing.T) {
	authz := func(ns, name string, selector map[string]string) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindAuthorization, Namespace: ns, Name: name},
			Object: &meshv1.AuthorizationPolicy{Selector: selector}}
	}
	peer := func(ns, name string, selector map[string]string) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindPeerAuth, Namespace: ns, Name: name},
			Object: &meshv1.PeerAuthentication{Selector: selector, Mode: meshv1.MTLSMode_MTLS_MODE_STRICT}}
	}
	greeter := map[string]string{"app": "greeter"}
	ix := index(t, authz("demo", "no-list", greeter), peer("demo", "default", nil))
	grpcServer := node("server", map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo", "LABELS": map[string]any{"app": "greeter"}})
	for n, want := range map[*core.Node]string{
		grpcServer: "proxyless/demo//a:no-list",
		node("client", map[string]any{"GENERATOR": "grpc", "NAMESPACE": "demo"}):  "proxyless/demo/",
		node("client", map[string]any{"GENERATOR": "grpc", "NAMESPACE": "other"}): "proxyless",
	} {
		if got := ix.Classify(n); string(got) != want {
			t.Errorf("%s: class %q, want %q", n.Id, got, want)
		}
	}
	if _, v := ix.View("proxyless/demo//a:no-list"); v.Namespace != "demo" || len(v.Policies) != 1 || v.Policies[0] != "a:no-list" {
		t.Errorf("view %+v", v)
	}
	// The root namespace's policies apply everywhere: every namespace has
	// classes of its own, and its selector policies select in each.
	withRoot := index(t, authz("demo", "no-list", greeter), authz("istio-system", "deny-debug", greeter), peer("istio-system", "gw", map[string]string{"istio": "gw"}))
	if got := withRoot.Classify(grpcServer); got != "proxyless/demo//a:no-list,a:~deny-debug" {
		t.Errorf("with a root policy: %q", got)
	}
	if got := withRoot.Classify(node("client", map[string]any{"GENERATOR": "grpc", "NAMESPACE": "other", "LABELS": map[string]any{"istio": "gw"}})); got != "proxyless/~/" {
		t.Errorf("a namespace with nothing of its own: %q (a root PeerAuthentication's selector selects the root namespace only)", got)
	}
	if ix.Same(index(t, authz("demo", "no-list", map[string]string{"app": "other"}), peer("demo", "default", nil))) {
		t.Error("a changed selector left the index the same")
	}
}

// TestViewOutboundPolicy: a Sidecar's outbound traffic policy is its
// class's.
func TestViewOutboundPolicy(t *testing.T) {
	ix := index(t, model.Stored{Key: model.Key{Kind: model.KindScope, Namespace: "shop", Name: "default"},
		Object: &meshv1.Scope{OutboundPolicy: meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY,
			Egress: []*meshv1.EgressListener{{Hosts: []string{"./*"}}}}})
	class := ix.Classify(node("sidecar~10.0.0.2~web.shop~shop.svc.cluster.local", nil))
	if _, v := ix.View(class); v.Outbound != meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY {
		t.Errorf("class %s: outbound %s, want its Sidecar's REGISTRY_ONLY", class, v.Outbound)
	}
}

// TestRootDefaultSidecar: the root namespace's Sidecar without a selector
// is the default of the namespaces without a Sidecar of their own; its
// "./*" means the proxy's own namespace; namespaces with nothing of their
// own share one class.
func TestRootDefaultSidecar(t *testing.T) {
	scope := func(ns, name string, selector map[string]string, hosts ...string) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindScope, Namespace: ns, Name: name},
			Object: &meshv1.Scope{WorkloadSelector: selector, Egress: []*meshv1.EgressListener{{Hosts: hosts}}}}
	}
	svc := model.Stored{Key: model.Key{Kind: model.KindService, Namespace: "shop", Name: "cart"},
		Object: &meshv1.Service{Hostnames: []string{"cart.shop.svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}
	ix := index(t, scope("istio-system", "default", nil, "./*", "istio-system/*"), scope("pay", "default", nil, "*/*"), svc)
	for n, want := range map[*core.Node]string{
		node("sidecar~10.0.0.1~web.shop~shop.svc.cluster.local", nil):         "envoy/shop/~default",
		node("sidecar~10.0.0.2~api.pay~pay.svc.cluster.local", nil):           "envoy/pay/default",
		node("sidecar~10.0.0.3~x.nowhere~nowhere.svc.cluster.local", nil):     "envoy/~/~default",
		node("sidecar~10.0.0.4~x.elsewhere~elsewhere.svc.cluster.local", nil): "envoy/~/~default",
	} {
		if got := ix.Classify(n); string(got) != want {
			t.Errorf("%s: class %q, want %q", n.Id, got, want)
		}
	}
	if _, v := ix.View("envoy/shop/~default"); v.Namespace != "shop" || len(v.Egress) != 2 || v.Egress[0] != "./*" {
		t.Errorf("view of the root default in shop: %+v", v)
	}
}

// TestSourceClasses: the proxies a route match's sourceLabels select get a
// class of their own (the selector's tag, which the view carries as a
// source), the others keep theirs; a namespace a match names as its source
// gets classes of its own, and any other shares one; a change of the
// selectors changes classes.
func TestSourceClasses(t *testing.T) {
	rule := func(labels map[string]string, ns string) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindRouteRule, Namespace: "shop", Name: "cart"}, Object: &meshv1.RouteRule{
			Hosts: []string{"cart.shop.svc.cluster.local"}, Http: []*meshv1.HTTPRoute{{
				Match: []*meshv1.HTTPMatch{{SourceLabels: labels, SourceNamespace: ns}},
				Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "cart.shop.svc.cluster.local"}}}}}}}
	}
	canary := map[string]string{"track": "canary"}
	ix := index(t, rule(canary, "batch"))
	tag := generate.SelectorTag(canary)
	for id, want := range map[string]string{
		"plain":  "envoy/~/",
		"canary": "envoy/~//" + tag,
		"batch":  "envoy/batch/",
	} {
		ns, labels := "web", map[string]any{}
		if id == "canary" {
			labels["track"] = "canary"
		}
		if id == "batch" {
			ns = "batch"
		}
		if got := ix.Classify(node(id, map[string]any{"NAMESPACE": ns, "LABELS": labels})); string(got) != want {
			t.Errorf("%s: class %q, want %q", id, got, want)
		}
	}
	if _, v := ix.View(cache.Class("envoy/~//" + tag)); len(v.Sources) != 1 || v.Sources[0] != tag || len(v.Policies) != 0 {
		t.Errorf("view %+v: want the source tag alone", v)
	}
	if ix.Same(index(t, rule(map[string]string{"track": "stable"}, "batch"))) {
		t.Error("another source selector keeps every class")
	}
}

// TestGatewaysBoundToNamespace: with shared gateway namespaces, a router
// is selected by its own namespace's Gateways alone, whatever labels it
// claims, unless its namespace is shared; "*" binds none, as istiod.
func TestGatewaysBoundToNamespace(t *testing.T) {
	gw := func(ns, name string) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindGateway, Namespace: ns, Name: name},
			Object: &meshv1.Gateway{Selector: map[string]string{"istio": "payments-gateway"}}}
	}
	b := meshbuild.New()
	for _, o := range []model.Stored{gw("payments", "pay"), gw("shop", "shop")} {
		b.Set(o.Key, meshbuild.Entry{Object: o.Object, ModRev: 1})
	}
	built := b.Build()
	router := func(ns string) *core.Node {
		return node("router~10.0.0.9~gw."+ns+"~"+ns+".svc.cluster.local", map[string]any{"NAMESPACE": ns, "LABELS": map[string]any{"istio": "payments-gateway"}})
	}
	for name, tc := range map[string]struct {
		opts []Option
		ns   string
		want string
	}{
		"another namespace's labels, bound":  {[]Option{SharedGatewayNamespaces([]string{"istio-system"})}, "shop", "router/shop/shop;shop;"},
		"its own namespace's, bound":         {[]Option{SharedGatewayNamespaces([]string{"istio-system"})}, "payments", "router/payments/pay;payments;"},
		"a shared namespace":                 {[]Option{SharedGatewayNamespaces([]string{"istio-system"})}, "istio-system", "router/payments/pay,shop/shop;istio-system;"},
		"every namespace bound, none shared": {[]Option{SharedGatewayNamespaces([]string{})}, "istio-system", "router/;istio-system;"},
		"unbound, as istiod":                 {nil, "shop", "router/payments/pay,shop/shop;shop;"},
		"unbound by *":                       {[]Option{SharedGatewayNamespaces([]string{"*"})}, "shop", "router/payments/pay,shop/shop;shop;"},
	} {
		t.Run(name, func(t *testing.T) {
			if got := NewIndex(built, tc.opts...).Classify(router(tc.ns)); string(got) != tc.want {
				t.Errorf("class %q, want %q", got, tc.want)
			}
		})
	}
}

// TestUnprivilegedRouters: a gateway proxy that says it runs unprivileged
// (UNPRIVILEGED_POD, as Istio's agent parses it) has a class of its own,
// which says so; a sidecar's metadata changes nothing.
func TestUnprivilegedRouters(t *testing.T) {
	gateway := model.Stored{Key: model.Key{Kind: model.KindGateway, Namespace: "edge", Name: "public"},
		Object: &meshv1.Gateway{Selector: map[string]string{"istio": "ingressgateway"}}}
	ix := index(t, gateway)
	router := func(unprivileged string) cache.Class {
		md := map[string]any{"NAMESPACE": "edge", "LABELS": map[string]any{"istio": "ingressgateway"}}
		if unprivileged != "" {
			md["UNPRIVILEGED_POD"] = unprivileged
		}
		return ix.Classify(node("router~10.0.0.9~gw.edge~edge.svc.cluster.local", md))
	}
	privileged, unprivileged := router(""), router("true")
	if privileged == unprivileged || ParseClass(privileged).Unprivileged() || !ParseClass(unprivileged).Unprivileged() {
		t.Errorf("classes %q and %q: want two, the second unprivileged", privileged, unprivileged)
	}
	if router("1") != unprivileged || router("false") != privileged || router("maybe") != privileged {
		t.Errorf("UNPRIVILEGED_POD 1, false, maybe: %q, %q, %q", router("1"), router("false"), router("maybe"))
	}
	if _, ok := Gateways(unprivileged); !ok {
		t.Errorf("%q is not a router class", unprivileged)
	}
	sidecar := func(md map[string]any) cache.Class {
		return ix.Classify(node("sidecar~10.0.0.8~a.edge~edge.svc.cluster.local", md))
	}
	if a, b := sidecar(map[string]any{"NAMESPACE": "edge"}), sidecar(map[string]any{"NAMESPACE": "edge", "UNPRIVILEGED_POD": "true"}); a != b {
		t.Errorf("a sidecar's class changed with UNPRIVILEGED_POD: %q, %q", a, b)
	}
}

// TestRouterTopology: a gateway proxy whose agent says its gateway
// topology (PROXY_CONFIG gatewayTopology, from the pod's annotation over
// the mesh's defaultConfig) has a class that carries it; one that says
// none keeps the mesh's; a sidecar's changes nothing.
func TestRouterTopology(t *testing.T) {
	gateway := model.Stored{Key: model.Key{Kind: model.KindGateway, Namespace: "edge", Name: "public"},
		Object: &meshv1.Gateway{Selector: map[string]string{"istio": "ingressgateway"}}}
	ix := index(t, gateway)
	classOf := func(kind string, proxyConfig map[string]any) cache.Class {
		md := map[string]any{"NAMESPACE": "edge", "LABELS": map[string]any{"istio": "ingressgateway"}}
		if proxyConfig != nil {
			md["PROXY_CONFIG"] = proxyConfig
		}
		return ix.Classify(node(kind+"~10.0.0.9~gw.edge~edge.svc.cluster.local", md))
	}
	plain := classOf("router", nil)
	if _, _, ok := ParseClass(plain).Topology(); ok || classOf("router", map[string]any{"concurrency": 2.0}) != plain {
		t.Errorf("a router saying no topology: %q", plain)
	}
	behindTwo := classOf("router", map[string]any{"gatewayTopology": map[string]any{"numTrustedProxies": 2.0, "forwardClientCertDetails": "APPEND_FORWARD"}})
	trusted, details, ok := ParseClass(behindTwo).Topology()
	if behindTwo == plain || !ok || trusted != 2 || details != meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_APPEND_FORWARD {
		t.Errorf("class %q: topology %d %v %v, want 2 APPEND_FORWARD", behindTwo, trusted, details, ok)
	}
	if _, ok := Gateways(behindTwo); !ok {
		t.Errorf("%q is not a router class", behindTwo)
	}
	if a, b := classOf("sidecar", nil), classOf("sidecar", map[string]any{"gatewayTopology": map[string]any{"numTrustedProxies": 2.0}}); a != b {
		t.Errorf("a sidecar's class changed with a gateway topology: %q, %q", a, b)
	}
}

// TestClassesOfEnvoyExtensions: Telemetries and EnvoyFilters shape the
// classes of Envoys (gateways too) and not of proxyless clients; an
// EnvoyFilter's version pattern splits Envoys by whether their version
// matches it, not by version.
func TestClassesOfEnvoyExtensions(t *testing.T) {
	telemetry := model.Stored{Key: model.Key{Kind: model.KindTelemetry, Namespace: "shop", Name: "cart-logs"},
		Object: &meshv1.Telemetry{Selector: map[string]string{"app": "cart"}}}
	filter := model.Stored{Key: model.Key{Kind: model.KindEnvoyFilter, Namespace: "istio-system", Name: "old-proxies"},
		Object: &meshv1.EnvoyFilter{Patches: []*meshv1.EnvoyPatch{{ProxyVersion: `^1\.2`}}}}
	gateway := model.Stored{Key: model.Key{Kind: model.KindGateway, Namespace: "istio-system", Name: "public"},
		Object: &meshv1.Gateway{Selector: map[string]string{"istio": "ingressgateway"}}}
	ix := index(t, telemetry, filter, gateway)
	cart := func(version string, proxyless bool) *core.Node {
		md := map[string]any{"NAMESPACE": "shop", "LABELS": map[string]any{"app": "cart"}, "ISTIO_VERSION": version}
		if proxyless {
			md["GENERATOR"] = "grpc"
		}
		return node("x", md)
	}
	for _, tc := range []struct {
		node *core.Node
		want string
	}{
		{cart("1.30.3", false), "envoy/shop//t:cart-logs,v:0"},
		{cart("1.31.0", false), "envoy/shop//t:cart-logs,v:0"},
		{cart("1.2.9", false), "envoy/shop//t:cart-logs,v:1"},
		{cart("1.2.9", true), "proxyless/shop/"},
		{node("router~10.0.0.3~gw.istio-system~istio-system.svc.cluster.local", map[string]any{"NAMESPACE": "istio-system",
			"LABELS": map[string]any{"istio": "ingressgateway"}, "ISTIO_VERSION": "1.30.3"}), "router/istio-system/public;istio-system;v:0"},
	} {
		if got := ix.Classify(tc.node); string(got) != tc.want {
			t.Errorf("%v: class %q, want %q", tc.node.Metadata.AsMap(), got, tc.want)
		}
	}
	if _, v := ix.View("envoy/shop//t:cart-logs,v:1"); !v.ProxyVersions[`^1\.2`] || len(v.Policies) != 1 {
		t.Errorf("view %+v: want the version pattern matched and the Telemetry among its policies", v)
	}
}
