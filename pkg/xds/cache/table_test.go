package cache

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"unsafe"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func cla(name string, n uint32) types.Resource {
	return &endpoint.ClusterLoadAssignment{ClusterName: name,
		Endpoints: []*endpoint.LocalityLbEndpoints{{Priority: n}}}
}

func edsTable(t *testing.T, logSize int) (*Cache, *Table) {
	t.Helper()
	c, err := New(Config{SharedTypes: []string{resource.EndpointType}, LogSize: logSize})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := c.Table(Shared, resource.EndpointType)
	if err != nil {
		t.Fatal(err)
	}
	return c, tb
}

func update(t *testing.T, tb *Table, res map[string]types.Resource) {
	t.Helper()
	if _, _, _, err := tb.Update(res); err != nil {
		t.Fatal(err)
	}
}

func sotwNames(t *testing.T, r Response) []string {
	t.Helper()
	if r.Empty() {
		return nil
	}
	var msg discovery.DiscoveryResponse
	if err := proto.Unmarshal(r.Body, &msg); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range msg.Resources {
		var c endpoint.ClusterLoadAssignment
		if err := a.UnmarshalTo(&c); err != nil {
			t.Fatal(err)
		}
		out = append(out, c.ClusterName)
	}
	return out
}

func deltaNames(t *testing.T, r Response) (names, removed []string) {
	t.Helper()
	if r.Empty() {
		return nil, nil
	}
	var msg discovery.DeltaDiscoveryResponse
	if err := proto.Unmarshal(r.Body, &msg); err != nil {
		t.Fatal(err)
	}
	for _, res := range msg.Resources {
		names = append(names, res.Name)
	}
	return names, msg.RemovedResources
}

// TestChangesReachOnlyTheSetsThatHoldThem: an update wakes the watchers of
// the sets holding a changed name (and the wildcard's), and a stream is
// sent, from the log, only what changed since its version.
func TestChangesReachOnlyTheSetsThatHoldThem(t *testing.T) {
	_, tb := edsTable(t, 64)
	update(t, tb, map[string]types.Resource{"a": cla("a", 0), "b": cla("b", 0), "c": cla("c", 0), "d": cla("d", 0)})
	abc, dOnly, all := &counter{}, &counter{}, &counter{}
	set := tb.Subscribe(abc, []string{"a", "b", "c"}, false)
	other := tb.Subscribe(dOnly, []string{"d"}, false)
	wild := tb.Subscribe(all, nil, true)
	defer tb.Unsubscribe(abc, set)
	defer tb.Unsubscribe(dOnly, other)
	defer tb.Unsubscribe(all, wild)

	first, err := tb.SotW(Request{Set: set, Fresh: true})
	if err != nil || !slices.Equal(sotwNames(t, first), []string{"a", "b", "c"}) {
		t.Fatalf("first response: %v (%v), want a, b, c", sotwNames(t, first), err)
	}
	update(t, tb, map[string]types.Resource{"a": cla("a", 0), "b": cla("b", 1), "c": cla("c", 0), "d": cla("d", 0)})
	if abc.n != 1 || dOnly.n != 0 || all.n != 1 {
		t.Errorf("b changed: woken abc %d, d %d, wildcard %d times; want 1, 0, 1", abc.n, dOnly.n, all.n)
	}
	next, err := tb.SotW(Request{Set: set, From: first.To})
	if err != nil || !slices.Equal(sotwNames(t, next), []string{"b"}) {
		t.Errorf("after b changed: %v (%v), want b alone", sotwNames(t, next), err)
	}
	if next.Version == first.Version {
		t.Error("the content version did not change")
	}
	// A removal: SotW load assignments cannot say so; Delta can.
	update(t, tb, map[string]types.Resource{"a": cla("a", 0), "b": cla("b", 1), "d": cla("d", 0)})
	if r, _ := tb.SotW(Request{Set: set, From: next.To}); !r.Empty() {
		t.Errorf("SotW after c went: %v, want nothing", sotwNames(t, r))
	}
	names, removed := deltaNames(t, must(tb.Delta(Request{Set: set, From: next.To})))
	if len(names) != 0 || !slices.Equal(removed, []string{"c"}) {
		t.Errorf("Delta after c went: %v removed %v, want c removed", names, removed)
	}
	// Lockstep streams share one encoding.
	r1, r2 := must(tb.SotW(Request{Set: set, From: first.To})), must(tb.SotW(Request{Set: set, From: first.To}))
	if &r1.Body[0] != &r2.Body[0] {
		t.Error("two streams at the same version were encoded twice")
	}
}

