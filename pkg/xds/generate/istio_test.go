package generate_test

import (
	"slices"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestIstioStructure compares what a sidecar of namespace default is sent
// for Bookinfo's reviews (a Kubernetes Service at 10.0.0.10:9080), an
// external HTTPS ServiceEntry resolved by DNS, and a MySQL TCP Service
// (10.0.0.20:3306) with the structure Istio documents for the same input
// ("istioctl proxy-config" output in Istio's "Debugging Envoy and Istiod"
// and "Understanding TLS configuration" pages): cluster names and types,
// route configuration and virtual host names and domains, listener names.
func TestIstioStructure(t *testing.T) {
	svc := func(name, host string, res meshv1.Resolution, port uint32, proto meshv1.Protocol, vips ...string) *generate.Service {
		return &generate.Service{Namespace: "default", Name: name, Spec: &meshv1.Service{Hostnames: []string{host}, Resolution: res, Addresses: vips,
			Ports: []*meshv1.Port{{Name: "p", Number: port, Protocol: proto}}}}
	}
	m := generate.NewMesh([]*generate.Service{
		svc("reviews", "reviews.default.svc.cluster.local", meshv1.Resolution_RESOLUTION_STATIC, 9080, meshv1.Protocol_PROTOCOL_HTTP, "10.0.0.10"),
		svc("external", "api.example.com", meshv1.Resolution_RESOLUTION_DNS, 443, meshv1.Protocol_PROTOCOL_TLS),
		svc("mysql", "mysql.default.svc.cluster.local", meshv1.Resolution_RESOLUTION_STATIC, 3306, meshv1.Protocol_PROTOCOL_TCP, "10.0.0.20"),
	}, nil).For(generate.View{Namespace: "default"})

	clusters := map[string]cluster.Cluster_DiscoveryType{}
	for _, c := range generate.Clusters(m, generate.Envoy) {
		clusters[c.Name] = c.GetType()
	}
	for name, typ := range map[string]cluster.Cluster_DiscoveryType{
		"outbound|9080||reviews.default.svc.cluster.local": cluster.Cluster_EDS,
		"outbound|443||api.example.com":                    cluster.Cluster_STRICT_DNS,
		"outbound|3306||mysql.default.svc.cluster.local":   cluster.Cluster_EDS,
		"inbound|9080||":            cluster.Cluster_ORIGINAL_DST,
		"PassthroughCluster":        cluster.Cluster_ORIGINAL_DST,
		"BlackHoleCluster":          cluster.Cluster_STATIC,
		"InboundPassthroughCluster": cluster.Cluster_ORIGINAL_DST,
	} {
		if got, ok := clusters[name]; !ok || got != typ {
			t.Errorf("cluster %s: %v (present %v), Istio's is %v", name, got, ok, typ)
		}
	}

	// Istio: route "9080", virtual host "reviews.default.svc.cluster.local:9080".
	var domains []string
	for _, rc := range generate.Routes(m, generate.Envoy) {
		if rc.Name != "9080" {
			continue
		}
		for _, vh := range rc.VirtualHosts {
			if vh.Name == "reviews.default.svc.cluster.local:9080" {
				domains = vh.Domains
			}
		}
	}
	// A sidecar's route configurations ignore the port in host matching:
	// its domains carry none.
	want := []string{"reviews.default.svc.cluster.local", "reviews.default.svc.cluster.local.", "reviews",
		"reviews.default.svc", "reviews.default", "10.0.0.10"}
	if !sameSet(domains, want) {
		t.Errorf("domains %v, Istio's are %v", domains, want)
	}

	var listeners []string
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		listeners = append(listeners, l.Name)
	}
	for _, name := range []string{"0.0.0.0_9080", "0.0.0.0_443", "10.0.0.20_3306", "virtualOutbound", "virtualInbound"} {
		if !slices.Contains(listeners, name) {
			t.Errorf("no listener %s among %v", name, listeners)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return strings.Join(a, ",") == strings.Join(b, ",")
}
