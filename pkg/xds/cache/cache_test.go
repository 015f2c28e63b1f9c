package cache

import (
	"slices"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestUpdateReplacesOnlyWhatChanged(t *testing.T) {
	c, err := New(Config{Classes: []Class{"a"}, Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	cl := func(name string, ms int64) types.Resource {
		return &cluster.Cluster{Name: name, LbPolicy: cluster.Cluster_LbPolicy(ms)}
	}
	steps := []struct {
		res                  map[string]types.Resource
		wantChanged, wantDel int
	}{
		{map[string]types.Resource{"x": cl("x", 0), "y": cl("y", 0)}, 2, 0},
		{map[string]types.Resource{"x": cl("x", 0), "y": cl("y", 0)}, 0, 0},
		{map[string]types.Resource{"x": cl("x", 1), "y": cl("y", 0)}, 1, 0},
		{map[string]types.Resource{"x": cl("x", 1)}, 0, 1},
	}
	for i, s := range steps {
		changed, removed, _, err := c.Update("a", resource.ClusterType, s.res)
		if err != nil || changed != s.wantChanged || removed != s.wantDel {
			t.Errorf("step %d: changed %d removed %d (%v), want %d and %d", i, changed, removed, err, s.wantChanged, s.wantDel)
		}
	}
	if got := c.Resources("a", resource.ClusterType); len(got) != 1 {
		t.Errorf("cache holds %d resources, want 1", len(got))
	}
	// A class the cache does not hold (dropped while it was generated) is
	// nothing to update, and is not added by it.
	if changed, _, _, err := c.Update("b", resource.ClusterType, map[string]types.Resource{"x": cla("x", 1)}); err != nil || changed != 0 || slices.Contains(c.Classes(), "b") {
		t.Errorf("update of a class not held: changed %d, %v, classes %v", changed, err, c.Classes())
	}
}

func TestUpdateReportsSizeAndKeepsUnchangedObjects(t *testing.T) {
	c, err := New(Config{Classes: []Class{"a"}, Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	x := &cluster.Cluster{Name: "x"}
	_, _, first, err := c.Update("a", resource.ClusterType, map[string]types.Resource{"x": x})
	if err != nil || first == 0 {
		t.Fatalf("size %d, err %v", first, err)
	}
	// The same object again, and an equal copy: no change, the same size.
	for _, r := range []types.Resource{x, &cluster.Cluster{Name: "x"}} {
		changed, _, size, err := c.Update("a", resource.ClusterType, map[string]types.Resource{"x": r})
		if err != nil || changed != 0 || size != first {
			t.Errorf("resubmitted: changed %d size %d (%v), want 0 and %d", changed, size, err, first)
		}
	}
}

// Two replicas that reach the same content by different histories send it
// under the same version; their table versions differ.
func TestResponseVersionsAreContentHashes(t *testing.T) {
	newCache := func() *Cache {
		c, err := New(Config{Classes: []Class{"a"}, Types: []string{resource.ClusterType}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	x, y := &cluster.Cluster{Name: "x"}, &cluster.Cluster{Name: "y"}
	one, two := newCache(), newCache()
	mustUpdate := func(c *Cache, res map[string]types.Resource) {
		if _, _, _, err := c.Update("a", resource.ClusterType, res); err != nil {
			t.Fatal(err)
		}
	}
	mustUpdate(one, map[string]types.Resource{"x": x, "y": y})
	mustUpdate(two, map[string]types.Resource{"x": x})
	mustUpdate(two, map[string]types.Resource{"x": x, "y": &cluster.Cluster{Name: "y", LbPolicy: 1}})
	mustUpdate(two, map[string]types.Resource{"x": x, "y": y})

	version := func(c *Cache, names ...string) string {
		tb, err := c.Table("a", resource.ClusterType)
		if err != nil {
			t.Fatal(err)
		}
		w := &counter{}
		s := tb.Subscribe(w, names, len(names) == 0)
		defer tb.Unsubscribe(w, s)
		v, _ := s.ContentVersion()
		r, err := tb.SotW(Request{Set: s, Fresh: true})
		if err != nil || r.Version != v {
			t.Fatalf("response version %s (%v), content version %s", r.Version, err, v)
		}
		return v
	}
	if v1, v2 := version(one), version(two); v1 != v2 {
		t.Errorf("equal content, versions %s and %s", v1, v2)
	}
	if v1, v2 := version(one, "x"), version(one); v1 == v2 {
		t.Errorf("a subscription to x alone has the version of the whole set, %s", v1)
	}
	if v1, v2 := version(one, "x", "y"), version(one); v1 != v2 {
		t.Errorf("naming every resource: version %s, the wildcard's %s", v1, v2)
	}
}

type counter struct{ n int }

func (c *counter) Notify() { c.n++ }

// TestReuseSharesEncodings: a cache told to reuse another's shared tables
// takes their encoding of the same object instead of encoding it again,
// and encodes its own objects itself.
func TestReuseSharesEncodings(t *testing.T) {
	shared, err := New(Config{SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	local, err := New(Config{Classes: []Class{"r/z/"}, Types: []string{resource.EndpointType}, Reuse: shared})
	if err != nil {
		t.Fatal(err)
	}
	same := &endpoint.ClusterLoadAssignment{ClusterName: "a"}
	if _, _, _, err := shared.Update(Shared, resource.EndpointType, map[string]types.Resource{"a": same}); err != nil {
		t.Fatal(err)
	}
	own := &endpoint.ClusterLoadAssignment{ClusterName: "a", Endpoints: []*endpoint.LocalityLbEndpoints{{Priority: 0}}}
	for _, r := range []types.Resource{same, own} {
		if _, _, _, err := local.Update("r/z/", resource.EndpointType, map[string]types.Resource{"a": r}); err != nil {
			t.Fatal(err)
		}
		st, _ := shared.Table(Shared, resource.EndpointType)
		lt, _ := local.Table("r/z/", resource.EndpointType)
		if reused := st.entries["a"].any == lt.entries["a"].any; reused != (r == same) {
			t.Errorf("encoding reused: %v, want %v", reused, r == same)
		}
	}
}

// TestClassesShareAnObjectsEncoding: an object one class's table holds is
// neither checked nor encoded again for another class's (its encoding is
// the first table's); under another name it is encoded anew; an object no
// table holds any more, replaced, removed or in a dropped class's table,
// is let go.
func TestClassesShareAnObjectsEncoding(t *testing.T) {
	c, err := New(Config{Classes: []Class{"a", "b"}, Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	c.AddClass("c", nil)
	same := &cluster.Cluster{Name: "x", ConnectTimeout: durationpb.New(time.Second)}
	for _, class := range []Class{"a", "b", "c"} {
		if _, _, _, err := c.Update(class, resource.ClusterType, map[string]types.Resource{"x": same, "y": same}); err != nil {
			t.Fatal(err)
		}
	}
	a, _ := c.Table("a", resource.ClusterType)
	b, _ := c.Table("b", resource.ClusterType)
	for _, name := range []string{"x", "y"} {
		if a.entries[name].any != b.entries[name].any || b.entries[name].res != same {
			t.Errorf("class b encoded the object class a holds under %s again", name)
		}
	}
	if a.entries["x"].any == a.entries["y"].any {
		t.Error("the object under another name has the first name's entry")
	}
	equal := &cluster.Cluster{Name: "x", ConnectTimeout: durationpb.New(time.Second)}
	if _, _, _, err := c.Update("a", resource.ClusterType, map[string]types.Resource{"x": equal}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update("b", resource.ClusterType, map[string]types.Resource{}); err != nil {
		t.Fatal(err)
	}
	if n := c.check.objectsHeld(); n != 3 {
		t.Errorf("%d objects held by name, want 3 (the first under x and y, in class c; the equal one under x, in class a)", n)
	}
	c.RemoveClass("c")
	if _, _, _, err := c.Update("a", resource.ClusterType, map[string]types.Resource{}); err != nil {
		t.Fatal(err)
	}
	if n := c.check.objectsHeld(); n != 0 {
		t.Errorf("%d objects held after every table let them go", n)
	}
}
