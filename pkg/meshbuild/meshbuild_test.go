package meshbuild

import (
	"fmt"
	"math/rand/v2"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/proto"
)

func service(name string, hosts ...string) *meshv1.Service {
	return &meshv1.Service{Hostnames: hosts, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}
}

func endpoints(service, shard string, addrs ...string) *meshv1.Endpoints {
	o := &meshv1.Endpoints{Service: service, Shard: shard}
	for _, a := range addrs {
		o.Endpoints = append(o.Endpoints, &meshv1.Endpoint{Address: a})
	}
	return o
}

// nsKey is the key of an object of namespace ns.
func nsKey(kind model.Kind, name string) model.Key {
	return model.Key{Kind: kind, Namespace: "ns", Name: name}
}

// summary describes a service as the generators see it.
func summary(s *generate.Service) string {
	if s == nil {
		return "none"
	}
	var addrs []string
	for _, e := range s.Endpoints {
		addrs = append(addrs, e.Address)
	}
	return fmt.Sprintf("%s/%s v=%s c=%s policy=%v eps=%v", s.Namespace, s.Name, s.Version, s.ConfigVersion, s.Policy != nil, addrs)
}

// TestEndpointChangesMatchAWholeJoin makes random changes, mostly to
// endpoints, and checks after each build that the view equals a join of
// the same objects from scratch, that an endpoint change rebuilt only the
// services sharing a host with it, and that the others are the very same
// objects as before.
func TestEndpointChangesMatchAWholeJoin(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b := New()
	held := map[model.Key]Entry{}
	rev := int64(0)
	set := func(k model.Key, o model.Object) {
		rev++
		held[k] = Entry{o, rev}
		b.Set(k, held[k])
	}
	// Services a..e; b and c share a host, as the same Service in two
	// clusters does; d's policy names its host.
	hosts := map[string][]string{"a": {"a.ns"}, "b": {"shared.ns"}, "c": {"shared.ns", "c.ns"}, "d": {"d.ns"}, "e": {"e.ns"}}
	for name, hs := range hosts {
		set(model.Key{Kind: model.KindService, Namespace: "ns", Name: name}, service(name, hs...))
	}
	set(model.Key{Kind: model.KindTrafficPolicy, Namespace: "ns", Name: "d"}, &meshv1.TrafficPolicy{Host: "d.ns"})
	names := []string{"a", "b", "c", "d", "e", "ghost"}
	var before *generate.Mesh
	for step := range 300 {
		endpointsOnly := true
		switch r := rng.IntN(20); {
		case r == 0:
			// Something else: a service gains a host.
			name := names[rng.IntN(5)]
			set(model.Key{Kind: model.KindService, Namespace: "ns", Name: name}, service(name, append(hosts[name], fmt.Sprintf("extra%d.ns", step))...))
			endpointsOnly = false
		case r == 1:
			// Or a policy moves to another host.
			set(model.Key{Kind: model.KindTrafficPolicy, Namespace: "ns", Name: "d"}, &meshv1.TrafficPolicy{Host: hosts[names[rng.IntN(5)]][0]})
			endpointsOnly = false
		case r < 4:
			name, shard := names[rng.IntN(len(names))], []string{"k8s", "yaml"}[rng.IntN(2)]
			k := model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: model.EndpointsName(name, shard)}
			if _, ok := held[k]; ok {
				delete(held, k)
				b.Delete(k)
			}
		default:
			for range 1 + rng.IntN(3) {
				name, shard := names[rng.IntN(len(names))], []string{"k8s", "yaml"}[rng.IntN(2)]
				var addrs []string
				for range rng.IntN(4) {
					addrs = append(addrs, fmt.Sprintf("10.0.0.%d", rng.IntN(6)))
				}
				set(model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: model.EndpointsName(name, shard)}, endpoints(name, shard, addrs...))
			}
		}
		got := b.Build()
		var items []model.Stored
		for k, e := range held {
			items = append(items, model.Stored{Key: k, Object: e.Object, ModRevision: e.ModRev})
		}
		want := MeshOf(items)
		if len(got.Mesh.Services) != len(want.Services) {
			t.Fatalf("step %d: %d services, want %d", step, len(got.Mesh.Services), len(want.Services))
		}
		for i, w := range want.Services {
			if g := got.Mesh.Services[i]; summary(g) != summary(w) {
				t.Fatalf("step %d: service %s, want %s", step, summary(g), summary(w))
			}
			for _, h := range w.Spec.Hostnames {
				if summary(got.Mesh.Service(h)) != summary(want.Service(h)) {
					t.Fatalf("step %d: host %s is served by %s, want %s", step, h, summary(got.Mesh.Service(h)), summary(want.Service(h)))
				}
			}
		}
		if !endpointsOnly || before == nil {
			before = got.Mesh
			continue
		}
		if got.Changed == nil {
			t.Fatalf("step %d: an endpoint change joined everything again", step)
		}
		rebuilt := map[*generate.Service]bool{}
		for _, s := range got.Changed {
			rebuilt[s] = true
		}
		for i, s := range got.Mesh.Services {
			old := before.Services[i]
			switch {
			case rebuilt[s] && s == old:
				t.Fatalf("step %d: %s is listed as changed but is the old object", step, summary(s))
			case !rebuilt[s] && s != old:
				t.Fatalf("step %d: %s was rebuilt but is not listed as changed", step, summary(s))
			case !rebuilt[s] && s.Version != old.Version:
				t.Fatalf("step %d: %s changed version without being rebuilt", step, summary(s))
			}
		}
		before = got.Mesh
	}
}

