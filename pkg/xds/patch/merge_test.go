package patch

import (
	"math/rand/v2"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

func mergePatch(t *testing.T, match *meshv1.PatchMatch, v map[string]any) *meshv1.EnvoyPatch {
	t.Helper()
	value, err := structpb.NewStruct(v)
	if err != nil {
		t.Fatal(err)
	}
	return &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_CLUSTER, Operation: meshv1.EnvoyPatch_OPERATION_MERGE, Match: match, Value: value}
}

func testClusters() []*cluster.Cluster {
	var out []*cluster.Cluster
	for _, name := range []string{"outbound|80||a.ns", "outbound|80|v1|a.ns", "outbound|9090||b.ns", "inbound|8080||"} {
		out = append(out, &cluster.Cluster{Name: name, ConnectTimeout: durationpb.New(1e9), ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS}})
	}
	return out
}

// TestMergedTogetherAsInTurn: merges applied together, their values merged
// into one first, make what applying them one after the other makes, for
// random sequences of values of every kind of field a merge treats apart
// (scalars, durations replaced whole, lists appended, maps, oneofs,
// nested messages, Anys replaced whole) and matches that take some
// clusters and not others.
func TestMergedTogetherAsInTurn(t *testing.T) {
	values := []map[string]any{
		{"connect_timeout": "2s"},
		{"connect_timeout": "0.5s"},
		{"per_connection_buffer_limit_bytes": 1024},
		{"per_connection_buffer_limit_bytes": 4096},
		{"circuit_breakers": map[string]any{"thresholds": []any{map[string]any{"max_connections": 10}}}},
		{"circuit_breakers": map[string]any{"thresholds": []any{map[string]any{"max_requests": 7, "priority": "HIGH"}}}},
		{"metadata": map[string]any{"filter_metadata": map[string]any{"a": map[string]any{"k": "v"}}}},
		{"metadata": map[string]any{"filter_metadata": map[string]any{"a": map[string]any{"k": "w"}, "b": map[string]any{}}}},
		{"type": "STRICT_DNS"},
		{"type": "EDS"},
		{"least_request_lb_config": map[string]any{"choice_count": 3}},
		{"round_robin_lb_config": map[string]any{}},
		{"common_lb_config": map[string]any{"healthy_panic_threshold": map[string]any{"value": 10}}},
		{"common_lb_config": map[string]any{"update_merge_window": "3s"}},
		{"upstream_connection_options": map[string]any{"tcp_keepalive": map[string]any{"keepalive_probes": 3}}},
		{"upstream_connection_options": map[string]any{"tcp_keepalive": map[string]any{"keepalive_time": 30}}},
		{"transport_socket": map[string]any{"name": "envoy.transport_sockets.raw_buffer",
			"typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}},
		{"dns_lookup_family": "V4_ONLY"},
	}
	matches := []*meshv1.PatchMatch{nil, {ClusterPort: 80}, {ClusterSubset: "v1"}, {ClusterService: "b.ns"}, {ClusterName: "inbound|8080||"}}
	rng := rand.New(rand.NewPCG(1, 2))
	for run := range 300 {
		var patches []*meshv1.EnvoyPatch
		for range 1 + rng.IntN(10) {
			p := mergePatch(t, matches[rng.IntN(len(matches))], values[rng.IntN(len(values))])
			p.Context = meshv1.EnvoyPatch_Context(rng.IntN(3)) // any, gateway or sidecar inbound
			patches = append(patches, p)
		}
		filters := []*Filter{{Namespace: "ns", Name: "f", Spec: &meshv1.EnvoyFilter{Patches: patches}}}
		for _, router := range []bool{false, true} {
			together := NewSet(filters, nil)
			got := together.Clusters(testClusters(), router)
			inTurn := NewSet(filters, nil)
			want := inTurn.clustersInTurn(testClusters(), inTurn.of(meshv1.EnvoyPatch_APPLY_TO_CLUSTER), router)
			if len(together.Refusals())+len(inTurn.Refusals()) != 0 {
				t.Fatalf("run %d: refusals %v and %v: every value is valid alone", run, together.Refusals(), inTurn.Refusals())
			}
			for i := range want {
				if !proto.Equal(got[i], want[i]) {
					t.Fatalf("run %d (router %v), patches %v:\ntogether %v\nin turn  %v", run, router, patches, got[i], want[i])
				}
			}
		}
	}
}

// TestMergesTakenApartOnlyWhenInvalid: a merge whose value is invalid in
// itself is refused whole, the others apply; merges whose values are valid
// apply together when their result is, even when one alone would leave a
// part of the cluster incomplete that another completes (a load assignment
// without its name); where the result is invalid, the merge that makes it
// so is refused and the others apply.
func TestMergesTakenApartOnlyWhenInvalid(t *testing.T) {
	negative := mergePatch(t, nil, map[string]any{"connect_timeout": "-1s", "lb_policy": "MAGLEV"})
	fixed := mergePatch(t, nil, map[string]any{"connect_timeout": "3s"})
	buffer := mergePatch(t, nil, map[string]any{"per_connection_buffer_limit_bytes": 2048})
	named := mergePatch(t, nil, map[string]any{"load_assignment": map[string]any{"cluster_name": "a"}})
	half := mergePatch(t, nil, map[string]any{"load_assignment": map[string]any{"policy": map[string]any{"overprovisioning_factor": 150}}})
	merged := func(patches ...*meshv1.EnvoyPatch) (*cluster.Cluster, []Refusal) {
		s := NewSet([]*Filter{{Namespace: "ns", Name: "f", Spec: &meshv1.EnvoyFilter{Patches: patches}}}, nil)
		return s.Clusters(testClusters()[:1], false)[0], s.Refusals()
	}

	got, refused := merged(negative, fixed)
	if got.GetConnectTimeout().AsDuration().Seconds() != 3 || got.GetLbPolicy() == cluster.Cluster_MAGLEV ||
		len(refused) != 1 || refused[0].Patch != "spec.configPatches[0]" || refused[0].Resource != "any cluster" ||
		!strings.Contains(refused[0].Reason, "ConnectTimeout") || strings.Contains(refused[0].Reason, "Name") {
		t.Errorf("cluster %v, refusals %v: want the negative timeout's patch refused whole (its reason the timeout alone), the next applied", got, refused)
	}
	got, refused = merged(half, named)
	if got.GetLoadAssignment().GetClusterName() != "a" || got.GetLoadAssignment().GetPolicy() == nil || len(refused) != 0 {
		t.Errorf("cluster %v, refusals %v: want both halves of the load assignment, nothing refused", got, refused)
	}
	got, refused = merged(buffer, half)
	if got.GetPerConnectionBufferLimitBytes().GetValue() != 2048 || got.GetLoadAssignment() != nil ||
		len(refused) != 1 || refused[0].Patch != "spec.configPatches[1]" || !strings.Contains(refused[0].Reason, "would be invalid") {
		t.Errorf("cluster %v, refusals %v: want the buffer merged, the load assignment without its name refused", got, refused)
	}
}

// TestMergesAfterTheirAddsAndRenames: a merge takes a cluster an ADD
// brought only after the ADD; a merge that renames a cluster makes the
// patches after it match the new name.
func TestMergesAfterTheirAddsAndRenames(t *testing.T) {
	add := func(name string) *meshv1.EnvoyPatch {
		p := mergePatch(t, nil, map[string]any{"name": name, "connect_timeout": "1s", "type": "STATIC"})
		p.Operation = meshv1.EnvoyPatch_OPERATION_ADD
		return p
	}
	before := mergePatch(t, &meshv1.PatchMatch{ClusterName: "extra"}, map[string]any{"per_connection_buffer_limit_bytes": 1})
	after := mergePatch(t, &meshv1.PatchMatch{ClusterName: "extra"}, map[string]any{"dns_lookup_family": "V4_ONLY"})
	s := NewSet([]*Filter{{Namespace: "ns", Name: "f", Spec: &meshv1.EnvoyFilter{Patches: []*meshv1.EnvoyPatch{before, add("extra"), after}}}}, nil)
	got := s.Clusters(testClusters(), false)
	extra := got[len(got)-1]
	if extra.GetName() != "extra" || extra.GetPerConnectionBufferLimitBytes() != nil || extra.GetDnsLookupFamily() != cluster.Cluster_V4_ONLY {
		t.Errorf("added cluster %v: want the merge after the ADD alone", extra)
	}

	rename := mergePatch(t, &meshv1.PatchMatch{ClusterName: "outbound|9090||b.ns"}, map[string]any{"name": "renamed"})
	renamed := mergePatch(t, &meshv1.PatchMatch{ClusterName: "renamed"}, map[string]any{"per_connection_buffer_limit_bytes": 5})
	s = NewSet([]*Filter{{Namespace: "ns", Name: "f", Spec: &meshv1.EnvoyFilter{Patches: []*meshv1.EnvoyPatch{rename, renamed}}}}, nil)
	got = s.Clusters(testClusters(), false)
	if got[2].GetName() != "renamed" || got[2].GetPerConnectionBufferLimitBytes().GetValue() != 5 {
		t.Errorf("cluster %v: want it renamed, then merged by its new name", got[2])
	}
}

// TestMergedClusterKept: with a Decoded, a cluster merged with the same
// patches is the same object for another class and the next generation
// (the tables skip it), its refusals told again; a changed EnvoyFilter, or
// a generation that did not ask, merges anew.
func TestMergedClusterKept(t *testing.T) {
	in := testClusters()
	spec := func(timeout string) *meshv1.EnvoyFilter {
		return &meshv1.EnvoyFilter{Patches: []*meshv1.EnvoyPatch{
			mergePatch(t, nil, map[string]any{"per_connection_buffer_limit_bytes": 2048}),
			mergePatch(t, nil, map[string]any{"connect_timeout": timeout}),
			// A load assignment without its name: refused for each cluster.
			mergePatch(t, nil, map[string]any{"load_assignment": map[string]any{"policy": map[string]any{"overprovisioning_factor": 150}}}),
		}}
	}
	filters := []*Filter{{Namespace: "istio-system", Name: "f", Root: true, Spec: spec("3s")}}
	var d Decoded
	first := d.NewSet(filters, nil)
	a := first.Clusters(in, false)
	other := d.NewSet(filters, nil) // another class
	b := other.Clusters(in, false)
	d.Sweep()
	next := d.NewSet(filters, nil) // the next generation
	c := next.Clusters(in, false)
	for i := range in {
		if a[i] == in[i] || a[i] != b[i] || b[i] != c[i] {
			t.Fatalf("cluster %s: want one merged object for both classes and generations", in[i].Name)
		}
	}
	for _, s := range []*Set{first, other, next} {
		if len(s.Refusals()) != len(in) {
			t.Errorf("refusals %v: want the nameless load assignment's, for each cluster", s.Refusals())
		}
	}
	if a := d.NewSet(filters, nil).Clusters(in, true); a[0] == c[0] {
		t.Error("a gateway's cluster is the sidecar's: a context may differ")
	}

	changed := []*Filter{{Namespace: "istio-system", Name: "f", Root: true, Spec: spec("2s")}}
	if a[0].GetConnectTimeout().AsDuration().Seconds() != 3 {
		t.Errorf("merged cluster %v: want the timeout merged", a[0])
	}
	if got := d.NewSet(changed, nil).Clusters(in, false); got[0] == c[0] || got[0].GetConnectTimeout().AsDuration().Seconds() != 2 {
		t.Errorf("changed EnvoyFilter: got %v, the same object: want it merged anew", got[0])
	}
	d.Sweep()
	d.Sweep()
	if n := d.merged.len(); n != 0 {
		t.Errorf("kept %d merged clusters no generation asked for", n)
	}
}
