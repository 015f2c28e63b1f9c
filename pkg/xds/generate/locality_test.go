package generate_test

import (
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// zonal is a service with two endpoints in each of us-east/z1/a,
// us-east/z1/b, us-east/z2, us-west/z1 and eu-west/z1, under policy.
func zonal(policy *meshv1.TrafficPolicy) *generate.Service {
	var eps []*meshv1.Endpoint
	for i, l := range []*meshv1.Locality{{Region: "us-east", Zone: "z1", Subzone: "a"}, {Region: "us-east", Zone: "z1", Subzone: "b"},
		{Region: "us-east", Zone: "z2"}, {Region: "us-west", Zone: "z1"}, {Region: "eu-west", Zone: "z1"}} {
		for j := range 2 {
			eps = append(eps, &meshv1.Endpoint{Address: "10.0." + string(rune('0'+i)) + "." + string(rune('1'+j)), Locality: l,
				Labels: map[string]string{"version": []string{"v1", "v2"}[j]}})
		}
	}
	return &generate.Service{Namespace: "shop", Name: "cart", Spec: &meshv1.Service{
		Hostnames: []string{"cart.shop.svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}},
		Endpoints: eps, Policy: policy}
}

// priorities maps each locality of an assignment to its priority and weight.
func priorities(cla *endpoint.ClusterLoadAssignment) map[string][2]uint32 {
	out := map[string][2]uint32{}
	for _, g := range cla.Endpoints {
		out[generate.LocalityName(g.Locality)] = [2]uint32{g.Priority, g.GetLoadBalancingWeight().GetValue()}
	}
	return out
}

// TestLocalityFailoverPriorities: with outlier detection, a proxy's
// localities get Istio's priorities (its subzone 0, its zone 1, its region
// 2, other regions 3; failover puts the named region before the others),
// made consecutive; a subset and a port keep the rule. Without outlier
// detection, or disabled, the assignment is the shared one itself.
func TestLocalityFailoverPriorities(t *testing.T) {
	od := &meshv1.OutlierDetection{Consecutive_5XxErrors: 5}
	proxy := &core.Locality{Region: "us-east", Zone: "z1", SubZone: "a"}
	cases := []struct {
		name   string
		policy *meshv1.TrafficPolicy
		want   map[string][2]uint32 // locality: priority, weight
	}{
		{"no outlier detection", &meshv1.TrafficPolicy{}, nil},
		{"disabled", &meshv1.TrafficPolicy{OutlierDetection: od, LocalityLb: &meshv1.LocalityLb{Disabled: true}}, nil},
		{"failover by proximity", &meshv1.TrafficPolicy{OutlierDetection: od}, map[string][2]uint32{
			"us-east/z1/a": {0, 2}, "us-east/z1/b": {1, 2}, "us-east/z2/": {2, 2}, "us-west/z1/": {3, 2}, "eu-west/z1/": {3, 2}}},
		{"failover to a named region", &meshv1.TrafficPolicy{OutlierDetection: od, LocalityLb: &meshv1.LocalityLb{
			Failover: []*meshv1.LocalityLb_Failover{{From: "us-east", To: "eu-west"}}}}, map[string][2]uint32{
			"us-east/z1/a": {0, 2}, "us-east/z1/b": {1, 2}, "us-east/z2/": {2, 2}, "eu-west/z1/": {3, 2}, "us-west/z1/": {4, 2}}},
		{"distribute", &meshv1.TrafficPolicy{LocalityLb: &meshv1.LocalityLb{Distribute: []*meshv1.LocalityLb_Distribute{
			{From: "us-west/*", To: map[string]uint32{"us-west/*": 100}},
			{From: "us-east/z1/*", To: map[string]uint32{"us-east/z1/*": 80, "us-east/z2": 20}}}}}, map[string][2]uint32{
			"us-east/z1/a": {0, 40}, "us-east/z1/b": {0, 40}, "us-east/z2/": {0, 20}}},
		{"distribute for other localities", &meshv1.TrafficPolicy{LocalityLb: &meshv1.LocalityLb{Distribute: []*meshv1.LocalityLb_Distribute{
			{From: "us-west/*", To: map[string]uint32{"us-west/*": 100}}}}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			svc := zonal(c.policy)
			m := generate.NewMesh([]*generate.Service{svc}, nil)
			shared := generate.ServiceLoadAssignments(m, svc)
			local := generate.LocalityLoadAssignments(svc, shared, proxy)
			if len(local) != len(shared) {
				t.Fatalf("%d assignments, want %d", len(local), len(shared))
			}
			if c.want == nil {
				if local[0] != shared[0] {
					t.Errorf("not the shared assignment: %v", priorities(local[0]))
				}
				return
			}
			got := priorities(local[0])
			if len(got) != len(c.want) {
				t.Errorf("localities %v, want %v", got, c.want)
			}
			for l, w := range c.want {
				if got[l] != w {
					t.Errorf("%s: priority, weight %v, want %v", l, got[l], w)
				}
			}
			if err := local[0].Validate(); err != nil {
				t.Error(err)
			}
			if len(priorities(shared[0])) != 5 || shared[0].Endpoints[0].Priority != 0 {
				t.Errorf("the shared assignment changed: %v", priorities(shared[0]))
			}
		})
	}
}

// TestLocalityGolden: the clusters and the assignments a proxy in
// us-east/z1/a gets for a destination with outlier detection, a subset
// that distributes and a port that turns locality balancing off.
func TestLocalityGolden(t *testing.T) {
	svc := zonal(&meshv1.TrafficPolicy{Host: "cart.shop.svc.cluster.local",
		OutlierDetection: &meshv1.OutlierDetection{Consecutive_5XxErrors: 5},
		LocalityLb:       &meshv1.LocalityLb{Failover: []*meshv1.LocalityLb_Failover{{From: "us-east", To: "us-west"}}},
		Subsets: []*meshv1.Subset{{Name: "v2", Labels: map[string]string{"version": "v2"},
			LocalityLb: &meshv1.LocalityLb{Distribute: []*meshv1.LocalityLb_Distribute{
				{From: "us-east/*", To: map[string]uint32{"us-east/z2": 70, "eu-west": 30}}}}}},
	})
	svc.Spec.Ports = append(svc.Spec.Ports, &meshv1.Port{Name: "admin", Number: 9090, Protocol: meshv1.Protocol_PROTOCOL_HTTP})
	svc.Policy.PortLevelSettings = []*meshv1.PortPolicy{{Port: 9090, LocalityLb: &meshv1.LocalityLb{Disabled: true}}}
	m := generate.NewMesh([]*generate.Service{svc}, nil)
	golden.CheckValid(t, "locality-clusters.json", generate.ServiceClusters(m, svc, generate.Envoy))
	shared := generate.ServiceLoadAssignments(m, svc)
	golden.CheckValid(t, "locality-endpoints.json", generate.LocalityLoadAssignments(svc, shared, &core.Locality{Region: "us-east", Zone: "z1", SubZone: "a"}))
}

func TestLocalityName(t *testing.T) {
	for l, want := range map[*core.Locality]string{
		nil: "", {}: "", {Region: "r"}: "r//", {Region: "r", Zone: "z", SubZone: "s"}: "r/z/s", {Region: "a/b"}: "",
	} {
		if got := generate.LocalityName(l); got != want {
			t.Errorf("%v: %q, want %q", l, got, want)
		}
		if want != "" && generate.LocalityName(generate.ParseLocality(want)) != want {
			t.Errorf("%q does not parse back", want)
		}
	}
}

// TestLocalityWeightedClusters: an Envoy's cluster weighs its localities
// where istiod's does: when the policy distributes, or fails over to named
// regions with outlier detection (with a hash ring too); not when it only
// fails over by proximity, fails over without outlier detection, or turns
// locality balancing off; never for a proxyless client.
func TestLocalityWeightedClusters(t *testing.T) {
	od := &meshv1.OutlierDetection{Consecutive_5XxErrors: 5}
	failover := &meshv1.LocalityLb{Failover: []*meshv1.LocalityLb_Failover{{From: "us-east", To: "us-west"}}}
	distribute := &meshv1.LocalityLb{Distribute: []*meshv1.LocalityLb_Distribute{{From: "us-east/*", To: map[string]uint32{"us-east/*": 100}}}}
	for _, c := range []struct {
		name   string
		policy *meshv1.TrafficPolicy
		proxy  generate.Proxy
		want   bool
	}{
		{"failover to a named region", &meshv1.TrafficPolicy{OutlierDetection: od, LocalityLb: failover}, generate.Envoy, true},
		{"distribute", &meshv1.TrafficPolicy{LocalityLb: distribute}, generate.Envoy, true},
		{"distribute, hash ring", &meshv1.TrafficPolicy{LocalityLb: distribute, ConsistentHash: &meshv1.ConsistentHash{Key: &meshv1.ConsistentHash_UseSourceIp{UseSourceIp: true}}}, generate.Envoy, true},
		{"failover by proximity", &meshv1.TrafficPolicy{OutlierDetection: od}, generate.Envoy, false},
		{"failover without outlier detection", &meshv1.TrafficPolicy{LocalityLb: failover}, generate.Envoy, false},
		{"disabled", &meshv1.TrafficPolicy{OutlierDetection: od, LocalityLb: &meshv1.LocalityLb{Disabled: true}}, generate.Envoy, false},
		{"proxyless", &meshv1.TrafficPolicy{LocalityLb: distribute}, generate.Proxyless, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			svc := zonal(c.policy)
			clusters := generate.ServiceClusters(generate.NewMesh([]*generate.Service{svc}, nil), svc, c.proxy)
			if len(clusters) == 0 {
				t.Fatal("no cluster")
			}
			if got := clusters[0].GetCommonLbConfig().GetLocalityWeightedLbConfig() != nil; got != c.want {
				t.Errorf("locality_weighted_lb_config %v, want %v", got, c.want)
			}
			if err := clusters[0].Validate(); err != nil {
				t.Error(err)
			}
		})
	}
}
