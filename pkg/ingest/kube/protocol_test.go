package kube

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestPortProtocols: a Service port's protocol from its appProtocol, else
// its name's prefix, as Istio reads them; MongoDB keeps its own (Envoy's
// mongo_proxy), MySQL and Redis are TCP, UDP is not served.
func TestPortProtocols(t *testing.T) {
	mongo := "mongo"
	for _, c := range []struct {
		port corev1.ServicePort
		want meshv1.Protocol
	}{
		{corev1.ServicePort{Name: "mongo-primary"}, meshv1.Protocol_PROTOCOL_MONGO},
		{corev1.ServicePort{Name: "db", AppProtocol: &mongo}, meshv1.Protocol_PROTOCOL_MONGO},
		{corev1.ServicePort{Name: "mysql"}, meshv1.Protocol_PROTOCOL_TCP},
		{corev1.ServicePort{Name: "redis-cache"}, meshv1.Protocol_PROTOCOL_TCP},
		{corev1.ServicePort{Name: "http-web"}, meshv1.Protocol_PROTOCOL_HTTP},
		{corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP}, meshv1.Protocol_PROTOCOL_UNSPECIFIED},
	} {
		if got := Protocol(c.port); got != c.want {
			t.Errorf("%s (appProtocol %v): %v, want %v", c.port.Name, c.port.AppProtocol, got, c.want)
		}
	}
}

// TestHeadlessAndExternalName: a Service without a cluster IP is headless
// (its clients dial its pods), an ExternalName Service an alias of its
// name; neither has virtual IPs.
func TestHeadlessAndExternalName(t *testing.T) {
	port := []corev1.ServicePort{{Name: "tcp-db", Port: 5432}}
	headless, err := ConvertService(&corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Ports: port}}, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if !headless.Headless || headless.AliasOf != "" || len(headless.Addresses) != 0 {
		t.Errorf("headless Service: %v", headless)
	}
	alias, err := ConvertService(&corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "DB.Example.com.", Ports: port}}, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if alias.Headless || alias.AliasOf != "db.example.com" || alias.Resolution != meshv1.Resolution_RESOLUTION_DNS {
		t.Errorf("ExternalName Service: %v", alias)
	}
	clusterIP, err := ConvertService(&corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.5", Ports: port}}, "cluster.local")
	if err != nil {
		t.Fatal(err)
	}
	if clusterIP.Headless || clusterIP.AliasOf != "" {
		t.Errorf("a Service with a cluster IP: %v", clusterIP)
	}
}
