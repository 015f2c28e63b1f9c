package generate_test

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestDNSClusters: ServiceEntries with DNS resolution get clusters that
// resolve names (STRICT_DNS over every endpoint for DNS, LOGICAL_DNS over
// one for DNS_ROUND_ROBIN, as Istio generates them; LOGICAL_DNS for
// proxyless clients), their subsets too, the host itself without
// endpoints, and never a load assignment over EDS.
func TestDNSClusters(t *testing.T) {
	dns := &generate.Service{Namespace: "shop", Name: "payments", Spec: &meshv1.Service{
		Hostnames: []string{"api.payments.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
	}, Endpoints: []*meshv1.Endpoint{
		{Address: "eu.payments.example.com", Labels: map[string]string{"region": "eu"}, Locality: &meshv1.Locality{Region: "eu"}},
		{Address: "us.payments.example.com", Labels: map[string]string{"region": "us"}, Locality: &meshv1.Locality{Region: "us"}, Ports: map[string]uint32{"http": 8080}},
	}, Policy: &meshv1.TrafficPolicy{Host: "api.payments.example.com", Subsets: []*meshv1.Subset{{Name: "eu", Labels: map[string]string{"region": "eu"}}}}}
	roundRobin := &generate.Service{Namespace: "shop", Name: "search", Spec: &meshv1.Service{
		Hostnames: []string{"search.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN,
		Ports: []*meshv1.Port{{Name: "grpc", Number: 443, Protocol: meshv1.Protocol_PROTOCOL_GRPC}},
	}, Endpoints: []*meshv1.Endpoint{{Address: "search-a.example.com"}, {Address: "search-b.example.com"}}}
	bare := &generate.Service{Namespace: "shop", Name: "maps", Spec: &meshv1.Service{
		Hostnames: []string{"maps.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
	}}
	m := generate.NewMesh([]*generate.Service{dns, roundRobin, bare}, nil)
	for _, proxy := range []generate.Proxy{generate.Envoy, generate.Proxyless} {
		var cs []*cluster.Cluster
		for _, s := range m.Services {
			cs = append(cs, generate.ServiceClusters(m, s, proxy)...)
		}
		check(t, "dns-clusters-"+proxy.String()+".json", cs)
		for _, c := range cs {
			if c.GetType() == cluster.Cluster_EDS {
				t.Errorf("%s %s: EDS", proxy, c.Name)
			}
			if c.GetType() == cluster.Cluster_LOGICAL_DNS && (len(c.LoadAssignment.Endpoints) != 1 || len(c.LoadAssignment.Endpoints[0].LbEndpoints) != 1) {
				t.Errorf("%s %s: LOGICAL_DNS with more than one endpoint", proxy, c.Name)
			}
		}
	}
	if las := generate.LoadAssignments(m); len(las) != 0 {
		t.Errorf("%d load assignments for DNS services, want none (hostnames never go over EDS)", len(las))
	}
}
