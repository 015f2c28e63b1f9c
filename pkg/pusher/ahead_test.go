package pusher

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// orderedSink records, in order, what is handed over: "update" or
// "patch", the type's short name and the class.
type orderedSink struct {
	recordingSink
	logMu sync.Mutex
	log   []string
}

func (s *orderedSink) note(op string, class cache.Class, typeURL string) {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	s.log = append(s.log, op+" "+typeURL[strings.LastIndex(typeURL, ".")+1:]+" "+string(class))
}

func (s *orderedSink) Update(class cache.Class, typeURL string, res map[string]types.Resource) (int, int, int, error) {
	s.note("update", class, typeURL)
	return s.recordingSink.Update(class, typeURL, res)
}

func (s *orderedSink) Patch(class cache.Class, typeURL string, set map[string]types.Resource, remove []string) (int, int, int, error) {
	s.note("patch", class, typeURL)
	return s.recordingSink.Patch(class, typeURL, set, remove)
}

// take returns what was handed over since the last take.
func (s *orderedSink) take() []string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	out := s.log
	s.log = nil
	return out
}

// endpointsOf returns the addresses of a's port 80 load assignment.
func (s *orderedSink) endpointsOf(service string) []string {
	la, _ := s.resources("", resource.EndpointType)["outbound|80||"+service+".ns.svc.cluster.local"].(*endpoint.ClusterLoadAssignment)
	var out []string
	for _, l := range la.GetEndpoints() {
		for _, e := range l.GetLbEndpoints() {
			out = append(out, e.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
		}
	}
	return out
}

// aheadPusher returns a pusher that generated service a, and a function
// applying a stored object as a change event.
func aheadPusher(t *testing.T) (*Pusher, *orderedSink, func(model.Stored)) {
	t.Helper()
	sink := &orderedSink{}
	p, err := New(Config{Loader: &scriptedLoader{}, Feed: &scriptedFeed{}, Tables: sink})
	if err != nil {
		t.Fatal(err)
	}
	p.state.reset([]model.Stored{stored("a", 80)}, 1)
	p.generate(fullChange(time.Now()))
	sink.take()
	apply := func(s model.Stored) {
		t.Helper()
		if !applyEvent(t, p.state, s.Key, event(t, s)) {
			t.Fatalf("%s was not applied", s.Key)
		}
	}
	return p, sink, apply
}

func storedEndpoints(service string, rev int64, addrs ...string) model.Stored {
	eps := &meshv1.Endpoints{Service: service, Shard: "test"}
	for _, a := range addrs {
		eps.Endpoints = append(eps.Endpoints, &meshv1.Endpoint{Address: a})
	}
	return model.Stored{Key: model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: model.EndpointsName(service, "test")}, Object: eps, ModRevision: rev}
}

func at(s model.Stored, rev int64) model.Stored {
	s.ModRevision = rev
	return s
}

// TestEndpointsGoAheadOfASlowGeneration: once full generations take long,
// a batch's endpoint changes are handed over before its join, in an epoch
// of their own measured from when they were observed; a quick generation
// takes them with the rest.
func TestEndpointsGoAheadOfASlowGeneration(t *testing.T) {
	for _, slow := range []bool{false, true} {
		p, sink, apply := aheadPusher(t)
		apply(at(stored("b", 80), 2))
		apply(storedEndpoints("a", 3, "10.0.0.1"))
		first, second := time.Now().Add(-2*time.Second), time.Now().Add(-time.Second)
		if slow {
			p.fullTook = time.Second
		}
		before := len(p.conv.recent)
		p.generate(change{n: 2, since: first, full: true, observed: second, endpoints: 1, endpointsObserved: first})
		log := sink.take()
		if slow != (len(log) > 0 && log[0] == "patch ClusterLoadAssignment ") {
			t.Errorf("slow %v: handed over %v; want the endpoints patched first only when slow", slow, log)
		}
		if got := sink.endpointsOf("a"); len(got) != 1 || got[0] != "10.0.0.1" {
			t.Errorf("slow %v: a's endpoints %v, want [10.0.0.1]", slow, got)
		}
		if sink.resources("envoy", resource.ClusterType)["outbound|80||b.ns.svc.cluster.local"] == nil {
			t.Errorf("slow %v: b's cluster was not generated", slow)
		}
		var observed []time.Time
		for _, r := range p.conv.recent[before:] {
			observed = append(observed, r.observed)
		}
		want := []time.Time{first}
		if slow {
			want = []time.Time{first, second}
		}
		if len(observed) != len(want) || !observed[0].Equal(want[0]) || !observed[len(observed)-1].Equal(want[len(want)-1]) {
			t.Errorf("slow %v: epochs observed at %v, want %v", slow, observed, want)
		}
		if got := p.GeneratedRevision(); got != 3 {
			t.Errorf("slow %v: generated revision %d, want 3", slow, got)
		}
	}
}

