package pusher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	shtest "github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// scriptedLoader serves loads from a list; an error entry fails that load.
type scriptedLoader struct {
	mu    sync.Mutex
	loads []func() ([]model.Stored, int64, error)
	calls int
}

func (l *scriptedLoader) List(context.Context) ([]model.Stored, int64, []error, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.loads[min(l.calls, len(l.loads)-1)]
	l.calls++
	items, rev, err := f()
	return items, rev, nil, err
}

func (l *scriptedLoader) Revision(context.Context) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, rev, err := l.loads[max(0, min(l.calls, len(l.loads))-1)]()
	return rev, err
}

// scriptedFeed delivers one batch of events per Consume call, then ends the
// call with the batch's error (or blocks when it has none).
type scriptedFeed struct {
	mu      sync.Mutex
	batches []feedBatch
	calls   int
}

type feedBatch struct {
	delay  time.Duration // before the events
	gap    time.Duration // between them
	events []*meshv1.ChangeEvent
	end    error
}

func (f *scriptedFeed) LastSeq(context.Context) (uint64, error) { return 0, nil }

func (f *scriptedFeed) Consume(ctx context.Context, _ uint64, fn func(uint64, *meshv1.ChangeEvent) error) error {
	f.mu.Lock()
	var b feedBatch
	if f.calls < len(f.batches) {
		b = f.batches[f.calls]
	}
	f.calls++
	f.mu.Unlock()
	time.Sleep(b.delay)
	for i, ev := range b.events {
		if i > 0 {
			time.Sleep(b.gap)
		}
		if err := fn(uint64(i+1), ev); err != nil {
			return err
		}
	}
	if b.end != nil {
		return b.end
	}
	<-ctx.Done()
	return ctx.Err()
}

// recordingSink keeps the last resources per class and type.
type recordingSink struct {
	mu    sync.Mutex
	got   map[string]map[string]types.Resource
	epoch atomic.Int64
}

func (s *recordingSink) BeginEpoch() int64 { return s.epoch.Add(1) }

func (s *recordingSink) Update(class cache.Class, typeURL string, res map[string]types.Resource) (int, int, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.got == nil {
		s.got = map[string]map[string]types.Resource{}
	}
	s.got[string(class)+"|"+typeURL] = res
	return len(res), 0, 0, nil
}

func (s *recordingSink) Patch(class cache.Class, typeURL string, set map[string]types.Resource, remove []string) (int, int, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	res := maps.Clone(s.got[string(class)+"|"+typeURL])
	for _, name := range remove {
		delete(res, name)
	}
	maps.Copy(res, set)
	s.got[string(class)+"|"+typeURL] = res
	return len(set), len(remove), 0, nil
}

func (s *recordingSink) Classes() []cache.Class { return Classes }
func (s *recordingSink) Backlog() int64         { return 0 }
func (s *recordingSink) Holding() int64         { return 0 }

func (s *recordingSink) resources(class cache.Class, typeURL string) map[string]types.Resource {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[string(class)+"|"+typeURL]
}

func (s *recordingSink) clusters() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for n := range s.got["envoy|"+resource.ClusterType] {
		if strings.HasPrefix(n, "outbound|") { // not the catch-all clusters
			names = append(names, n)
		}
	}
	return names
}

