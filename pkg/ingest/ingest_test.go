package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// countingStore is the real store, counting lists and failing the puts it
// is told to.
type countingStore struct {
	*store.Store
	lists    int
	failPuts int
}

func (c *countingStore) List(ctx context.Context) ([]model.Stored, int64, []error, error) {
	c.lists++
	return c.Store.List(ctx)
}

func (c *countingStore) PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (bool, int64, error) {
	if c.failPuts > 0 {
		c.failPuts--
		return false, 0, errors.New("etcd unavailable")
	}
	return c.Store.PutAt(ctx, k, o, modRev)
}

func svc(name string, port uint32) ingest.Object {
	loc := "Service ns/" + name
	return ingest.Object{
		Key: model.Key{Kind: model.KindService, Namespace: "ns", Name: name},
		Object: &meshv1.Service{Origin: &meshv1.Origin{Location: loc}, Hostnames: []string{name + ".ns.svc.cluster.local"},
			Ports: []*meshv1.Port{{Name: "http", Number: port, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}},
	}
}

func eps(name string, ips ...string) ingest.Object {
	o := &meshv1.Endpoints{Origin: &meshv1.Origin{Location: "Service ns/" + name}, Service: name}
	for _, ip := range ips {
		o.Endpoints = append(o.Endpoints, &meshv1.Endpoint{Address: ip, Ports: map[string]uint32{"http": 8080}})
	}
	return ingest.Object{Key: model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: model.EndpointsName(name, "test")}, Object: o}
}

func route(name, host string) ingest.Object {
	return ingest.Object{
		Key: model.Key{Kind: model.KindRouteRule, Namespace: "ns", Name: name},
		Object: &meshv1.RouteRule{Origin: &meshv1.Origin{Location: "VirtualService ns/" + name}, Hosts: []string{host},
			Http: []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: host}}}}}},
	}
}

func stored(t *testing.T, s *store.Store) []string {
	t.Helper()
	items, _, _, err := s.List(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range items {
		desc := it.Key.String()
		if e, ok := it.Object.(*meshv1.Endpoints); ok {
			desc += fmt.Sprintf(" (%d)", len(e.Endpoints))
		}
		out = append(out, desc)
	}
	sort.Strings(out)
	return out
}

func newSyncer(t *testing.T) (*ingest.Syncer, *countingStore) {
	_, cli := testutil.Etcd(t)
	st := &countingStore{Store: store.New(cli)}
	s, err := ingest.NewSyncer(ingest.Config{Source: "test", Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s, st
}

func want(t *testing.T, st *countingStore, keys ...string) {
	t.Helper()
	got := stored(t, st.Store)
	sort.Strings(keys)
	if fmt.Sprint(got) != fmt.Sprint(keys) {
		t.Fatalf("store holds %v, want %v", got, keys)
	}
}

// TestSyncPartTouchesOnlyItsPart: a part's sync writes what changed in it
// and deletes what it no longer holds, leaves the rest alone, and does not
// list the store.
func TestSyncPartTouchesOnlyItsPart(t *testing.T) {
	s, st := newSyncer(t)
	ctx := testutil.Context(t)
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80), eps("a", "10.0.0.1"), svc("b", 80), eps("b", "10.0.1.1")}, nil); err != nil {
		t.Fatal(err)
	}
	want(t, st, "/mesh/v1/endpoints/ns/a/test (1)", "/mesh/v1/endpoints/ns/b/test (1)", "/mesh/v1/services/ns/a", "/mesh/v1/services/ns/b")

	res, err := s.SyncPart(ctx, []string{"Service ns/a"}, []ingest.Object{svc("a", 80), eps("a", "10.0.0.1", "10.0.0.2")}, nil)
	if err != nil || res.Written != 1 || res.Unchanged != 1 || res.Deleted != 0 {
		t.Fatalf("endpoint added: %+v %v, want 1 written and 1 unchanged", res, err)
	}
	res, err = s.SyncPart(ctx, []string{"Service ns/b"}, nil, nil)
	if err != nil || res.Deleted != 2 || res.Written != 0 {
		t.Fatalf("service b gone: %+v %v, want 2 deleted", res, err)
	}
	want(t, st, "/mesh/v1/endpoints/ns/a/test (2)", "/mesh/v1/services/ns/a")
	if st.lists != 1 {
		t.Errorf("store listed %d times, want once (by the first sync)", st.lists)
	}
}