func must(r Response, err error) Response {
	if err != nil {
		panic(err)
	}
	return r
}

// TestNewNamesAreSentAlone: a stream that subscribes to more names is sent
// the new ones (and what changed), not what it holds.
func TestNewNamesAreSentAlone(t *testing.T) {
	_, tb := edsTable(t, 64)
	update(t, tb, map[string]types.Resource{"a": cla("a", 0), "b": cla("b", 0), "c": cla("c", 0)})
	w := &counter{}
	ab := tb.Subscribe(w, []string{"a", "b"}, false)
	first := must(tb.SotW(Request{Set: ab, Fresh: true}))
	abc := tb.Subscribe(w, []string{"a", "b", "c"}, false)
	tb.Unsubscribe(w, ab)
	defer tb.Unsubscribe(w, abc)
	got := sotwNames(t, must(tb.SotW(Request{Set: abc, From: first.To, Fresh: true, Prev: ab})))
	if !slices.Equal(got, []string{"c"}) {
		t.Errorf("after subscribing to c: %v, want c alone", got)
	}
	names, _ := deltaNames(t, must(tb.Delta(Request{Set: abc, From: first.To, Fresh: true, Prev: ab})))
	if !slices.Equal(names, []string{"c"}) {
		t.Errorf("Delta after subscribing to c: %v, want c alone", names)
	}
}

// TestStreamBehindTheLogIsSentWhatItLacks: once the log no longer reaches
// a stream's version, the stream is answered from a scan.
func TestStreamBehindTheLogIsSentWhatItLacks(t *testing.T) {
	_, tb := edsTable(t, 1)
	w := &counter{}
	set := tb.Subscribe(w, []string{"a", "b"}, false)
	defer tb.Unsubscribe(w, set)
	update(t, tb, map[string]types.Resource{"a": cla("a", 0), "b": cla("b", 0)})
	first := must(tb.SotW(Request{Set: set, Fresh: true}))
	for i := range 5 {
		update(t, tb, map[string]types.Resource{"a": cla("a", uint32(i+1)), "b": cla("b", 0)})
	}
	if got := sotwNames(t, must(tb.SotW(Request{Set: set, From: first.To}))); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("behind the log: %v, want a and b", got)
	}
	// The content version, kept from the log or summed anew, is the same.
	v, _ := set.ContentVersion()
	_, fresh := edsTable(t, 1)
	update(t, fresh, map[string]types.Resource{"a": cla("a", 5), "b": cla("b", 0)})
	s2 := fresh.Subscribe(w, []string{"b", "a"}, false)
	if v2, _ := s2.ContentVersion(); v2 != v {
		t.Errorf("content version %s, another table with the same content %s", v, v2)
	}
}