func stored(name string, port uint32) model.Stored {
	return model.Stored{
		Key: model.Key{Kind: model.KindService, Namespace: "ns", Name: name},
		Object: &meshv1.Service{
			Hostnames:  []string{name + ".ns.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "http", Number: port, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
		},
		ModRevision: 1,
	}
}

func TestPusherReloadsOnGapAndResync(t *testing.T) {
	tests := map[string]feedBatch{
		"a gap in the stream":    {end: model.ErrGap},
		"a resync past the load": {events: []*meshv1.ChangeEvent{{Type: meshv1.ChangeEvent_TYPE_RESYNC, Revision: 20}}},
		// etcd restored: the relay's new history starts below the load.
		"a restored resync below the load": {events: []*meshv1.ChangeEvent{{Type: meshv1.ChangeEvent_TYPE_RESYNC, Revision: 5, Restored: true, Epoch: 7}}},
		// An event that cannot be applied would lose its change.
		"an event that does not decode": {events: []*meshv1.ChangeEvent{nil}},
		"a value that does not decode": {events: []*meshv1.ChangeEvent{{Type: meshv1.ChangeEvent_TYPE_PUT,
			Key: "/mesh/v1/services/ns/c", Revision: 15, Value: []byte{0xff}}}},
	}
	for name, first := range tests {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
					func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
					func() ([]model.Stored, int64, error) { return []model.Stored{stored("b", 80)}, 20, nil },
				}}
				sink := &recordingSink{}
				p, stop := run(t, Config{Loader: loader, Feed: &scriptedFeed{batches: []feedBatch{first}}, Tables: sink}, 5*time.Second)
				if loader.calls != 2 {
					t.Errorf("loaded %d times, want 2", loader.calls)
				}
				if got := sink.clusters(); len(got) != 1 || got[0] != "outbound|80||b.ns.svc.cluster.local" {
					t.Errorf("serving clusters %v, want only b's", got)
				}
				if p.GeneratedRevision() != 20 {
					t.Errorf("generated revision %d, want 20", p.GeneratedRevision())
				}
				stop()
			})
		})
	}
}

// TestEventBeyondTheStoreIsRefused: an event whose revision the store has
// not reached (a forged one) is refused; it does not hold its key, and the
// events after it apply.
func TestEventBeyondTheStoreIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
		}}
		b := stored("b", 80)
		value, err := model.Encode(b.Object)
		if err != nil {
			t.Fatal(err)
		}
		feed := &scriptedFeed{batches: []feedBatch{{events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/ns/a", Revision: 1 << 62},
			{Type: meshv1.ChangeEvent_TYPE_PUT, Key: b.Key.String(), Revision: 12, Value: value},
		}}}}
		sink := &recordingSink{}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, 5*time.Second)
		if got := sink.clusters(); len(got) != 2 {
			t.Errorf("serving clusters %v, want a's and b's", got)
		}
		if invalid := testutil.ToFloat64(p.m.events.WithLabelValues("invalid")); invalid != 1 {
			t.Errorf("%v events refused, want 1", invalid)
		}
		stop()
	})
}

func TestPusherKeepsServingWhileTheStoreIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := errors.New("etcd unavailable")
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
			func() ([]model.Stored, int64, error) { return nil, 0, down },
		}}
		sink := &recordingSink{}
		feed := &scriptedFeed{batches: []feedBatch{{end: errors.New("nats: connection closed")}}}
		_, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, 10*time.Second)
		if loader.calls < 3 {
			t.Errorf("loaded %d times, want retries while the store is down", loader.calls)
		}
		if got := sink.clusters(); len(got) != 1 || got[0] != "outbound|80||a.ns.svc.cluster.local" {
			t.Errorf("serving clusters %v, want a's, the last known config", got)
		}
		stop()
	})
}

func TestMain(m *testing.M) { shtest.VerifyNoLeaks(m) }

// countingSink counts the updates per type.
type countingSink struct {
	mu      sync.Mutex
	updates map[string]int
	epoch   atomic.Int64
}

func (s *countingSink) BeginEpoch() int64 { return s.epoch.Add(1) }

func (s *countingSink) Update(class cache.Class, typeURL string, res map[string]types.Resource) (int, int, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.updates == nil {
		s.updates = map[string]int{}
	}
	s.updates[typeURL]++
	return len(res), 0, 0, nil
}

func (s *countingSink) Patch(class cache.Class, typeURL string, set map[string]types.Resource, remove []string) (int, int, int, error) {
	return s.Update(class, typeURL, set)
}

func (s *countingSink) Classes() []cache.Class { return Classes }
func (s *countingSink) Backlog() int64         { return 0 }
func (s *countingSink) Holding() int64         { return 0 }

func (s *countingSink) count(typeURL string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.updates[typeURL]
}

