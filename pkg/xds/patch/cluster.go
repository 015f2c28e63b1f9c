package patch

import (
	"slices"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/envoypatch"
	"google.golang.org/protobuf/proto"
)

// Clusters applies the CLUSTER patches to a class's clusters; the clusters
// given are not modified (they may be shared with other classes).
//
// A cluster's MERGEs apply together, after the ADDs and REMOVEs that
// decide which clusters there are: a merge changes its own cluster alone,
// unless it renames it, and then every patch applies in turn. A merge
// whose value is invalid in itself was refused whole (NewSet). The values
// of the merges that take a cluster are merged into one, once for the
// clusters they all take (a merge is associative: merging a then b is
// merging a merged with b), and the result is checked once, as Envoy
// would take it whole; only a result Envoy would reject (a value that
// completes a part of the cluster only with another's) is taken apart,
// each merge applied in turn and refused where it would make the cluster
// invalid. With a Decoded, a cluster merged with the same patches before
// (by another class, or the generation before) is the same object again.
func (s *Set) Clusters(in []*cluster.Cluster, router bool) []*cluster.Cluster {
	patches := s.of(meshv1.EnvoyPatch_APPLY_TO_CLUSTER)
	if len(patches) == 0 {
		return in
	}
	if slices.ContainsFunc(patches, renames) {
		return s.clustersInTurn(in, patches, router)
	}
	// since[i] is the first patch that may merge into out[i]: the one
	// after the ADD that brought it.
	out := slices.Clone(in)
	since := make([]int, len(out))
	for i, b := range patches {
		switch b.p.Operation {
		case meshv1.EnvoyPatch_OPERATION_ADD:
			if out = added(s, b, "cluster", out, router); len(out) > len(since) {
				since = append(since, i+1)
			}
		case meshv1.EnvoyPatch_OPERATION_REMOVE:
			kept := 0
			for j, c := range out {
				if !clusterMatches(b.p, c.Name, router) {
					out[kept], since[kept] = c, since[j]
					kept++
				}
			}
			out, since = out[:kept], since[:kept]
		}
	}
	m := merger{set: s, list: s.memo.listOf(patches), router: router}
	for i, c := range out {
		if since[i] > 0 {
			// Added: a new object every time, not kept.
			out[i] = m.merged(c, patches[since[i]:], false)
		} else {
			out[i] = m.merged(c, patches, true)
		}
	}
	return out
}

// merger merges the CLUSTER patches of one class into its clusters.
type merger struct {
	set *Set
	// list is the class's CLUSTER patches, the key of what the set's
	// Decoded keeps.
	list   *patchList
	router bool
	// values are the merges' values merged into one, by their patches'
	// hash.
	values map[uint64][]mergedValue
}

// mergedValue is the values of merges merged into one.
type mergedValue struct {
	merges []bound
	value  *cluster.Cluster
}

// merged returns a cluster with the merges among patches that take it
// applied (see Clusters), and gathers their refusals; once per cluster and
// list of the class's CLUSTER patches (which decides the merges) while the
// Decoded keeps them, unless told not to keep it.
func (m *merger) merged(c *cluster.Cluster, patches []bound, keep bool) *cluster.Cluster {
	s := m.set
	list := m.list
	if !keep {
		list = nil
	}
	if done, ok := s.memo.mergedCluster(c, list, m.router); ok {
		s.refusals = append(s.refusals, done.refusals...)
		return done.out
	}
	var merges []bound
	for _, b := range patches {
		if b.p.Operation == meshv1.EnvoyPatch_OPERATION_MERGE && clusterMatches(b.p, c.Name, m.router) {
			merges = append(merges, b)
		}
	}
	if len(merges) == 0 {
		return c
	}
	out := proto.CloneOf(c)
	merge(out, m.value(merges))
	mark := len(s.refusals)
	if envoypatch.Valid(out) != nil {
		out = c
		for _, b := range merges {
			out = patched(s, b, "cluster "+c.Name, out, mergeCluster(b))
		}
	}
	s.memo.keepCluster(c, mergedCluster{list: list, router: m.router, out: out, refusals: slices.Clone(s.refusals[mark:])})
	return out
}

// value returns the merges' values merged into one, once for the clusters
// the same merges take.
func (m *merger) value(merges []bound) *cluster.Cluster {
	if len(merges) == 1 {
		return merges[0].value.(*cluster.Cluster)
	}
	sum := hashPatches(merges)
	for _, v := range m.values[sum] {
		if slices.EqualFunc(v.merges, merges, func(a, b bound) bool { return a.p == b.p }) {
			return v.value
		}
	}
	value := &cluster.Cluster{}
	for _, b := range merges {
		merge(value, b.value)
	}
	if m.values == nil {
		m.values = map[uint64][]mergedValue{}
	}
	m.values[sum] = append(m.values[sum], mergedValue{merges, value})
	return value
}

// renames reports whether a patch merges a name into clusters: the
// patches after it match the cluster by its new name.
func renames(b bound) bool {
	c, ok := b.value.(*cluster.Cluster)
	return ok && b.p.Operation == meshv1.EnvoyPatch_OPERATION_MERGE && c.GetName() != ""
}

// clustersInTurn applies the patches one after the other, each merge
// checked on its own.
func (s *Set) clustersInTurn(in []*cluster.Cluster, patches []bound, router bool) []*cluster.Cluster {
	out := slices.Clone(in)
	for _, b := range patches {
		switch b.p.Operation {
		case meshv1.EnvoyPatch_OPERATION_ADD:
			out = added(s, b, "cluster", out, router)
		case meshv1.EnvoyPatch_OPERATION_REMOVE:
			out = slices.DeleteFunc(out, func(c *cluster.Cluster) bool { return clusterMatches(b.p, c.Name, router) })
		case meshv1.EnvoyPatch_OPERATION_MERGE:
			for i, c := range out {
				if clusterMatches(b.p, c.Name, router) {
					out[i] = patched(s, b, "cluster "+c.Name, c, mergeCluster(b))
				}
			}
		}
	}
	return out
}

func mergeCluster(b bound) func(*cluster.Cluster) error {
	return func(c *cluster.Cluster) error { merge(c, b.value); return nil }
}

// clusterMatches reports whether a patch's context and cluster match take
// a cluster, by its name ("outbound|<port>|<subset>|<host>").
func clusterMatches(p *meshv1.EnvoyPatch, name string, router bool) bool {
	if !contextMatches(p.Context, router, strings.HasPrefix(name, "inbound|")) {
		return false
	}
	m := p.Match
	if m.GetClusterName() != "" && m.GetClusterName() != name {
		return false
	}
	if m.GetClusterService() != "" || m.GetClusterSubset() != "" {
		_, rest, _ := strings.Cut(name, "|")
		_, rest, ok := strings.Cut(rest, "|")
		subset, service, ok2 := strings.Cut(rest, "|")
		if !ok || !ok2 || (m.GetClusterService() != "" && service != m.GetClusterService()) ||
			(m.GetClusterSubset() != "" && subset != m.GetClusterSubset()) {
			return false
		}
	}
	return m.GetClusterPort() == 0 || portOf(name) == m.GetClusterPort()
}