// TestDeltaStreamBehindTheLogIsToldWhatWent: a Delta stream the log no
// longer reaches back to (one large removal trims it whole) is sent every
// resource and the names removed since its version (they were once left
// out: the stream kept a removed cluster for good).
func TestDeltaStreamBehindTheLogIsToldWhatWent(t *testing.T) {
	_, tb := edsTable(t, 2)
	w := &counter{}
	set := tb.Subscribe(w, nil, true)
	defer tb.Unsubscribe(w, set)
	all := map[string]types.Resource{"keep": cla("keep", 0), "old": cla("old", 0)}
	for i := range 10 {
		all[fmt.Sprintf("bulk-%d", i)] = cla("bulk", 0)
	}
	update(t, tb, all)
	first := must(tb.Delta(Request{Set: set, Fresh: true}))
	// "old" goes, then the bulk comes and goes: the log holds none of it.
	update(t, tb, map[string]types.Resource{"keep": cla("keep", 0)})
	update(t, tb, map[string]types.Resource{"keep": cla("keep", 1)})
	if from := first.To; from >= tb.floor {
		t.Fatalf("the log reaches back to version %d (floor %d): the test does not test what it says", from, tb.floor)
	}
	names, removed := deltaNames(t, must(tb.Delta(Request{Set: set, From: first.To})))
	slices.Sort(removed)
	if !slices.Equal(names, []string{"keep"}) || len(removed) != 11 || !slices.Contains(removed, "old") {
		t.Errorf("behind the log: resources %v, removed %v; want keep, and old and the 10 bulk names removed", names, removed)
	}
	// So is one that changes what it subscribes to meanwhile: told of
	// what it held that went.
	named := tb.Subscribe(w, []string{"keep"}, false)
	defer tb.Unsubscribe(w, named)
	names, removed = deltaNames(t, must(tb.Delta(Request{Set: named, Prev: set, Fresh: true, From: first.To})))
	if !slices.Equal(names, []string{"keep"}) || len(removed) != 11 || !slices.Contains(removed, "old") {
		t.Errorf("behind the log, subscribing anew: resources %v, removed %v; want keep, and old and the 10 bulk names removed", names, removed)
	}
	// A name that comes back is not removed.
	update(t, tb, map[string]types.Resource{"keep": cla("keep", 1), "old": cla("old", 1)})
	update(t, tb, map[string]types.Resource{"keep": cla("keep", 2), "old": cla("old", 1)})
	update(t, tb, map[string]types.Resource{"keep": cla("keep", 3), "old": cla("old", 1)})
	_, removed = deltaNames(t, must(tb.Delta(Request{Set: set, From: first.To})))
	if slices.Contains(removed, "old") {
		t.Errorf("old came back, and is still said removed: %v", removed)
	}
}

// TestSetsAreInterned: streams naming the same resources share one set,
// which is forgotten when the last stream goes.
func TestSetsAreInterned(t *testing.T) {
	_, tb := edsTable(t, 64)
	w1, w2 := &counter{}, &counter{}
	s1 := tb.Subscribe(w1, []string{"a", "b"}, false)
	s2 := tb.Subscribe(w2, []string{"b", "a", "a"}, false)
	if s1 != s2 {
		t.Fatal("the same names in another order made another set")
	}
	tb.Unsubscribe(w1, s1)
	tb.Unsubscribe(w2, s2)
	if len(tb.sets) != 0 {
		t.Errorf("%d sets remain after every stream went", len(tb.sets))
	}
}

// TestSetsHoldTheTablesNames: a new set holds the table's own string of
// each name a resource has, not the subscriber's copy, and the copy of a
// name none has.
func TestSetsHoldTheTablesNames(t *testing.T) {
	_, tb := edsTable(t, 64)
	update(t, tb, map[string]types.Resource{"a": &endpoint.ClusterLoadAssignment{ClusterName: "a"}})
	asked := []string{string([]byte("a")), string([]byte("made-up"))}
	s := tb.Subscribe(&counter{}, asked, false)
	for n := range s.names {
		switch n {
		case "a":
			if unsafe.StringData(n) != unsafe.StringData(tb.entries["a"].name) {
				t.Error("the set holds its subscriber's copy of a, not the table's")
			}
		case "made-up":
			if unsafe.StringData(n) != unsafe.StringData(asked[1]) {
				t.Error("a name no resource has was copied again")
			}
		}
	}
	if s.Bytes() != len("a")+len("made-up")+2*NameOverhead {
		t.Errorf("the set takes %d bytes, want its names' and their overhead", s.Bytes())
	}
}