// TestSyncPartRetriesWhatWaitsForAHost: an object rejected for a host
// nothing defines yet is written by the sync, of another part, that
// defines the host; its problem goes with it.
func TestSyncPartRetriesWhatWaitsForAHost(t *testing.T) {
	s, st := newSyncer(t)
	ctx := testutil.Context(t)
	res, err := s.Sync(ctx, []ingest.Object{route("r", "a.ns.svc.cluster.local")}, nil)
	if err != nil || len(res.Problems) != 1 {
		t.Fatalf("route to an unknown host: %+v %v, want one problem", res, err)
	}
	if p := res.Problems[0]; p.Location != "VirtualService ns/r" || p.Field != "spec.http[0].route[0].destination.host" {
		t.Errorf("problem %v, want one at VirtualService ns/r naming the host field", p)
	}
	want(t, st)
	res, err = s.SyncPart(ctx, []string{"Service ns/a"}, []ingest.Object{svc("a", 80)}, nil)
	if err != nil || res.Written != 2 || len(res.Problems) != 0 {
		t.Fatalf("host defined: %+v %v, want the service and the route written, no problem", res, err)
	}
	want(t, st, "/mesh/v1/routerules/ns/r", "/mesh/v1/services/ns/a")
}

// TestRetryPendingSeesOtherSources: a route rejected for a host no source
// defines yet is written once another source writes the host, by
// RetryPending, without a sync of its own source; until the store moves,
// a retry does not list it.
func TestRetryPendingSeesOtherSources(t *testing.T) {
	routes, st := newSyncer(t)
	services, err := ingest.NewSyncer(ingest.Config{Source: "registry", Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t)
	if res, err := routes.Sync(ctx, []ingest.Object{route("r", "a.ns.svc.cluster.local")}, nil); err != nil || len(res.Problems) != 1 || !routes.Pending() {
		t.Fatalf("route to an unknown host: %+v %v, pending %v; want one problem, pending", res, err, routes.Pending())
	}
	// Nothing written since the route's sync listed the store: the retry
	// does not list it again.
	lists := st.lists
	if res, err := routes.RetryPending(ctx); err != nil || res.Written != 0 || st.lists != lists {
		t.Fatalf("retry of an unchanged store: %+v %v, %d lists, want none written and no list", res, err, st.lists-lists)
	}
	if _, err := services.Sync(ctx, []ingest.Object{svc("a", 80)}, nil); err != nil {
		t.Fatal(err)
	}
	lists = st.lists
	res, err := routes.RetryPending(ctx)
	if st.lists != lists+1 {
		t.Errorf("retry after another source wrote: %d lists, want 1", st.lists-lists)
	}
	if err != nil || res.Written != 1 || len(res.Problems) != 0 || routes.Pending() {
		t.Fatalf("after the other source wrote the host: %+v %v, pending %v; want the route written, no problem", res, err, routes.Pending())
	}
	want(t, st, "/mesh/v1/routerules/ns/r", "/mesh/v1/services/ns/a")
}

// TestSyncPartKeepsOtherProblems: a part's sync reports the problems of
// the other parts too, and a problem's KeepLocation keeps its objects.
func TestSyncPartKeepsOtherProblems(t *testing.T) {
	s, st := newSyncer(t)
	ctx := testutil.Context(t)
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80), svc("b", 80)}, nil); err != nil {
		t.Fatal(err)
	}
	bad := ingest.Problem{Location: "Service ns/b", Reason: "spec.ports: none left", KeepLocation: "Service ns/b"}
	res, err := s.SyncPart(ctx, []string{"Service ns/b"}, nil, []ingest.Problem{bad})
	if err != nil || res.Deleted != 0 || len(res.Problems) != 1 {
		t.Fatalf("b broken: %+v %v, want b kept and its problem", res, err)
	}
	res, err = s.SyncPart(ctx, []string{"Service ns/a"}, []ingest.Object{svc("a", 81)}, nil)
	if err != nil || res.Written != 1 || len(res.Problems) != 1 || res.Problems[0].Location != "Service ns/b" {
		t.Fatalf("a changed: %+v %v, want a written and b's problem still reported", res, err)
	}
	want(t, st, "/mesh/v1/services/ns/a", "/mesh/v1/services/ns/b")
}