// TestEndpointsMeanwhile: between the classes of a long generation, the
// endpoint changes waiting in the debouncer are handed over alone; the
// other changes stay pending, and the revision generated does not claim
// them; endpoints that need a join (a DNS service's) stay pending too.
func TestEndpointsMeanwhile(t *testing.T) {
	p, sink, apply := aheadPusher(t)
	apply(at(stored("c", 80), 2))
	apply(storedEndpoints("a", 3, "10.0.0.2"))
	now := time.Now()
	p.debouncer.Add(change{n: 1, since: now, full: true, observed: now}, now)
	p.debouncer.Add(change{n: 1, since: now, endpoints: 1, endpointsObserved: now}, now)
	p.endpointsMeanwhile()
	if log := sink.take(); len(log) != 1 || log[0] != "patch ClusterLoadAssignment " {
		t.Errorf("handed over %v, want a's load assignment alone", log)
	}
	if got := sink.endpointsOf("a"); len(got) != 1 || got[0] != "10.0.0.2" {
		t.Errorf("a's endpoints %v, want [10.0.0.2]", got)
	}
	if got := p.GeneratedRevision(); got != 1 {
		t.Errorf("generated revision %d, want 1: service c waits", got)
	}
	rest, ok := p.debouncer.Take(func(c change) (change, change, bool, bool) { return c, change{}, true, false })
	if !ok || !rest.full || rest.endpoints != 0 || rest.n != 1 {
		t.Errorf("pending after: %+v (%v), want the full change alone", rest, ok)
	}

	dns := stored("d", 80)
	dns.Object.(*meshv1.Service).Resolution = meshv1.Resolution_RESOLUTION_DNS
	apply(at(dns, 4))
	p.generate(fullChange(time.Now()))
	sink.take()
	apply(storedEndpoints("d", 5, "d.example.com"))
	p.debouncer.Add(change{n: 1, since: now, endpoints: 1, endpointsObserved: now}, now)
	p.endpointsMeanwhile()
	if log := sink.take(); len(log) != 0 {
		t.Errorf("a DNS service's endpoints handed over %v ahead of the join they need", log)
	}
	if rest, ok := p.debouncer.Take(func(c change) (change, change, bool, bool) { return c, change{}, true, false }); !ok || rest.endpoints != 1 {
		t.Errorf("pending after: %+v (%v), want the DNS endpoint change", rest, ok)
	}
}

// TestArrivedMeanwhile: what the follow goroutine read while a long
// generation runs waits in the owner's queue; between the classes the
// owner takes it, and its endpoint changes go out. An event of a pass the
// owner ended is not applied.
func TestArrivedMeanwhile(t *testing.T) {
	p, sink, _ := aheadPusher(t)
	var ended error
	p.pass, p.passEnd = 1, func(err error) { ended = err }
	eps := storedEndpoints("a", 3, "10.0.0.2")
	old := storedEndpoints("a", 4, "10.0.0.9")
	obj := func(s model.Stored) (model.Key, *meshv1.ChangeEvent, model.Object) {
		return s.Key, event(t, s), s.Object
	}
	now := time.Now()
	k, ev, o := obj(old)
	p.arrivals <- arrival{pass: 0, at: now, seq: 6, key: k, event: ev, obj: o} // of the pass before
	k, ev, o = obj(eps)
	p.arrivals <- arrival{pass: 1, at: now, seq: 7, key: k, event: ev, obj: o}
	p.endpointsMeanwhile()
	if got := sink.endpointsOf("a"); len(got) != 1 || got[0] != "10.0.0.2" {
		t.Errorf("a's endpoints %v, want [10.0.0.2], the current pass's", got)
	}
	if len(p.arrivals) != 0 || p.consumed.Load() != 7 || p.applied.Load() != 3 {
		t.Errorf("%d left queued, consumed %d, applied %d; want 0, 7 and 3", len(p.arrivals), p.consumed.Load(), p.applied.Load())
	}
	if ended != nil {
		t.Errorf("the pass ended: %v", ended)
	}
}

// TestRoutesGoAheadOfASlowGeneration: once full generations take long, a
// batch's route changes that change virtual hosts alone are rerouted
// before the join its other changes wait for, which follows; a quick
// generation takes them with the rest.
func TestRoutesGoAheadOfASlowGeneration(t *testing.T) {
	const host = "a.ns.svc.cluster.local"
	for _, slow := range []bool{false, true} {
		p, sink, apply := aheadPusher(t)
		apply(model.Stored{Key: model.Key{Kind: model.KindRouteRule, Namespace: "ns", Name: "a"}, Object: routeRule(host, 7*time.Second), ModRevision: 2})
		apply(at(stored("b", 80), 3))
		if slow {
			p.fullTook = time.Second
		}
		p.generate(change{n: 2, since: time.Now(), full: true, observed: time.Now()})
		log := sink.take()
		ahead := len(log) > 1 && log[0] == "patch RouteConfiguration envoy" && log[1] == "patch RouteConfiguration proxyless"
		if slow != ahead {
			t.Errorf("slow %v: handed over %v; want a's route configurations patched first only when slow", slow, log)
		}
		rc, _ := sink.resources("envoy", resource.RouteType)["80"].(*route.RouteConfiguration)
		i := slices.IndexFunc(rc.GetVirtualHosts(), func(vh *route.VirtualHost) bool { return vh.Name == host+":80" })
		if i < 0 || rc.VirtualHosts[i].Routes[0].GetRoute().GetTimeout().AsDuration() != 7*time.Second {
			t.Errorf("slow %v: the Envoys' route configuration 80 does not route %s as the rule says: %v", slow, host, rc)
		}
		if sink.resources("envoy", resource.ClusterType)["outbound|80||b.ns.svc.cluster.local"] == nil {
			t.Errorf("slow %v: b's cluster was not generated", slow)
		}
		if got := p.GeneratedRevision(); got != 3 {
			t.Errorf("slow %v: generated revision %d, want 3", slow, got)
		}
	}
}