func endpointsEvent(t *testing.T, service string, rev int64, addrs ...string) *meshv1.ChangeEvent {
	t.Helper()
	eps := &meshv1.Endpoints{Service: service, Shard: "test"}
	for _, a := range addrs {
		eps.Endpoints = append(eps.Endpoints, &meshv1.Endpoint{Address: a})
	}
	v, err := model.Encode(eps)
	if err != nil {
		t.Fatal(err)
	}
	return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Revision: rev,
		Key: model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: model.EndpointsName(service, "test")}.String(), Value: v}
}

// TestEndpointChangeRegeneratesOnlyWhatChanged: an endpoint change takes the
// EDS fast path (no clusters, routes or listeners rebuilt) and regenerates
// only the changed service's assignments; the others are not even looked up.
func TestEndpointChangeRegeneratesOnlyWhatChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{stored("a", 80), stored("b", 80)}, 10, nil
			},
		}}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{endpointsEvent(t, "a", 11, "10.0.0.1")}}}}
		sink := &countingSink{}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, 5*time.Second)
		stop()
		// The load built clusters once per class; the endpoint change took
		// the fast path and rebuilt endpoints alone.
		if got := sink.count(resource.ClusterType); got != 2 {
			t.Errorf("clusters handed over %d times, want 2 (once per class)", got)
		}
		full := testutil.ToFloat64(p.m.generations.WithLabelValues("full"))
		eds := testutil.ToFloat64(p.m.generations.WithLabelValues("eds"))
		if full != 1 || eds != 1 {
			t.Errorf("%v full and %v EDS-only generations, want 1 and 1", full, eds)
		}
		// Assignments: a and b generated at load; at the change, a alone
		// (its endpoints changed).
		if miss, hit := testutil.ToFloat64(p.m.cache.WithLabelValues("eds", "miss")), testutil.ToFloat64(p.m.cache.WithLabelValues("eds", "hit")); miss != 3 || hit != 0 {
			t.Errorf("assignment cache: %v misses and %v hits, want 3 and 0", miss, hit)
		}
	})
}

func routeRule(host string, timeout time.Duration) *meshv1.RouteRule {
	return &meshv1.RouteRule{Hosts: []string{host}, Http: []*meshv1.HTTPRoute{{
		Timeout: durationpb.New(timeout),
		Route:   []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: host}}},
	}}}
}

// TestRouteChangeRegeneratesOnlyTheRoutesItTouches: a VirtualService change
// builds new route configurations only for the ports of the host it names;
// every other route configuration is handed over as the same object, so the
// cache neither encodes nor sends it again.
func TestRouteChangeRegeneratesOnlyTheRoutesItTouches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const aHost = "a.ns.svc.cluster.local"
		rule := model.Stored{Key: model.Key{Kind: model.KindRouteRule, Namespace: "ns", Name: "a"}, Object: routeRule(aHost, time.Second), ModRevision: 1}
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{stored("a", 8080), stored("b", 9090), rule}, 10, nil
			},
		}}
		v, err := model.Encode(routeRule(aHost, 2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		change := &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Revision: 11, Key: rule.Key.String(), Value: v}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{change}}}}
		sink := &recordingSink{}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, time.Second)
		before := sink.resources("envoy", resource.RouteType)
		time.Sleep(4 * time.Second)
		synctest.Wait()
		after := sink.resources("envoy", resource.RouteType)
		stop()
		if len(before) != 2 || len(after) != 2 {
			t.Fatalf("route configurations %d before and %d after, want 2 (ports 8080 and 9090)", len(before), len(after))
		}
		if before["8080"] == after["8080"] {
			t.Error("route configuration 8080 was not rebuilt although its VirtualService changed")
		}
		if before["9090"] != after["9090"] {
			t.Error("route configuration 9090 was rebuilt although nothing it holds changed")
		}
		// Virtual hosts: a and b for Envoy and proxyless at load; at the
		// change, a's two again and, for the Envoys' class generated
		// whole (a has no port 80: see generate.Mesh.ReroutedHosts), b's
		// from the cache; the proxyless clients' class reroutes a alone.
		if miss, hit := testutil.ToFloat64(p.m.cache.WithLabelValues("vh", "miss")), testutil.ToFloat64(p.m.cache.WithLabelValues("vh", "hit")); miss != 6 || hit != 1 {
			t.Errorf("virtual host cache: %v misses and %v hits, want 6 and 1", miss, hit)
		}
	})
}