// TestSyncerListsAgainAfterAFailedWrite: after a failed write the Syncer
// does not trust what it knows, and Forget repairs drift.
func TestSyncerListsAgainAfterAFailedWrite(t *testing.T) {
	s, st := newSyncer(t)
	ctx := testutil.Context(t)
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80)}, nil); err != nil {
		t.Fatal(err)
	}
	st.failPuts = 1
	if _, err := s.SyncPart(ctx, []string{"Service ns/a"}, []ingest.Object{svc("a", 81)}, nil); err == nil {
		t.Fatal("a failed write did not fail the sync")
	}
	res, err := s.SyncPart(ctx, []string{"Service ns/a"}, []ingest.Object{svc("a", 81)}, nil)
	if err != nil || res.Written != 1 || st.lists != 2 {
		t.Fatalf("retry: %+v %v after %d lists, want a write after a second list", res, err, st.lists)
	}

	// Someone else deletes the object: the Syncer, trusting what it
	// wrote, sees nothing to do until it is told to forget.
	if _, _, err := st.Store.Delete(ctx, svc("a", 0).Key); err != nil {
		t.Fatal(err)
	}
	s.Forget()
	res, err = s.Sync(ctx, []ingest.Object{svc("a", 81)}, nil)
	if err != nil || res.Written != 1 {
		t.Fatalf("resync: %+v %v, want the deleted object written again", res, err)
	}
	want(t, st, "/mesh/v1/services/ns/a")
}

// TestLargeObjectsAreSplitOrRejected: endpoints too large to store are
// split into chunks under keys of their own, which follow the set as it
// shrinks; any other object that large is rejected with a problem, and
// its last valid version stays.
func TestLargeObjectsAreSplitOrRejected(t *testing.T) {
	_, cli := testutil.Etcd(t)
	st := &countingStore{Store: store.New(cli)}
	const limit = 2 << 10
	s, err := ingest.NewSyncer(ingest.Config{Source: "test", Store: st, Log: testutil.Log(t), MaxObjectSize: limit})
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t)
	addrs := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
		}
		return out
	}
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80), eps("a", addrs(200)...)}, nil); err != nil {
		t.Fatal(err)
	}
	items, _, _, err := st.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chunks, total := 0, 0
	for _, it := range items {
		if e, ok := it.Object.(*meshv1.Endpoints); ok {
			chunks++
			total += len(e.Endpoints)
			if v, _ := model.Encode(e); len(v) > limit {
				t.Errorf("%s is %d bytes, over the limit of %d", it.Key, len(v), limit)
			}
		}
	}
	if chunks < 2 || total != 200 {
		t.Fatalf("stored %d chunks holding %d endpoints, want several holding all 200", chunks, total)
	}
	// The set shrinks: the chunks it no longer needs go.
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80), eps("a", addrs(3)...)}, nil); err != nil {
		t.Fatal(err)
	}
	want(t, st, "/mesh/v1/endpoints/ns/a/test (3)", "/mesh/v1/services/ns/a")

	// A service too large: rejected, the stored version stays.
	big := svc("a", 81)
	for i := range 200 {
		big.Object.(*meshv1.Service).Hostnames = append(big.Object.(*meshv1.Service).Hostnames, fmt.Sprintf("alias-%d.example.com", i))
	}
	res, err := s.Sync(ctx, []ingest.Object{big, eps("a", addrs(3)...)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Problems) != 1 || !strings.Contains(res.Problems[0].Reason, "bytes encoded") || res.Problems[0].Location != "Service ns/a" {
		t.Fatalf("problems %v, want one saying the service is too large", res.Problems)
	}
	want(t, st, "/mesh/v1/endpoints/ns/a/test (3)", "/mesh/v1/services/ns/a")
	items, _, _, _ = st.Store.List(ctx)
	for _, it := range items {
		if sv, ok := it.Object.(*meshv1.Service); ok && sv.Ports[0].Number != 80 {
			t.Errorf("stored service has port %d, want the last valid version (80)", sv.Ports[0].Number)
		}
	}
}

