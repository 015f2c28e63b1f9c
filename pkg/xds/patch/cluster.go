package patch

import (
	"slices"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// Clusters applies the CLUSTER patches to a class's clusters; the clusters
// given are not modified (they may be shared with other classes).
func (s *Set) Clusters(in []*cluster.Cluster, router bool) []*cluster.Cluster {
	patches := s.of(meshv1.EnvoyPatch_APPLY_TO_CLUSTER)
	if len(patches) == 0 {
		return in
	}
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
					out[i] = patched(s, b, "cluster "+c.Name, c, func(c *cluster.Cluster) error { merge(c, b.value); return nil })
				}
			}
		}
	}
	return out
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
	parts := strings.SplitN(name, "|", 4)
	if m.GetClusterService() != "" || m.GetClusterSubset() != "" {
		if len(parts) != 4 || (m.GetClusterService() != "" && parts[3] != m.GetClusterService()) ||
			(m.GetClusterSubset() != "" && parts[2] != m.GetClusterSubset()) {
			return false
		}
	}
	return m.GetClusterPort() == 0 || portOf(name) == m.GetClusterPort()
}