// scopedSink serves the classes it is given.
type scopedSink struct {
	recordingSink
	classes []cache.Class
}

func (s *scopedSink) Classes() []cache.Class { return s.classes }

// TestConfigChangeRegeneratesOnlyTheClassesThatSeeIt: with each namespace's
// proxies limited to their namespace by a Sidecar, a service change
// regenerates the class of its namespace and not the other's.
func TestConfigChangeRegeneratesOnlyTheClassesThatSeeIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := func(ns string, port uint32) model.Stored {
			s := stored("svc", port)
			s.Key.Namespace = ns
			s.Object.(*meshv1.Service).Hostnames = []string{"svc." + ns + ".svc.cluster.local"}
			return s
		}
		sidecar := func(ns string) model.Stored {
			return model.Stored{Key: model.Key{Kind: model.KindScope, Namespace: ns, Name: "default"}, ModRevision: 1,
				Object: &meshv1.Scope{Egress: []*meshv1.EgressListener{{Hosts: []string{"./*"}}}}}
		}
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{svc("a", 80), svc("b", 80), sidecar("a"), sidecar("b")}, 10, nil
			},
		}}
		changed := svc("a", 81)
		value, err := model.Encode(changed.Object)
		if err != nil {
			t.Fatal(err)
		}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_PUT, Key: changed.Key.String(), Revision: 11, Value: value}}}}}
		sink := &scopedSink{classes: []cache.Class{"envoy/a/default", "envoy/b/default"}}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, 5*time.Second)
		stop()
		generated := testutil.ToFloat64(p.m.classes.WithLabelValues("generated"))
		unchanged := testutil.ToFloat64(p.m.classes.WithLabelValues("unchanged"))
		if generated != 4 || unchanged != 2 {
			t.Errorf("%v classes generated and %v left unchanged, want 4 (both at the load, a's at the change, a's when its old cluster goes) and 2 (b's)", generated, unchanged)
		}
		var ports []string
		for name := range sink.resources("envoy/a/default", resource.ClusterType) {
			ports = append(ports, name)
		}
		if !slices.Contains(ports, "outbound|81||svc.a.svc.cluster.local") {
			t.Errorf("class a serves %v, want the new port", ports)
		}
	})
}

// TestTooLargeForProxylessIsServedByName: clusters a proxyless client
// could not receive all in one message are still handed over (grpc-go
// asks for those it needs by name, and the server bounds each response),
// and the generation is counted.
func TestTooLargeForProxylessIsServedByName(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var objs []model.Stored
		for i := range 20 {
			objs = append(objs, stored(fmt.Sprintf("svc-%d", i), 80))
		}
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return objs, 10, nil },
		}}
		sink := &recordingSink{}
		p, stop := run(t, Config{Loader: loader, Feed: &scriptedFeed{}, Tables: sink, MaxProxylessResponse: 1000}, 5*time.Second)
		stop()
		if got := len(sink.resources("proxyless", resource.ClusterType)); got != 20 {
			t.Errorf("proxyless class handed %d clusters, want all 20", got)
		}
		if n := testutil.ToFloat64(p.m.tooLarge); n < 1 {
			t.Errorf("%v generations counted too large, want at least 1", n)
		}
		if got := p.ResponseLimit("proxyless"); got != 1000 {
			t.Errorf("a proxyless class's response limit is %d, want 1000", got)
		}
	})
}

// busySink is a recording sink whose backlog the test sets.
type busySink struct {
	recordingSink
	backlog atomic.Int64
}

func (s *busySink) Backlog() int64 { return s.backlog.Load() }
func (s *busySink) Holding() int64 { return s.backlog.Load() }

