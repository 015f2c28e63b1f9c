package pusher

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/protobuf/types/known/durationpb"
)

// rerouteTwins are two pushers fed the same mesh and changes into real
// caches: one reroutes classes where a route change allows it, the other
// generates every class whole at every change.
type rerouteTwins struct {
	rerouting, whole *Pusher
	caches           [2]*cache.Cache
	classes          []cache.Class
	rev              int64
}

func newRerouteTwins(t *testing.T, items []model.Stored, classes []cache.Class) *rerouteTwins {
	t.Helper()
	tw := &rerouteTwins{classes: classes, rev: 1}
	for i, p := range []**Pusher{&tw.rerouting, &tw.whole} {
		c, err := cache.New(cache.Config{Classes: classes, Types: slices.Concat(ClassTypes, VHDSTypes), SharedTypes: SharedTypes})
		if err != nil {
			t.Fatal(err)
		}
		if *p, err = New(Config{Loader: &scriptedLoader{}, Feed: &scriptedFeed{}, Tables: c, VirtualHosts: true}); err != nil {
			t.Fatal(err)
		}
		(*p).state.reset(items, 1)
		(*p).generate(fullChange(time.Now()))
		tw.caches[i] = c
	}
	return tw
}

// apply applies the same event to both, and generates: the one that may
// reroute as for a change from the store, the other whole.
func (tw *rerouteTwins) apply(t *testing.T, k model.Key, obj model.Object) {
	t.Helper()
	tw.rev++
	ev := &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_DELETE, Revision: tw.rev, Key: k.String()}
	if obj != nil {
		value, err := model.Encode(obj)
		if err != nil {
			t.Fatal(err)
		}
		ev.Type, ev.Value = meshv1.ChangeEvent_TYPE_PUT, value
	}
	for _, p := range []*Pusher{tw.rerouting, tw.whole} {
		if !applyEvent(t, p.state, k, ev) {
			t.Fatal("the change was not applied")
		}
	}
	tw.rerouting.generate(change{n: 1, since: time.Now(), full: true})
	tw.whole.generate(fullChange(time.Now()))
}

// same fails the test where a class's table of any type holds other
// bytes in one cache than in the other.
func (tw *rerouteTwins) same(t *testing.T, step string) {
	t.Helper()
	for _, class := range tw.classes {
		for _, typ := range slices.Concat(ClassTypes, VHDSTypes) {
			a, b := tw.caches[0].Encoded(class, typ), tw.caches[1].Encoded(class, typ)
			if len(a) != len(b) {
				t.Errorf("%s: class %s holds %d %s rerouted, %d generated whole", step, class, len(a), typ, len(b))
				continue
			}
			for name, x := range a {
				if y, ok := b[name]; !ok || !bytes.Equal(x.Value, y.Value) {
					t.Errorf("%s: class %s's %s %q differs rerouted from generated whole", step, class, typ, name)
				}
			}
		}
	}
}

func (tw *rerouteTwins) rerouted() float64 {
	return testutil.ToFloat64(tw.rerouting.m.classes.WithLabelValues("rerouted"))
}

func ruleKey(ns, name string) model.Key {
	return model.Key{Kind: model.KindRouteRule, Namespace: ns, Name: name}
}