// TestDNSEndpointsJoin: the endpoints of a DNS service are part of its
// clusters, so a change of them joins everything again (Changed nil);
// those of a static service only rebuild it.
func TestDNSEndpointsJoin(t *testing.T) {
	b := New()
	dns := service("ext", "ext.example.com")
	dns.Resolution = meshv1.Resolution_RESOLUTION_DNS
	static := service("app", "app.ns.svc.cluster.local")
	static.Resolution = meshv1.Resolution_RESOLUTION_STATIC
	b.Set(nsKey(model.KindService, "ext"), Entry{dns, 1})
	b.Set(nsKey(model.KindService, "app"), Entry{static, 2})
	b.Build()
	b.Set(nsKey(model.KindEndpoints, "app/s"), Entry{endpoints("app", "s", "10.0.0.1"), 3})
	if got := b.Build(); got.Changed == nil || len(got.Changed) != 1 {
		t.Errorf("a static service's endpoints: Changed %v, want that service only", got.Changed)
	}
	b.Set(nsKey(model.KindEndpoints, "ext/s"), Entry{endpoints("ext", "s", "api.example.com"), 4})
	got := b.Build()
	if got.Changed != nil {
		t.Errorf("a DNS service's endpoints: Changed %v, want a whole join", got.Changed)
	}
	for _, s := range got.Mesh.Services {
		if s.Name == "ext" && s.ConfigVersion != s.Version {
			t.Errorf("a DNS service's config version %s leaves out its endpoints (%s)", s.ConfigVersion, s.Version)
		}
	}
}

// TestPlaintextPeers: a namespace whose PeerAuthentication, or the mesh's
// without one of its own, is DISABLE has services whose workloads take
// plaintext alone, part of their config version (their clusters change);
// a policy with a selector is not inferred; the namespace's own policy
// wins over the mesh's.
func TestPlaintextPeers(t *testing.T) {
	b := New()
	rev := int64(0)
	set := func(k model.Key, o model.Object) {
		rev++
		b.Set(k, Entry{o, rev})
	}
	for _, ns := range []string{"off", "on", "picky"} {
		set(model.Key{Kind: model.KindService, Namespace: ns, Name: "s"}, service("s", "s."+ns))
	}
	set(model.Key{Kind: model.KindPeerAuth, Namespace: "istio-system", Name: "default"}, &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_DISABLE})
	set(model.Key{Kind: model.KindPeerAuth, Namespace: "on", Name: "default"}, &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_STRICT})
	set(model.Key{Kind: model.KindPeerAuth, Namespace: "picky", Name: "one"}, &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_STRICT,
		Selector: map[string]string{"app": "x"}})
	m := b.Build().Mesh
	for host, want := range map[string]bool{"s.off": true, "s.on": false, "s.picky": true} {
		if s := m.Service(host); s == nil || s.PlaintextPeers != want {
			t.Errorf("%s: %v, want plaintext peers %v", host, summary(s), want)
		}
	}
	before := m.Service("s.off").ConfigVersion
	set(model.Key{Kind: model.KindPeerAuth, Namespace: "istio-system", Name: "default"}, &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_PERMISSIVE})
	m = b.Build().Mesh
	if s := m.Service("s.off"); s.PlaintextPeers || s.ConfigVersion == before {
		t.Errorf("after the mesh's policy turned PERMISSIVE: %v (config version %s before)", summary(s), before)
	}
}