// TestRemovedClustersLinger: a cluster a class no longer has is still
// served until the pushes of the generation that removed it (with the
// routes that stop naming it) are written and answered, then goes without
// another change; and at the latest after ClusterLinger.
func TestRemovedClustersLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{stored("a", 80), stored("b", 80), stored("c", 80)}, 10, nil
			},
		}}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/ns/b", Revision: 11}}}}}
		sink := &busySink{}
		reg := prometheus.NewRegistry()
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink, ClusterLinger: 30 * time.Second, Registerer: reg}, time.Second)
		sink.backlog.Store(1) // the proxies are busy from here on
		if err := testutil.GatherAndCompare(reg, strings.NewReader("# HELP shardpilot_pusher_xds_backlog "+backlogHelp+"\n# TYPE shardpilot_pusher_xds_backlog gauge\nshardpilot_pusher_xds_backlog 1\n"),
			"shardpilot_pusher_xds_backlog"); err != nil {
			t.Errorf("while the proxies are busy: %v", err)
		}
		// b is removed at 2s; busy, the generation waits for the maximum
		// hold (5s).
		time.Sleep(7 * time.Second)
		synctest.Wait()
		if p.GeneratedRevision() != 11 || len(sink.clusters()) != 3 {
			t.Errorf("after the removal, pushes not yet answered (revision %d): clusters %v, want b's still served", p.GeneratedRevision(), sink.clusters())
		}
		sink.backlog.Store(0) // every push answered
		time.Sleep(time.Second)
		synctest.Wait()
		if got := sink.clusters(); len(got) != 2 || slices.Contains(got, "outbound|80||b.ns.svc.cluster.local") {
			t.Errorf("once the pushes were answered: clusters %v, want a's and c's", got)
		}
		stop()
	})
}

// TestRemovedClustersGoWhileBusy: a removed cluster goes after
// ClusterLinger even when the proxies never catch up and no other change
// follows: the generation that lets it go is not skipped as one that
// changes nothing (the last change of a busy load test once lingered for
// ever).
func TestRemovedClustersGoWhileBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{stored("a", 80), stored("b", 80)}, 10, nil
			},
		}}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/ns/b", Revision: 11}}}}}
		sink := &busySink{}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink, ClusterLinger: 10 * time.Second}, time.Second)
		defer stop()
		sink.backlog.Store(1) // the proxies are busy for good
		time.Sleep(15 * time.Second)
		synctest.Wait()
		if p.GeneratedRevision() != 11 || len(sink.clusters()) != 2 {
			t.Fatalf("before ClusterLinger passed (revision %d): clusters %v, want b's still served", p.GeneratedRevision(), sink.clusters())
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := sink.clusters(); len(got) != 1 || slices.Contains(got, "outbound|80||b.ns.svc.cluster.local") {
			t.Errorf("ClusterLinger after the removal, proxies still busy: clusters %v, want a's alone", got)
		}
	})
}

// run starts a pusher in the test's bubble, lets it work for d of the
// bubble's time, and returns it with a function that stops it.
func run(t *testing.T, cfg Config, d time.Duration) (*Pusher, func()) {
	t.Helper()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Run(ctx) }()
	time.Sleep(d)
	synctest.Wait()
	return p, func() { cancel(); <-done }
}

// watchingLoader is a scriptedLoader that also answers Ahead as its ahead
// function says.
type watchingLoader struct {
	*scriptedLoader
	mu    sync.Mutex
	ahead func(after int64) (first, current int64)
	asked int
}

func (l *watchingLoader) Ahead(_ context.Context, after int64, _ func(string) bool, _ time.Duration) (int64, int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked++
	first, current := l.ahead(after)
	return first, current, nil
}

func (l *watchingLoader) set(ahead func(after int64) (first, current int64)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ahead = ahead
}

