package generate_test

import (
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestHeadlessServices: an Envoy's cluster of a headless Kubernetes
// service sends a connection to the pod its client dialled (original
// destination), as istiod's, where a load-balanced cluster would send a
// client of one StatefulSet pod to another; it speaks mutual TLS when every
// workload has a sidecar, else plaintext. A proxyless client keeps the
// endpoints.
func TestHeadlessServices(t *testing.T) {
	ep := func(ip string, sidecar bool) *meshv1.Endpoint {
		e := &meshv1.Endpoint{Address: ip, Labels: map[string]string{}}
		if sidecar {
			e.Labels[generate.TLSModeLabel] = "istio"
		}
		return e
	}
	db := func(eps ...*meshv1.Endpoint) *generate.Mesh {
		return generate.NewMesh([]*generate.Service{{Namespace: "data", Name: "db", Endpoints: eps, Spec: &meshv1.Service{
			Hostnames: []string{"db.data.svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC, Headless: true,
			Ports: []*meshv1.Port{{Name: "tcp-postgres", Number: 5432, Protocol: meshv1.Protocol_PROTOCOL_TCP}}}}}, nil)
	}
	cluster := func(m *generate.Mesh, proxy generate.Proxy) *clusterv3.Cluster {
		for _, c := range generate.Clusters(m, proxy) {
			if c.Name == "outbound|5432||db.data.svc.cluster.local" {
				if err := c.Validate(); err != nil {
					t.Fatal(err)
				}
				return c
			}
		}
		t.Fatal("no cluster of the headless service")
		return nil
	}

	c := cluster(db(ep("10.1.0.1", true), ep("10.1.0.2", true)), generate.Envoy)
	if c.GetType() != clusterv3.Cluster_ORIGINAL_DST || c.LbPolicy != clusterv3.Cluster_CLUSTER_PROVIDED || c.EdsClusterConfig != nil {
		t.Errorf("cluster %v (%v, EDS %v): want the original destination", c.GetType(), c.LbPolicy, c.EdsClusterConfig)
	}
	if c.TransportSocket.GetName() != "envoy.transport_sockets.tls" || len(c.TransportSocketMatches) != 0 {
		t.Errorf("every workload has a sidecar: want mutual TLS, got %v (matches %d)", c.TransportSocket.GetName(), len(c.TransportSocketMatches))
	}
	if c := cluster(db(ep("10.1.0.1", true), ep("10.1.0.2", false)), generate.Envoy); c.TransportSocket != nil || len(c.TransportSocketMatches) != 0 {
		t.Errorf("a workload without a sidecar: want plaintext, got %v", c.TransportSocket)
	}
	if c := cluster(db(ep("10.1.0.1", true)), generate.Proxyless); c.GetType() != clusterv3.Cluster_EDS {
		t.Errorf("a proxyless client's cluster %v: want EDS", c.GetType())
	}
}