// TestMeshSettings: the stored MeshConfig is the mesh's settings, the
// builder's overrides win over what they set, automatic mutual TLS is on
// unless either turns it off, the mesh's locality balancing is each
// policy's that has none, and a change of the settings changes their
// version.
func TestMeshSettings(t *testing.T) {
	b := New()
	b.Set(model.Key{Kind: model.KindService, Namespace: "shop", Name: "a"}, Entry{service("a", "a.shop"), 1})
	b.Set(model.Key{Kind: model.KindService, Namespace: "shop", Name: "b"}, Entry{service("b", "b.shop"), 2})
	b.Set(model.Key{Kind: model.KindTrafficPolicy, Namespace: "shop", Name: "b"}, Entry{&meshv1.TrafficPolicy{Host: "b.shop",
		LocalityLb: &meshv1.LocalityLb{Disabled: true}}, 3})
	m := b.Build().Mesh
	if m.NoAutoMTLS || m.RegistryOnly || m.Config.GetEnableAutoMtls() != true || m.Service("a.shop").Policy != nil {
		t.Fatalf("without settings: %+v", m.Settings)
	}
	meshLb := &meshv1.LocalityLb{Failover: []*meshv1.LocalityLb_Failover{{From: "eu", To: "us"}}}
	key := model.Key{Kind: model.KindMeshConfig, Namespace: "istio-system", Name: "istio"}
	b.Set(key, Entry{&meshv1.MeshConfig{EnableAutoMtls: new(false), ConnectTimeout: nil, LocalityLb: meshLb,
		OutboundTrafficPolicy: meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY}, 4})
	built := b.Build()
	m = built.Mesh
	if !m.NoAutoMTLS || !m.RegistryOnly || m.ConfigVersion != "4" || built.Settings == nil {
		t.Errorf("stored settings: %+v, registry only %v", m.Settings, m.RegistryOnly)
	}
	if lb := m.Service("a.shop").Policy.GetLocalityLb(); !proto.Equal(lb, meshLb) {
		t.Errorf("a service without a policy: locality %v, want the mesh's", lb)
	}
	if lb := m.Service("b.shop").Policy.GetLocalityLb(); !lb.GetDisabled() {
		t.Errorf("a policy's own locality setting: %v", lb)
	}
	b.Overrides = &meshv1.MeshConfig{EnableAutoMtls: new(true), OutboundTrafficPolicy: meshv1.OutboundPolicy_OUTBOUND_POLICY_ALLOW_ANY}
	b.Set(key, Entry{&meshv1.MeshConfig{EnableAutoMtls: new(false), OutboundTrafficPolicy: meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY}, 5})
	m = b.Build().Mesh
	if m.NoAutoMTLS || m.RegistryOnly || m.ConfigVersion != "5" || m.Service("a.shop").Policy != nil {
		t.Errorf("overridden: %+v, registry only %v", m.Settings, m.RegistryOnly)
	}
	b.NoAutoMTLS = true
	b.Delete(key)
	if m = b.Build().Mesh; !m.NoAutoMTLS || m.ConfigVersion != "0" {
		t.Errorf("forced off: %+v", m.Settings)
	}
}

// TestBuildEndpointsLeavesTheJoin: endpoint changes go out on the last
// view while another change waits for the next Build, which joins it all;
// a DNS service's endpoints, part of its clusters, wait for the join too.
func TestBuildEndpointsLeavesTheJoin(t *testing.T) {
	b := New()
	if _, ok := b.BuildEndpoints(); ok {
		t.Fatal("BuildEndpoints built a first view: only a join can")
	}
	b.Set(nsKey(model.KindService, "app"), Entry{service("app", "app.ns.svc.cluster.local"), 1})
	b.Build()
	b.Set(nsKey(model.KindService, "new"), Entry{service("new", "new.ns.svc.cluster.local"), 2})
	b.Set(nsKey(model.KindEndpoints, "app/s"), Entry{endpoints("app", "s", "10.0.0.1"), 3})
	b.Set(nsKey(model.KindEndpoints, "new/s"), Entry{endpoints("new", "s", "10.0.0.2"), 4})
	got, ok := b.BuildEndpoints()
	if !ok {
		t.Fatal("BuildEndpoints refused endpoint changes of a static service")
	}
	if len(got.Mesh.Services) != 1 || summary(got.Mesh.Services[0]) != "ns/app v=s1e3 c=s1 policy=false eps=[10.0.0.1]" {
		t.Errorf("the view ahead of the join: %v, want app alone with its new endpoint", got.Mesh.Services)
	}
	if len(got.Changed) != 1 || got.Changed[0].Name != "app" {
		t.Errorf("Changed %v, want app (new is not joined yet)", got.Changed)
	}
	if !b.Pending() {
		t.Error("the new service does not wait for the next Build")
	}
	joined := b.Build()
	if b.Pending() || joined.Changed != nil || len(joined.Mesh.Services) != 2 {
		t.Errorf("Build after BuildEndpoints: pending %v, Changed %v, %d services; want a join of both", b.Pending(), joined.Changed, len(joined.Mesh.Services))
	}
	for _, s := range joined.Mesh.Services {
		if s.Name == "new" && len(s.Endpoints) != 1 {
			t.Errorf("the joined new service has endpoints %v, want the one set before the join", s.Endpoints)
		}
	}

	dns := service("ext", "ext.example.com")
	dns.Resolution = meshv1.Resolution_RESOLUTION_DNS
	b.Set(nsKey(model.KindService, "ext"), Entry{dns, 5})
	b.Build()
	b.Set(nsKey(model.KindEndpoints, "ext/s"), Entry{endpoints("ext", "s", "api.example.com"), 6})
	if _, ok := b.BuildEndpoints(); ok {
		t.Error("BuildEndpoints took a DNS service's endpoints, which its clusters hold")
	}
	if got := b.Build(); got.Changed != nil {
		t.Errorf("the join after a refused BuildEndpoints: Changed %v, want a whole join", got.Changed)
	}
}

