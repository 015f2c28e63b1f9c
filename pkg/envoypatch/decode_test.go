package envoypatch

import (
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	tls "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestValidPart: a part of a cluster is checked in the fields it sets, at
// any depth and in lists, and in its extension configurations whole; the
// fields it leaves out are not required.
func TestValidPart(t *testing.T) {
	sni, err := anypb.New(&tls.UpstreamTlsContext{Sni: strings.Repeat("x", 300)})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		part *cluster.Cluster
		want string // in the error; "" for valid
	}{
		{"a timeout alone (no name)", &cluster.Cluster{ConnectTimeout: durationpb.New(1e9)}, ""},
		{"a negative timeout", &cluster.Cluster{ConnectTimeout: durationpb.New(-1e9)}, "ConnectTimeout"},
		{"half a load assignment (no cluster name)", &cluster.Cluster{LoadAssignment: &endpoint.ClusterLoadAssignment{
			Policy: &endpoint.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(150)}}}, ""},
		{"a load assignment's invalid half", &cluster.Cluster{LoadAssignment: &endpoint.ClusterLoadAssignment{
			Policy: &endpoint.ClusterLoadAssignment_Policy{OverprovisioningFactor: wrapperspb.UInt32(0)}}}, "OverprovisioningFactor"},
		{"a threshold of an unknown priority", &cluster.Cluster{CircuitBreakers: &cluster.CircuitBreakers{
			Thresholds: []*cluster.CircuitBreakers_Thresholds{{}, {Priority: 99}}}}, "Priority"},
		{"an extension configuration invalid whole", &cluster.Cluster{TransportSocket: &core.TransportSocket{Name: "tls",
			ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: sni}}}, "Sni"},
	}
	for _, tt := range tests {
		err := ValidPart(tt.part)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want valid", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), "Cluster.Name")):
			t.Errorf("%s: %v, want the violation of %s alone", tt.name, err, tt.want)
		}
	}
}
