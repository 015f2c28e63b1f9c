package generate_test

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestSubjectAltNames: a DestinationRule's subjectAltNames make the client
// verify the server's certificate names one of them (SPIFFE IDs as URI
// names, others as DNS names), against the mesh's root for ISTIO_MUTUAL
// and the system's for SIMPLE, as Istio generates them; grpc-go gets them
// in its validation context beside its provider's root.
func TestSubjectAltNames(t *testing.T) {
	svc := func(name string, tls *meshv1.ClientTLS) *generate.Service {
		return &generate.Service{Namespace: "shop", Name: name, Spec: &meshv1.Service{
			Hostnames: []string{name + ".shop.svc.cluster.local"}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports: []*meshv1.Port{{Name: "grpc", Number: 50051, Protocol: meshv1.Protocol_PROTOCOL_GRPC}}},
			Policy: &meshv1.TrafficPolicy{Host: name + ".shop.svc.cluster.local", Tls: tls}}
	}
	mutual := svc("cart", &meshv1.ClientTLS{Mode: meshv1.ClientTLS_MODE_ISTIO_MUTUAL, SubjectAltNames: []string{"spiffe://cluster.local/ns/shop/sa/cart"}})
	simple := svc("payments", &meshv1.ClientTLS{Mode: meshv1.ClientTLS_MODE_SIMPLE, Sni: "pay.example.com", SubjectAltNames: []string{"pay.example.com"}})
	m := generate.NewMesh([]*generate.Service{mutual, simple}, nil)
	var out []*cluster.Cluster
	out = append(out, generate.ServiceClusters(m, mutual, generate.Envoy)...)
	out = append(out, generate.ServiceClusters(m, simple, generate.Envoy)...)
	out = append(out, generate.ServiceClusters(m, mutual, generate.Proxyless)...)
	golden.CheckValid(t, "san-clusters.json", out)
}