// TestRouteChangesMatchAWholeJoin: route rules changed alone (with
// endpoints, or not) are put in the last view's place, and noted with
// their versions before and after; the view's routes are a whole join's;
// any other change, or one alongside, joins everything again.
func TestRouteChangesMatchAWholeJoin(t *testing.T) {
	b := New()
	rule := func(host string) *meshv1.RouteRule { return &meshv1.RouteRule{Hosts: []string{host}} }
	routes := func(m *generate.Mesh) string {
		var out []string
		for _, r := range m.Routes {
			out = append(out, r.Name+"@"+r.Version+"→"+m.RouteFor(r.Rule.Hosts[0]).Name)
		}
		return fmt.Sprint(out)
	}
	names := func(rs []*generate.Route) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.Name+"@"+r.Version)
		}
		return fmt.Sprint(out)
	}
	b.Set(nsKey(model.KindService, "app"), Entry{service("app", "app.ns"), 1})
	b.Set(nsKey(model.KindRouteRule, "b"), Entry{rule("app.ns"), 2})
	b.Set(nsKey(model.KindRouteRule, "c"), Entry{rule("c.ns"), 3})
	first := b.Build()
	if first.Rerouted != nil || routes(first.Mesh) != "[b@2→b c@3→c]" {
		t.Fatalf("the first join: rerouted %v, routes %s", first.Rerouted, routes(first.Mesh))
	}

	b.Set(nsKey(model.KindRouteRule, "a"), Entry{rule("app.ns"), 4}) // takes app.ns from b
	b.Delete(nsKey(model.KindRouteRule, "c"))
	b.Set(nsKey(model.KindEndpoints, "app/s"), Entry{endpoints("app", "s", "10.0.0.1"), 5})
	if !b.Pending() {
		t.Error("route changes do not wait for the next Build")
	}
	got := b.Build()
	switch {
	case got.Rerouted == nil:
		t.Fatal("route changes alone were joined again")
	case routes(got.Rerouted.From) != routes(first.Mesh) || names(got.Rerouted.Before) != "[c@3]" || names(got.Rerouted.After) != "[a@4]":
		t.Errorf("rerouted from routes %s, before %s, after %s; want the first view's, [c@3] and [a@4]",
			routes(got.Rerouted.From), names(got.Rerouted.Before), names(got.Rerouted.After))
	case routes(got.Mesh) != "[a@4→a b@2→a]":
		t.Errorf("routes %s, want a and b, app.ns routed by a", routes(got.Mesh))
	case len(got.Changed) != 1 || summary(got.Changed[0]) != "ns/app v=s1e5 c=s1 policy=false eps=[10.0.0.1]":
		t.Errorf("Changed %v, want app with its endpoint", got.Changed)
	case got.Mesh.Services[0] != got.Changed[0]:
		t.Error("the view does not hold the service its endpoints changed")
	}
	b.Set(nsKey(model.KindEndpoints, "app/s"), Entry{endpoints("app", "s", "10.0.0.2"), 6})
	if got := b.Build(); got.Rerouted != nil || routes(got.Mesh) != "[a@4→a b@2→a]" {
		t.Errorf("an endpoint change after: rerouted %v, routes %s; want the same routes, nothing rerouted", got.Rerouted, routes(got.Mesh))
	}

	b.Set(nsKey(model.KindRouteRule, "a"), Entry{rule("app.ns"), 7})
	if _, ok := b.BuildEndpoints(); !ok || !b.Pending() {
		t.Error("a route change does not wait for Build after BuildEndpoints")
	}
	if got := b.Build(); got.Rerouted == nil || names(got.Rerouted.Before) != "[a@4]" || names(got.Rerouted.After) != "[a@7]" {
		t.Errorf("the route change after BuildEndpoints: %v", got.Rerouted)
	}

	b.Set(nsKey(model.KindRouteRule, "a"), Entry{rule("app.ns"), 8})
	b.Set(nsKey(model.KindService, "other"), Entry{service("other", "other.ns"), 9})
	got = b.Build()
	if got.Rerouted != nil || got.Changed != nil || routes(got.Mesh) != "[a@8→a b@2→a]" {
		t.Errorf("a route change beside a service change: rerouted %v, Changed %v, routes %s; want a whole join", got.Rerouted, got.Changed, routes(got.Mesh))
	}

	// A rule that routes TCP changes listeners, not virtual hosts alone.
	tcp := rule("app.ns")
	tcp.Tcp = []*meshv1.L4Route{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "app.ns"}}}}}
	b.Set(nsKey(model.KindRouteRule, "a"), Entry{tcp, 10})
	if got := b.Build(); got.Rerouted != nil || got.Changed != nil || len(got.Mesh.RouteFor("app.ns").Rule.Tcp) != 1 {
		t.Errorf("a rule with TCP routes: rerouted %v, Changed %v; want a whole join with the rule", got.Rerouted, got.Changed)
	}
}