// TestInvalidResourceKeepsTheLastValid: a resource that fails validation
// is not served, and its last valid version stays.
func TestInvalidResourceKeepsTheLastValid(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := New(Config{Classes: []Class{"a"}, Types: []string{resource.ClusterType}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	good := &cluster.Cluster{Name: "x", ConnectTimeout: durationpb.New(1e9)}
	bad := &cluster.Cluster{Name: "x", ConnectTimeout: durationpb.New(-1)}
	if _, _, _, err := c.Update("a", resource.ClusterType, map[string]types.Resource{"x": good}); err != nil {
		t.Fatal(err)
	}
	changed, removed, _, err := c.Update("a", resource.ClusterType, map[string]types.Resource{"x": bad, "y": &cluster.Cluster{Name: "y", ConnectTimeout: durationpb.New(-1)}})
	if err != nil || changed != 0 || removed != 0 {
		t.Errorf("invalid update: changed %d removed %d (%v), want nothing", changed, removed, err)
	}
	if held := c.Resources("a", resource.ClusterType); len(held) != 1 || held["x"] != good {
		t.Errorf("holds %v, want the last valid x alone", held)
	}
	if n := testutil.ToFloat64(c.invalid); n != 2 {
		t.Errorf("%v invalid resources counted, want 2", n)
	}
	// Handed over again, the same invalid object is not reported again.
	if _, _, _, err := c.Update("a", resource.ClusterType, map[string]types.Resource{"x": bad}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.ToFloat64(c.invalid); n != 2 {
		t.Errorf("%v invalid resources counted after the same object again, want still 2", n)
	}
}

// TestSubscribeExistingFindsOnlyTheSameNames: a set is found from raw
// names only when they are exactly its names.
func TestSubscribeExistingFindsOnlyTheSameNames(t *testing.T) {
	_, tb := edsTable(t, 64)
	w := &counter{}
	ab := tb.Subscribe(w, []string{"a", "b"}, false)
	defer tb.Unsubscribe(w, ab)
	raw := func(names ...string) func(func([]byte) bool) {
		return func(yield func([]byte) bool) {
			for _, n := range names {
				if !yield([]byte(n)) {
					return
				}
			}
		}
	}
	if s := tb.SubscribeExisting(w, FingerprintOf([]string{"b", "a"}), raw("b", "a")); s != ab {
		t.Fatalf("the same names in another order: %v, want the interned set", s)
	} else {
		tb.Unsubscribe(w, s)
	}
	for _, names := range [][]string{{"a"}, {"a", "c"}, {"a", "b", "c"}} {
		if s := tb.SubscribeExisting(w, FingerprintOf(names), raw(names...)); s != nil {
			t.Errorf("%v found a set (%v)", names, s)
		}
	}
}

// TestPatchChangesOnlyWhatItNames: a patch sets and removes the names it
// is given and leaves the others; the table's size and log agree with an
// Update to the same content.
func TestPatchChangesOnlyWhatItNames(t *testing.T) {
	_, tb := edsTable(t, 0)
	a, b, c := cla("a", 1), cla("b", 1), cla("c", 1)
	update(t, tb, map[string]types.Resource{"a": a, "b": b, "c": c})
	before := tb.version
	b2 := cla("b", 2)
	changed, removed, size, err := tb.Patch(map[string]types.Resource{"b": b2}, []string{"c", "nothing"})
	if err != nil || changed != 1 || removed != 1 {
		t.Fatalf("patch: changed %d removed %d err %v, want 1 and 1", changed, removed, err)
	}
	if got := tb.Resources(); len(got) != 2 || got["a"] != a || got["b"] != b2 {
		t.Fatalf("table holds %v, want a as it was and the new b", got)
	}
	var names []string
	for _, ch := range tb.log {
		if ch.version > before {
			names = append(names, ch.name)
		}
	}
	if slices.Sort(names); !slices.Equal(names, []string{"b", "c"}) {
		t.Errorf("logged %v after the patch, want b and c", names)
	}
	_, other := edsTable(t, 0)
	_, _, want, err := other.Update(map[string]types.Resource{"a": a, "b": b2})
	if err != nil || size != want {
		t.Errorf("size after the patch %d, want %d as an Update to the same content reports", size, want)
	}
	// Nothing to do: nothing changes.
	if changed, removed, _, _ := tb.Patch(map[string]types.Resource{"a": a}, []string{"c"}); changed+removed != 0 || tb.version != before+1 {
		t.Errorf("a patch to the same content changed %d, removed %d, moved the version to %d", changed, removed, tb.version)
	}
}

// TestSharedTypeNeedsTheClass: a class not added yet has no table of a
// shared type either (ErrNoClass, so that the stream asking for it adds
// the class); once added it gets the shared table.
func TestSharedTypeNeedsTheClass(t *testing.T) {
	c, err := New(Config{Types: []string{resource.ClusterType}, SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Table("a", resource.EndpointType); !errors.Is(err, ErrNoClass) {
		t.Fatalf("a class not added: %v, want ErrNoClass", err)
	}
	filled := false
	c.AddClass("a", func(Class) { filled = true })
	shared, err := c.Table(Shared, resource.EndpointType)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.Table("a", resource.EndpointType); err != nil || got != shared || !filled {
		t.Errorf("after AddClass: %p, %v (shared %p), filled %v", got, err, shared, filled)
	}
}

// TestAllButLeavesOutItsNamespaces: a set made by AllBut holds every name
// but those in its namespaces, told apart at the last '/' of the prefix.
func TestAllButLeavesOutItsNamespaces(t *testing.T) {
	s := AllBut([]string{"80", "http.8080"})
	for name, want := range map[string]bool{
		"80/db.data.svc.cluster.local:80": false, "http.8080/shop.example.com": false,
		"8080/db.data.svc.cluster.local:8080": true, "80": true, "800/x": true, "http.8080": true,
	} {
		if got := s.Has(name); got != want {
			t.Errorf("Has(%q) = %v, want %v", name, got, want)
		}
	}
}

// TestDeltaResponsesPastTheLimitLeaveTheRest: a Delta response past its
// limit carries part of the names and leaves the rest for the next, which
// carries the changes made meanwhile first, smallest change first; the
// responses together bring everything, and a response within the limit
// leaves nothing.
func TestDeltaResponsesPastTheLimitLeaveTheRest(t *testing.T) {
	_, tb := edsTable(t, 64)
	w := &counter{}
	set := tb.Subscribe(w, nil, true)
	defer tb.Unsubscribe(w, set)
	all := map[string]types.Resource{"small": cla("small", 0)}
	update(t, tb, all)
	first := must(tb.Delta(Request{Set: set, Fresh: true, Limit: 1 << 20}))
	if len(first.Rest) != 0 {
		t.Fatalf("a response within the limit left %v", first.Rest)
	}
	// A bulk of 100 arrives; each response carries about ten.
	for i := range 100 {
		all[fmt.Sprintf("bulk-%03d", i)] = cla("bulk", 1)
	}
	update(t, tb, all)
	limit := 10 * tb.sizeOf("bulk-000")
	part := must(tb.Delta(Request{Set: set, From: first.To, Limit: limit}))
	got, _ := deltaNames(t, part)
	if len(got) == 0 || len(got)+len(part.Rest) != 100 || len(got) > 10 {
		t.Fatalf("first part: %d names, %d left; want at most 10 of the 100, the rest left", len(got), len(part.Rest))
	}
	// A small change made meanwhile goes first in the next, before the
	// bulk's rest, and before a second bulk made after it.
	all["small"] = cla("small", 1)
	update(t, tb, all)
	for i := range 20 {
		all[fmt.Sprintf("more-%02d", i)] = cla("more", 1)
	}
	update(t, tb, all)
	next := must(tb.Delta(Request{Set: set, From: part.To, Limit: limit, Owed: part.Rest}))
	names, _ := deltaNames(t, next)
	if !slices.Contains(names, "small") {
		t.Fatalf("the small change is not in the next response: %v", names)
	}
	seen := map[string]bool{}
	for _, n := range got {
		seen[n] = true
	}
	for resp := next; ; {
		names, _ := deltaNames(t, resp)
		for _, n := range names {
			seen[n] = true
		}
		if len(resp.Rest) == 0 {
			break
		}
		resp = must(tb.Delta(Request{Set: set, From: resp.To, Limit: limit, Owed: resp.Rest}))
	}
	if len(seen) != len(all) {
		t.Errorf("the parts brought %d names, want the table's %d", len(seen), len(all))
	}
}
