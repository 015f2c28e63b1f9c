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