// TestBehindTheStore: a change the store holds that the change stream does
// not bring (a stuck relay) makes the pusher stale, behind the store, from
// the check that found it, once the next check still finds it; it is no
// longer once the change is applied. A passing lag (found once) is not
// stale.
func TestBehindTheStore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &watchingLoader{scriptedLoader: &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
		}}, ahead: func(int64) (int64, int64) { return 0, 10 }}
		p, err := New(Config{Loader: loader, Feed: &scriptedFeed{}, Tables: &recordingSink{}, StoreCheck: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- p.Run(ctx) }()
		time.Sleep(3 * time.Second)
		synctest.Wait()
		if p.Stale() != 0 || p.StaleReason() != "" {
			t.Fatalf("stale %s (%q) while nothing is ahead", p.Stale(), p.StaleReason())
		}
		// Revision 11 is in the store; the stream never brings it.
		loader.set(func(after int64) (int64, int64) { return 11, 11 })
		time.Sleep(1500 * time.Millisecond) // one check finds it
		synctest.Wait()
		if p.Stale() != 0 {
			t.Errorf("stale %s after one check: a passing lag is not", p.Stale())
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := p.Stale(); got < 10*time.Second || got > 11*time.Second {
			t.Errorf("stale %s, want about 10.5s: since the first check found the change", got)
		}
		if r := p.StaleReason(); !strings.Contains(r, "behind the store") || !strings.Contains(r, "revision 11") {
			t.Errorf("reason %q, want behind the store at revision 11", r)
		}
		// The relay is back: the store holds nothing the pusher lacks.
		loader.set(func(after int64) (int64, int64) { return 0, 11 })
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if p.Stale() != 0 {
			t.Errorf("stale %s (%q) after catching up", p.Stale(), p.StaleReason())
		}
		cancel()
		<-done
	})
}

// TestStoreRestoredIsLoadedAgain: a store whose revision is below what the
// pusher applied (etcd restored from a snapshot), at two checks running,
// is loaded again, and counted.
func TestStoreRestoredIsLoadedAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &watchingLoader{scriptedLoader: &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("b", 80)}, 5, nil },
		}}, ahead: func(int64) (int64, int64) { return 0, 5 }}
		sink := &recordingSink{}
		p, stop := run(t, Config{Loader: loader, Feed: &scriptedFeed{}, Tables: sink, StoreCheck: time.Second}, 5*time.Second)
		if loader.calls != 2 {
			t.Errorf("loaded %d times, want 2: once more after the restore", loader.calls)
		}
		if got := sink.clusters(); len(got) != 1 || got[0] != "outbound|80||b.ns.svc.cluster.local" {
			t.Errorf("serving clusters %v, want the restored store's", got)
		}
		if n := testutil.ToFloat64(p.m.storeBack); n != 1 {
			t.Errorf("%v restores counted, want 1", n)
		}
		stop()
	})
}

// valueLoader is a scriptedLoader that reads values, as the store does for
// events carried by reference.
type valueLoader struct {
	*scriptedLoader
	values map[string]model.Stored
}

func (l *valueLoader) Value(_ context.Context, key string) ([]byte, int64, error) {
	st, ok := l.values[key]
	if !ok {
		return nil, 0, nil
	}
	v, err := model.Encode(st.Object)
	return v, st.ModRevision, err
}

// TestEventByReference: an event whose value was too large for the bus is
// applied with the value the store holds (at its mod revision, a later one
// when the key changed since); one whose key is gone is a delete.
func TestEventByReference(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := stored("b", 80)
		b.ModRevision = 14
		loader := &valueLoader{scriptedLoader: &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
		}}, values: map[string]model.Stored{b.Key.String(): b}}
		feed := &scriptedFeed{batches: []feedBatch{{events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_PUT, Key: b.Key.String(), Revision: 12, ByReference: true},
			{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/services/ns/a", Revision: 13, ByReference: true},
		}}}}
		sink := &recordingSink{}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, 5*time.Second)
		if got := sink.clusters(); len(got) != 1 || got[0] != "outbound|80||b.ns.svc.cluster.local" {
			t.Errorf("serving clusters %v, want b's (read from the store) and a's gone (no longer there)", got)
		}
		if n := testutil.ToFloat64(p.m.byReference); n != 1 {
			t.Errorf("%v events read by reference, want 1", n)
		}
		stop()
	})
}