// TestBuildRoutesLeavesTheJoin: route rules changed beside a service are
// put in the last view's place ahead of the join, which Build then makes
// with them; with nothing else waiting, BuildRoutes leaves them to Build.
func TestBuildRoutesLeavesTheJoin(t *testing.T) {
	b := New()
	if _, ok := b.BuildRoutes(); ok {
		t.Fatal("BuildRoutes built a first view: only a join can")
	}
	b.Set(nsKey(model.KindService, "app"), Entry{service("app", "app.ns"), 1})
	b.Build()
	b.Set(nsKey(model.KindRouteRule, "a"), Entry{&meshv1.RouteRule{Hosts: []string{"app.ns"}}, 2})
	if _, ok := b.BuildRoutes(); ok {
		t.Error("BuildRoutes took route changes that nothing else waits behind")
	}
	b.Set(nsKey(model.KindService, "new"), Entry{service("new", "new.ns"), 3})
	got, ok := b.BuildRoutes()
	switch {
	case !ok:
		t.Fatal("BuildRoutes refused a route change beside a service change")
	case got.Rerouted == nil || len(got.Rerouted.After) != 1 || got.Mesh.RouteFor("app.ns") == nil:
		t.Errorf("the view ahead of the join: rerouted %v, app.ns routed by %v", got.Rerouted, got.Mesh.RouteFor("app.ns"))
	case len(got.Mesh.Services) != 1 || len(got.Changed) != 0:
		t.Errorf("the view ahead of the join holds %d services and %d changed, want app alone, none changed", len(got.Mesh.Services), len(got.Changed))
	}
	if !b.Pending() {
		t.Error("the new service does not wait for the next Build")
	}
	joined := b.Build()
	if joined.Changed != nil || joined.Rerouted != nil || len(joined.Mesh.Services) != 2 || joined.Mesh.RouteFor("app.ns") == nil {
		t.Errorf("Build after BuildRoutes: Changed %v, rerouted %v, %d services, app.ns routed by %v; want a join of both with the rule",
			joined.Changed, joined.Rerouted, len(joined.Mesh.Services), joined.Mesh.RouteFor("app.ns"))
	}

	// A rule that changes more than virtual hosts waits for the join.
	tcp := &meshv1.RouteRule{Hosts: []string{"app.ns"}, Tcp: []*meshv1.L4Route{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "app.ns"}}}}}}
	b.Set(nsKey(model.KindRouteRule, "a"), Entry{tcp, 4})
	b.Set(nsKey(model.KindService, "third"), Entry{service("third", "third.ns"), 5})
	if _, ok := b.BuildRoutes(); ok {
		t.Error("BuildRoutes took a rule with TCP routes ahead of the join")
	}
	if joined := b.Build(); joined.Changed != nil || len(joined.Mesh.Services) != 3 || joined.Mesh.RouteFor("app.ns") == nil || len(joined.Mesh.RouteFor("app.ns").Rule.Tcp) != 1 {
		t.Errorf("the join after a refused BuildRoutes: Changed %v, %d services; want a join of the three with the TCP rule", joined.Changed, len(joined.Mesh.Services))
	}
}
