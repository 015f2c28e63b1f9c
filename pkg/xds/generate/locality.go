package generate

import (
	"maps"
	"math"
	"slices"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// LocalityAware reports whether the load assignment of a cluster with this
// (effective) policy depends on the locality of the proxy, as in Istio: its
// locality setting is not disabled, and it distributes by locality or the
// cluster has outlier detection (without which failing over never happens).
func LocalityAware(policy *meshv1.TrafficPolicy) bool {
	lb := policy.GetLocalityLb()
	if lb.GetDisabled() {
		return false
	}
	return len(lb.GetDistribute()) > 0 || policy.GetOutlierDetection() != nil
}

// localityWeighted reports whether an Envoy's cluster under policy weighs
// its localities (locality_weighted_lb_config), where istiod has it: the
// policy distributes, or fails over (with outlier detection) to named
// regions; with a hash ring too, which then ignores it.
func localityWeighted(policy *meshv1.TrafficPolicy) bool {
	lb := policy.GetLocalityLb()
	if lb.GetDisabled() {
		return false
	}
	return len(lb.GetDistribute()) > 0 || (policy.GetOutlierDetection() != nil && len(lb.GetFailover()) > 0)
}

// LocalityName is the name of a locality, "region/zone/subzone"; "" for
// none, or for one that cannot be named so (a part holding a "/").
func LocalityName(l *core.Locality) string {
	r, z, sz := l.GetRegion(), l.GetZone(), l.GetSubZone()
	if r+z+sz == "" || strings.Contains(r+z+sz, "/") {
		return ""
	}
	return r + "/" + z + "/" + sz
}

// ParseLocality is the locality LocalityName names.
func ParseLocality(name string) *core.Locality {
	parts := append(strings.SplitN(name, "/", 3), "", "")
	return &core.Locality{Region: parts[0], Zone: parts[1], SubZone: parts[2]}
}

// LocalityLoadAssignments returns the assignments of one service's clusters
// as a proxy in locality sees them. shared is ServiceLoadAssignments of the
// service: the assignment of a cluster that is not LocalityAware is the
// shared one itself (the same object); the others are copies with Istio's
// locality priorities or weights. They depend on the service and the
// locality alone, so every proxy of a locality shares them.
func LocalityLoadAssignments(s *Service, shared []*endpoint.ClusterLoadAssignment, locality *core.Locality) []*endpoint.ClusterLoadAssignment {
	out := make([]*endpoint.ClusterLoadAssignment, 0, len(shared))
	for _, cla := range shared {
		// The cluster's name says its port and subset, whose policy applies.
		_, port, subset, _ := ParseClusterName(cla.ClusterName)
		out = append(out, localize(cla, effectivePolicy(s.Policy, s.subset(subset), port), locality))
	}
	return out
}

// localize returns the assignment as a proxy in locality sees it under the
// policy: Istio's distribute weights when one of its rules is for the
// proxy's locality, else failover priorities (its subzone first, then its
// zone, its region, the region it fails over to, the rest).
func localize(cla *endpoint.ClusterLoadAssignment, policy *meshv1.TrafficPolicy, locality *core.Locality) *endpoint.ClusterLoadAssignment {
	if !LocalityAware(policy) || LocalityName(locality) == "" || len(cla.Endpoints) == 0 {
		return cla
	}
	out := proto.CloneOf(cla)
	lb := policy.GetLocalityLb()
	if len(lb.GetDistribute()) > 0 {
		for _, d := range lb.Distribute {
			if localityMatch(locality, d.From) {
				distribute(out, d)
				return out
			}
		}
		return cla // no rule for the proxy's locality: as without them
	}
	priorities := make([]int, len(out.Endpoints))
	for i, group := range out.Endpoints {
		priorities[i] = failoverPriority(locality, group.Locality, lb.GetFailover())
	}
	// Priorities are consecutive from 0: the distinct ones, in order.
	levels := slices.Compact(slices.Sorted(slices.Values(priorities)))
	for i, group := range out.Endpoints {
		group.Priority = uint32(slices.Index(levels, priorities[i]))
	}
	return out
}

// failoverPriority is Istio's priority of endpoints in ep for a proxy in
// proxy: 0 same subzone, 1 same zone, 2 same region, 3 the region the
// proxy's fails over to (or any other region when none is named), 4 the
// other regions.
func failoverPriority(proxy, ep *core.Locality, failover []*meshv1.LocalityLb_Failover) int {
	switch {
	case proxy.GetRegion() != ep.GetRegion():
		for _, f := range failover {
			if f.From == proxy.GetRegion() {
				if ep.GetRegion() != f.To {
					return 4
				}
				break
			}
		}
		return 3
	case proxy.GetZone() != ep.GetZone():
		return 2
	case proxy.GetSubZone() != ep.GetSubZone():
		return 1
	}
	return 0
}

// distribute gives each locality group the share of its rule's
// destination it matches (split among the groups that match one
// destination by their weights), and drops the groups no destination
// matches, as Istio does.
func distribute(cla *endpoint.ClusterLoadAssignment, d *meshv1.LocalityLb_Distribute) {
	unmatched := make([]bool, len(cla.Endpoints))
	for i := range unmatched {
		unmatched[i] = true
	}
	for _, to := range slices.Sorted(maps.Keys(d.To)) {
		var total uint32
		var matched []int
		for i, group := range cla.Endpoints {
			if unmatched[i] && localityMatch(group.Locality, to) {
				unmatched[i] = false
				matched = append(matched, i)
				total += max(group.GetLoadBalancingWeight().GetValue(), 1)
			}
		}
		for _, i := range matched {
			w := max(cla.Endpoints[i].GetLoadBalancingWeight().GetValue(), 1)
			cla.Endpoints[i].LoadBalancingWeight = wrapperspb.UInt32(uint32(math.Ceil(float64(w) * float64(d.To[to]) / float64(total))))
		}
	}
	kept := cla.Endpoints[:0]
	for i, group := range cla.Endpoints {
		if !unmatched[i] {
			kept = append(kept, group)
		}
	}
	cla.Endpoints = kept
}

// localityMatch reports whether a locality matches a pattern: region,
// region/zone or region/zone/subzone, "*" matching any.
func localityMatch(l *core.Locality, pattern string) bool {
	parts := append(strings.SplitN(pattern, "/", 3), "", "")
	match := func(rule, v string, optional bool) bool {
		return rule == "*" || (optional && rule == "") || rule == v
	}
	return match(parts[0], l.GetRegion(), false) && match(parts[1], l.GetZone(), true) && match(parts[2], l.GetSubZone(), true)
}
