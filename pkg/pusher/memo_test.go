package pusher

import (
	"slices"
	"testing"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestEndpointChangesThatChangeClustersRegenerate: an endpoint change
// takes the fast path (load assignments alone) unless it changes what
// clusters read of endpoints, which the service's configuration version
// names: a new service account among its workloads (its clusters accept
// the workloads' identities), a workload without a sidecar behind a
// headless service (its clusters' TLS).
func TestEndpointChangesThatChangeClustersRegenerate(t *testing.T) {
	svc := func(headless bool, config string) *generate.Service {
		return &generate.Service{Namespace: "data", Name: "db", ConfigVersion: config, Spec: &meshv1.Service{
			Hostnames: []string{"db.data.svc.cluster.local"}, Headless: headless, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports: []*meshv1.Port{{Name: "tcp", Number: 5432, Protocol: meshv1.Protocol_PROTOCOL_TCP}}}}
	}
	for _, headless := range []bool{false, true} {
		var s serverPorts
		s.record(generate.NewMesh([]*generate.Service{svc(headless, "s1adb")}, nil))
		if s.changed([]*generate.Service{svc(headless, "s1adb")}) {
			t.Errorf("headless %v: endpoints that change no cluster regenerate the classes", headless)
		}
		if !s.changed([]*generate.Service{svc(headless, "s1adb,db-canary")}) {
			t.Errorf("headless %v: a new service account among the workloads does not regenerate the classes", headless)
		}
	}
	var s serverPorts
	s.record(generate.NewMesh([]*generate.Service{svc(true, "s1adbm")}, nil))
	if !s.changed([]*generate.Service{svc(true, "s1adb")}) {
		t.Error("a workload without a sidecar behind a headless service does not regenerate the classes")
	}
}

// TestClassesShareWhatTheySeeAlike: classes that see the same services
// alike (the Envoys of two namespaces without services: a namespace's own
// services have short names in its routes) are handed one route
// configuration object for a port, which the cache checks and encodes
// once; and a proxyless client's listener is one object from one
// generation to the next (the tables skip it).
func TestClassesShareWhatTheySeeAlike(t *testing.T) {
	items := []model.Stored{stored("w-0", 80), stored("w-1", 80), serviceIn("ns-0", meshv1.Protocol_PROTOCOL_HTTP)}
	classes := slices.Clone(Classes)
	for _, ns := range []string{"ns-0", "ns-1", "ns-2"} {
		classes = append(classes, cache.Class("envoy/"+ns+"/"))
	}
	p, c := generated(t, items, classes)
	const api = "w-0.ns.svc.cluster.local:80"
	first := c.Resources("proxyless", resource.ListenerType)[api]
	p.putAndGenerate(t, serviceIn("ns-0", meshv1.Protocol_PROTOCOL_GRPC), 2)
	ns0, ns1, ns2 := c.Resources("envoy/ns-0/", resource.RouteType)["80"], c.Resources("envoy/ns-1/", resource.RouteType)["80"], c.Resources("envoy/ns-2/", resource.RouteType)["80"]
	if ns1 == nil || ns1 != ns2 {
		t.Error("the classes that see the same services alike were handed port 80's routes as different objects")
	}
	if ns0 == ns1 {
		t.Error("the class whose namespace has a service was handed the routes of the others")
	}
	if l := c.Resources("proxyless", resource.ListenerType)[api]; first == nil || l != first {
		t.Errorf("a proxyless listener is a new object after a generation: %p, then %p", first, l)
	}
}

// serviceIn is a service "a" of a namespace, with one port 80 of a
// protocol.
func serviceIn(ns string, protocol meshv1.Protocol) model.Stored {
	s := stored("a", 80)
	s.Key.Namespace = ns
	svc := s.Object.(*meshv1.Service)
	svc.Hostnames = []string{"a." + ns + ".svc.cluster.local"}
	svc.Ports[0].Protocol = protocol
	return s
}

// generated returns a pusher that generated a mesh for some classes into
// a real cache, and the cache.
func generated(t testing.TB, items []model.Stored, classes []cache.Class) (*Pusher, *cache.Cache) {
	t.Helper()
	c, err := cache.New(cache.Config{Classes: classes, Types: ClassTypes, SharedTypes: SharedTypes})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Loader: &scriptedLoader{}, Feed: &scriptedFeed{}, Tables: c})
	if err != nil {
		t.Fatal(err)
	}
	p.state.reset(items, 1)
	p.generate(change{n: 1, since: time.Now(), full: true})
	return p, c
}

// putAndGenerate applies a put of s at rev, and generates.
func (p *Pusher) putAndGenerate(t testing.TB, s model.Stored, rev int64) {
	t.Helper()
	p.put(t, s, rev)
	p.generate(change{n: 1, since: time.Now(), full: true})
}

// put applies a put of s at rev.
func (p *Pusher) put(t testing.TB, s model.Stored, rev int64) {
	t.Helper()
	value, err := model.Encode(s.Object)
	if err != nil {
		t.Fatal(err)
	}
	if !applyEvent(t, p.state, s.Key, &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Revision: rev, Key: s.Key.String(), Value: value}) {
		t.Fatal("the change was not applied")
	}
}

// TestVirtualHostsTakenApart: a route configuration taken apart keeps its
// fields without its virtual hosts and names ADS their source; each
// virtual host is named <route configuration>/<its name> and shares what
// it holds; the same objects come back while they are asked for, and are
// forgotten two sweeps after they were last.
func TestVirtualHostsTakenApart(t *testing.T) {
	vh := &route.VirtualHost{Name: "db.data.svc.cluster.local:80", Domains: []string{"db.data.svc.cluster.local"},
		Routes: []*route.Route{{Name: "default"}}}
	rc := &route.RouteConfiguration{Name: "80", VirtualHosts: []*route.VirtualHost{vh}, ValidateClusters: wrapperspb.Bool(false)}
	var v virtualHosts
	apart := v.routes(rc)
	if len(apart.VirtualHosts) != 0 || apart.GetVhds().GetConfigSource().GetAds() == nil || apart.Name != "80" || apart.ValidateClusters.GetValue() {
		t.Fatalf("taken apart: %v", apart)
	}
	if len(rc.VirtualHosts) != 1 || rc.Vhds != nil {
		t.Fatal("the configuration handed over was changed")
	}
	host := v.host(rc.Name, vh)
	if host.Name != "80/db.data.svc.cluster.local:80" || vh.Name != "db.data.svc.cluster.local:80" || &host.Routes[0] != &vh.Routes[0] {
		t.Fatalf("virtual host %q (from %q), routes shared: %v", host.Name, vh.Name, &host.Routes[0] == &vh.Routes[0])
	}
	v.sweep()
	if v.routes(rc) != apart || v.host(rc.Name, vh) != host {
		t.Fatal("asked for again after a sweep: made anew")
	}
	v.sweep()
	v.sweep()
	if v.routes(rc) == apart || v.host(rc.Name, vh) == host {
		t.Fatal("not asked for over a generation: still kept")
	}
}