// TestImpossibleObservedTimes: a change stamped by a clock an hour ahead
// or behind is counted and measured from its arrival: the apply lag and
// convergence histograms see no negative or hour-long time.
func TestImpossibleObservedTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
		}}
		var events []*meshv1.ChangeEvent
		for i, off := range []time.Duration{time.Hour, -time.Hour, -time.Second} {
			st := stored(fmt.Sprintf("s%d", i), 80)
			st.Object.(*meshv1.Service).Origin = &meshv1.Origin{ObservedAt: timestamppb.New(time.Now().Add(off))}
			value, err := model.Encode(st.Object)
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: st.Key.String(), Revision: int64(11 + i), Value: value})
		}
		p, stop := run(t, Config{Loader: loader, Feed: &scriptedFeed{batches: []feedBatch{{events: events}}}, Tables: &recordingSink{}}, 5*time.Second)
		if n := testutil.ToFloat64(p.m.impossibleClock); n != 2 {
			t.Errorf("%v impossible observed times counted, want 2 (an hour ahead, an hour behind)", n)
		}
		var lag dto.Metric
		if err := p.m.applyLag.Write(&lag); err != nil {
			t.Fatal(err)
		}
		if n := lag.GetHistogram().GetSampleCount(); n != 1 || lag.GetHistogram().GetSampleSum() < 0 || lag.GetHistogram().GetSampleSum() > 60 {
			t.Errorf("apply lag: %d samples summing %vs, want the one possible (a second)", n, lag.GetHistogram().GetSampleSum())
		}
		stop()
	})
}

// twoScopes is a busy sink serving two classes, of namespaces a and b,
// whose Sidecars see their own namespace alone.
type twoScopes struct{ busySink }

func (s *twoScopes) Classes() []cache.Class {
	return []cache.Class{"envoy/a/default", "envoy/b/default"}
}

func (s *twoScopes) outbound(class cache.Class) []string {
	var names []string
	for n := range s.resources(class, resource.ClusterType) {
		if strings.HasPrefix(n, "outbound|") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// TestLingeringGoesInEveryClass: a class whose cluster lingers from a
// later removal than another class's loses it at the latest ClusterLinger
// after its own removal, though the generation that let the other's go
// changed nothing for it (it once lingered for ever: the only timer was
// the other class's, and the class published nothing to arm its own).
func TestLingeringGoesInEveryClass(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := func(ns, name string) model.Stored {
			s := stored(name, 80)
			s.Key.Namespace = ns
			s.Object.(*meshv1.Service).Hostnames = []string{name + "." + ns + ".svc.cluster.local"}
			return s
		}
		scope := func(ns string) model.Stored {
			return model.Stored{Key: model.Key{Kind: model.KindScope, Namespace: ns, Name: "default"}, ModRevision: 1,
				Object: &meshv1.Scope{Egress: []*meshv1.EgressListener{{Hosts: []string{"./*"}}}}}
		}
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{scope("a"), scope("b"), in("a", "x"), in("a", "keep"), in("b", "y"), in("b", "keep")}, 10, nil
			},
		}}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, gap: 12 * time.Second, events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/a/x", Revision: 11},
			{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/b/y", Revision: 12}}}}}
		sink := &twoScopes{}
		_, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink, ClusterLinger: 20 * time.Second}, time.Second)
		defer stop()
		sink.backlog.Store(1) // the proxies are busy for good
		if got := sink.outbound("envoy/b/default"); len(got) != 2 {
			t.Fatalf("class b at the start: clusters %v, want y's and keep's", got)
		}
		// Busy, each generation waits the maximum hold (5s): x's removal
		// (at 2s) is generated at 7s, y's (at 14s) at 19s, and the one its
		// lingering asks for at 24s, which sees y lingering; the timer for
		// x (27s) is generated at 32s, where x goes and class b changes
		// nothing. y goes at 39s, generated at 44s.
		time.Sleep(70 * time.Second)
		synctest.Wait()
		if got := sink.outbound("envoy/a/default"); !slices.Equal(got, []string{"outbound|80||keep.a.svc.cluster.local"}) {
			t.Errorf("class a, ClusterLinger after x's removal: clusters %v, want keep's alone", got)
		}
		if got := sink.outbound("envoy/b/default"); !slices.Equal(got, []string{"outbound|80||keep.b.svc.cluster.local"}) {
			t.Errorf("class b, ClusterLinger after y's removal: clusters %v, want keep's alone", got)
		}
	})
}