// Stored answers what this source holds in the store: after a sync, after
// Forget (from a list the next sync then uses), and for a new Syncer of
// the same source (a restart); never another source's objects.
func TestStored(t *testing.T) {
	s, st := newSyncer(t)
	ctx := testutil.Context(t)
	k := svc("a", 80).Key
	if o, err := s.Stored(ctx, k); err != nil || o != nil {
		t.Fatalf("before any sync: %v, %v; want none", o, err)
	}
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80)}, nil); err != nil {
		t.Fatal(err)
	}
	port := func(s *ingest.Syncer) uint32 {
		t.Helper()
		o, err := s.Stored(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		return o.(*meshv1.Service).GetPorts()[0].GetNumber()
	}
	if got := port(s); got != 80 {
		t.Errorf("after a sync: port %d, want 80", got)
	}
	s.Forget()
	lists := st.lists
	if got := port(s); got != 80 {
		t.Errorf("after Forget: port %d, want 80", got)
	}
	if _, err := s.Sync(ctx, []ingest.Object{svc("a", 80)}, nil); err != nil || st.lists != lists+1 {
		t.Errorf("Stored and the sync after it listed the store %d times, want once (%v)", st.lists-lists, err)
	}
	again, err := ingest.NewSyncer(ingest.Config{Source: "test", Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	if got := port(again); got != 80 {
		t.Errorf("a new Syncer of the source: port %d, want 80", got)
	}
	other, err := ingest.NewSyncer(ingest.Config{Source: "other", Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	if o, err := other.Stored(ctx, k); err != nil || o != nil {
		t.Errorf("another source's Stored: %v, %v; want none", o, err)
	}
}

// TestAdoptedObjects: a source that adopts another's objects (a cluster's
// part taking over its namespaces from the whole cluster's source) owns
// them from its first sync: it keeps what it still makes, deletes what it
// no longer does, and leaves the objects it does not adopt alone.
func TestAdoptedObjects(t *testing.T) {
	old, st := newSyncer(t)
	ctx := testutil.Context(t)
	other := svc("c", 80)
	other.Key.Namespace = "other"
	if _, err := old.Sync(ctx, []ingest.Object{svc("a", 80), svc("b", 80), other}, nil); err != nil {
		t.Fatal(err)
	}
	part, err := ingest.NewSyncer(ingest.Config{Source: "test#1of2", Store: st, Log: testutil.Log(t),
		Adopts: func(source string, k model.Key) bool { return source == "test" && k.Namespace == "ns" }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := part.Sync(ctx, []ingest.Object{svc("a", 80)}, nil)
	if err != nil || len(res.Problems) != 0 {
		t.Fatalf("the part's sync: %+v %v; want no problem (its objects are its own, not another source's)", res, err)
	}
	want(t, st, "/mesh/v1/services/ns/a", "/mesh/v1/services/other/c")
}

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// switchable is a store that can be swapped for another under the Syncer,
// as etcd restored from a snapshot is the same endpoint holding less.
type switchable struct {
	mu  sync.Mutex
	cur *store.Store
}

func (s *switchable) get() *store.Store   { s.mu.Lock(); defer s.mu.Unlock(); return s.cur }
func (s *switchable) set(st *store.Store) { s.mu.Lock(); defer s.mu.Unlock(); s.cur = st }
func (s *switchable) PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (bool, int64, error) {
	return s.get().PutAt(ctx, k, o, modRev)
}
func (s *switchable) DeleteAt(ctx context.Context, k model.Key, modRev int64) (bool, int64, error) {
	return s.get().DeleteAt(ctx, k, modRev)
}
func (s *switchable) WriteAll(ctx context.Context, writes []model.Stored) (bool, int64, []bool, error) {
	return s.get().WriteAll(ctx, writes)
}
func (s *switchable) List(ctx context.Context) ([]model.Stored, int64, []error, error) {
	return s.get().List(ctx)
}
func (s *switchable) Revision(ctx context.Context) (int64, error) { return s.get().Revision(ctx) }

// TestRestoredStoreIsWrittenAgain: a store restored from an older snapshot
// lacks what the source wrote since, which the Syncer believed it held;
// its Loop notices the store's revision went back (within StoreCheck) and
// syncs everything again, writing what was lost, without waiting for the
// periodic resync.
func TestRestoredStoreIsWrittenAgain(t *testing.T) {
	_, before := testutil.Etcd(t)
	_, restored := testutil.Etcd(t)
	sw := &switchable{cur: store.New(before)}
	s, err := ingest.NewSyncer(ingest.Config{Source: "test", Store: sw, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(testutil.Context(t))
	defer cancel()
	objs := []ingest.Object{svc("a", 80), svc("b", 80)}
	var mu sync.Mutex
	fulls := 0
	l := ingest.NewLoop(ingest.Loop{Writer: s, StoreCheck: 20 * time.Millisecond, Resync: time.Hour, Log: testutil.Log(t),
		Sync: func(ctx context.Context, full bool) error {
			mu.Lock()
			defer mu.Unlock()
			if full {
				fulls++
				s.Forget()
			}
			_, err := s.Sync(ctx, objs, nil)
			return err
		}})
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	testutil.Eventually(t, 10*time.Second, "a and b written", func() (bool, string) {
		got := stored(t, store.New(before))
		return len(got) == 2, fmt.Sprint(got)
	})
	mu.Lock()
	objs = append(objs, svc("c", 80))
	mu.Unlock()
	l.Changed()
	testutil.Eventually(t, 10*time.Second, "c written", func() (bool, string) {
		got := stored(t, store.New(before))
		return len(got) == 3, fmt.Sprint(got)
	})
	// The snapshot was taken before c: the restored store holds a and b
	// alone, at the revision they were written at (one transaction).
	var snapshot []model.Stored
	for _, o := range objs[:2] {
		snapshot = append(snapshot, model.Stored{Key: o.Key, Object: o.Object})
	}
	if ok, _, _, err := store.New(restored).WriteAll(ctx, snapshot); !ok || err != nil {
		t.Fatalf("restoring a and b: %v %v", ok, err)
	}
	sw.set(store.New(restored))
	testutil.Eventually(t, 10*time.Second, "c written again into the restored store", func() (bool, string) {
		got := stored(t, store.New(restored))
		return len(got) == 3, fmt.Sprint(got)
	})
	mu.Lock()
	if fulls != 2 {
		t.Errorf("%d full syncs, want 2 (the start, the restore)", fulls)
	}
	mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSyncWritesManyKeysPerTransaction: a sync of many objects writes
// them many to a transaction (the store's revision moves once per
// transaction), and deletes them likewise; a key another writer moved
// makes its transaction write one by one, and every object is stored as
// the source says, the moved one included.
func TestSyncWritesManyKeysPerTransaction(t *testing.T) {
	s, st := newSyncer(t)
	ctx := testutil.Context(t)
	var objs []ingest.Object
	var keys []string
	for i := range 300 {
		o := svc(fmt.Sprintf("s-%03d", i), 80)
		objs = append(objs, o)
		keys = append(keys, o.Key.String())
	}
	before, err := st.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Sync(ctx, objs, nil)
	if err != nil || res.Written != 300 {
		t.Fatalf("sync: %+v %v, want 300 written", res, err)
	}
	after, err := st.Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if txns := after - before; txns > 10 {
		t.Errorf("300 objects took %d revisions: want a few transactions", txns)
	}
	want(t, st, keys...)

	// Another writer moves one key: its transaction fails whole, and is
	// written one by one.
	moved := svc("s-007", 81)
	if _, _, err := st.Store.Put(ctx, moved.Key, moved.Object); err != nil {
		t.Fatal(err)
	}
	for i := range objs {
		objs[i] = svc(fmt.Sprintf("s-%03d", i), 82)
	}
	if res, err := s.Sync(ctx, objs, nil); err != nil || res.Written != 300 {
		t.Fatalf("sync over a moved key: %+v %v, want 300 written", res, err)
	}
	items, _, _, err := st.Store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if p := it.Object.(*meshv1.Service).Ports[0].Number; p != 82 {
			t.Errorf("%s holds port %d, want 82", it.Key, p)
		}
	}

	res, err = s.Sync(ctx, nil, nil)
	if err != nil || res.Deleted != 300 {
		t.Fatalf("sync of nothing: %+v %v, want 300 deleted", res, err)
	}
	want(t, st)
}

// TestCovers: a part covers the locations it names and those within them
// (followed by a space), nothing that merely starts the same.
func TestCovers(t *testing.T) {
	part := []string{"a.yaml", "VirtualService ns/vs-1"}
	for loc, want := range map[string]bool{
		"a.yaml":                   true,
		"a.yaml document 2":        true,
		"a.yamlx":                  false,
		"a.yaml.bak document 1":    false,
		"VirtualService ns/vs-1":   true,
		"VirtualService ns/vs-10":  false,
		"VirtualService ns/vs":     false,
		"":                         false,
		"b.yaml document 1":        false,
		"VirtualService ns/vs-1 x": true,
	} {
		if got := ingest.Covers(part, loc); got != want {
			t.Errorf("Covers(%q, %q) = %v, want %v", part, loc, got, want)
		}
	}
	if !ingest.Covers(nil, "anything") {
		t.Error("a nil part covers everything")
	}
}