// TestRerouteMatchesAWholeGeneration: a change of route rules that changes
// virtual hosts alone brings each class's route configurations and
// virtual hosts where generating the class whole brings them, byte for
// byte, for Envoys of the whole mesh, of one namespace and of a Sidecar
// that keeps them to it, taking virtual hosts apart, and proxyless
// clients; and it generates no class whole. A
// change that reaches further (TCP routes, a match on its source, before
// or after) generates every class whole, as before; one whose hosts
// Envoys route on port 80 by themselves (no service in their view has
// them on port 80), the Envoys' classes.
func TestRerouteMatchesAWholeGeneration(t *testing.T) {
	svc := func(ns, name string, ports ...*meshv1.Port) model.Stored {
		return model.Stored{Key: model.Key{Kind: model.KindService, Namespace: ns, Name: name}, ModRevision: 1, Object: &meshv1.Service{
			Hostnames: []string{name + "." + ns + ".svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: ports}}
	}
	http := func(n uint32) *meshv1.Port {
		return &meshv1.Port{Name: "http", Number: n, Protocol: meshv1.Protocol_PROTOCOL_HTTP}
	}
	tcp := &meshv1.Port{Name: "tcp", Number: 5432, Protocol: meshv1.Protocol_PROTOCOL_TCP}
	const (
		a  = "a.ns-0.svc.cluster.local"
		b  = "b.ns-0.svc.cluster.local"
		c  = "c.ns-1.svc.cluster.local"
		db = "db.ns-1.svc.cluster.local"
	)
	// b and c share a virtual IP: c's virtual host loses that domain to b's.
	shared := func(s model.Stored) model.Stored {
		s.Object.(*meshv1.Service).Addresses = []string{"10.96.0.7"}
		return s
	}
	items := []model.Stored{
		svc("ns-0", "a", http(80), http(8080)), shared(svc("ns-0", "b", http(80))), shared(svc("ns-1", "c", http(80))), svc("ns-1", "db", tcp, http(9000)),
		{Key: ruleKey("ns-0", "b"), ModRevision: 1, Object: routeRule(b, time.Second)},
		// ns-1's Envoys see their own namespace alone.
		{Key: model.Key{Kind: model.KindScope, Namespace: "ns-1", Name: "default"}, ModRevision: 1,
			Object: &meshv1.Scope{Egress: []*meshv1.EgressListener{{Hosts: []string{"./*"}}}}},
	}
	classes := []cache.Class{"envoy", "envoy/ns-1/", "envoy/ns-1/default", "proxyless"}
	tw := newRerouteTwins(t, items, classes)
	for _, class := range classes {
		// Each class has route configurations to compare (and the
		// Envoys', virtual hosts apart).
		if len(tw.caches[0].Encoded(class, resource.RouteType)) == 0 ||
			class != "proxyless" && len(tw.caches[0].Encoded(class, resource.VirtualHostType)) == 0 {
			t.Fatalf("class %s holds no route configurations or virtual hosts to compare", class)
		}
	}
	tw.same(t, "load")

	split := routeRule(a, 3*time.Second)
	split.Http = append([]*meshv1.HTTPRoute{{
		Match: []*meshv1.HTTPMatch{{Headers: map[string]*meshv1.StringMatch{"x-canary": {Kind: &meshv1.StringMatch_Exact{Exact: "1"}}}}},
		Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: b}}},
	}}, split.Http...)
	toC := func(host string, timeout time.Duration) *meshv1.RouteRule {
		return &meshv1.RouteRule{Hosts: []string{host}, Http: []*meshv1.HTTPRoute{{Timeout: durationpb.New(timeout),
			Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: c}}}}}}
	}
	steps := []struct {
		name string
		key  model.Key
		rule *meshv1.RouteRule // nil: deleted
		// rerouted is how many classes reroute: 4 (every one); 3 (all but
		// the Sidecar's, whose Envoys route on port 80 by itself a host
		// they do not see); 1 (the proxyless clients'); 0.
		rerouted int
	}{
		{"a rule added", ruleKey("ns-0", "a"), routeRule(a, time.Second), 3},
		{"its timeout changed, a match to another host added", ruleKey("ns-0", "a"), split, 4},
		{"a rule of two hosts, one no service's, the other's virtual host short of a domain", ruleKey("ns-1", "c"), &meshv1.RouteRule{Hosts: []string{c, "ext.example.com"},
			Http: []*meshv1.HTTPRoute{{Timeout: durationpb.New(time.Second), Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: c}}}}}}, 4},
		{"a rule that takes a host from another (first by name)", ruleKey("ns-0", "0-first"), routeRule(b, 5*time.Second), 3},
		{"the rule that took it removed", ruleKey("ns-0", "0-first"), nil, 3},
		{"a rule of a host no service has", ruleKey("ns-1", "ext"), routeRule("ext.example.com", time.Second), 1},
		{"a rule of another such host, routed to c", ruleKey("ns-1", "ext2"), toC("ext2.example.com", time.Second), 1},
		{"its timeout changed (its own virtual host on port 80 changes in place)", ruleKey("ns-1", "ext2"), toC("ext2.example.com", 2*time.Second), 4},
		{"a rule of a host without port 80 (which Envoys route there by itself)", ruleKey("ns-1", "db"), &meshv1.RouteRule{Hosts: []string{db},
			Http: []*meshv1.HTTPRoute{{Timeout: durationpb.New(time.Second), Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: db}}}}}}, 1},
		{"a rule with TCP routes", ruleKey("ns-1", "db"), &meshv1.RouteRule{Hosts: []string{db},
			Tcp: []*meshv1.L4Route{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: db}}}}}}, 0},
		{"a rule matching on its source", ruleKey("ns-0", "a"), &meshv1.RouteRule{Hosts: []string{a}, Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{SourceNamespace: "ns-1"}},
			Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: b}}}}}}, 0},
		{"it removed", ruleKey("ns-0", "a"), nil, 0},
		{"a rule removed", ruleKey("ns-0", "b"), nil, 3},
	}
	for _, st := range steps {
		before := tw.rerouted()
		generated := testutil.ToFloat64(tw.rerouting.m.classes.WithLabelValues("generated"))
		var obj model.Object
		if st.rule != nil {
			obj = st.rule
		}
		tw.apply(t, st.key, obj)
		tw.same(t, st.name)
		rerouted := tw.rerouted() - before
		whole := testutil.ToFloat64(tw.rerouting.m.classes.WithLabelValues("generated")) - generated
		if rerouted != float64(st.rerouted) || whole != float64(len(classes)-st.rerouted) {
			t.Errorf("%s: %v classes rerouted and %v generated whole, want %d rerouted", st.name, rerouted, whole, st.rerouted)
		}
	}
}
