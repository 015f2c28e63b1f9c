package patch_test

import (
	"fmt"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tls "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/patch"
	"google.golang.org/protobuf/types/known/durationpb"
)

// BenchmarkContradictoryMerges measures 300 EnvoyFilters in the root
// namespace, each merging its own values into every outbound cluster
// (the heavy-input suite's case), applied to 200 clusters with a TLS
// transport socket: first, for clusters seen for the first time (a
// generation after the filters or the services changed); again, for the
// same clusters and filters (another class, or the next generation).
func BenchmarkContradictoryMerges(b *testing.B) {
	var clusters []*cluster.Cluster
	for i := range 200 {
		clusters = append(clusters, &cluster.Cluster{
			Name:                 fmt.Sprintf("outbound|80||svc-%d.ns.svc.cluster.local", i),
			ConnectTimeout:       durationpb.New(1e9),
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
			TransportSocket: &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{
				TypedConfig: mustAny(b, &tls.UpstreamTlsContext{Sni: fmt.Sprintf("svc-%d", i)})}},
		})
	}
	var filters []*patch.Filter
	for i := range 300 {
		filters = append(filters, &patch.Filter{Namespace: "istio-system", Name: fmt.Sprintf("merge-%03d", i), Root: true,
			Spec: &meshv1.EnvoyFilter{Patches: []*meshv1.EnvoyPatch{{
				ApplyTo: meshv1.EnvoyPatch_APPLY_TO_CLUSTER, Operation: meshv1.EnvoyPatch_OPERATION_MERGE,
				Context: meshv1.EnvoyPatch_CONTEXT_SIDECAR_OUTBOUND,
				Value:   value(b, map[string]any{"per_connection_buffer_limit_bytes": 32768 + i, "connect_timeout": fmt.Sprintf("%ds", 1+i%7)}),
			}}}})
	}
	check := func(b *testing.B, got []*cluster.Cluster) {
		if len(got) != len(clusters) || got[0].GetPerConnectionBufferLimitBytes().GetValue() != 32768+299 {
			b.Fatalf("got %d clusters, the first %v: want every cluster with the last filter's values", len(got), got[0])
		}
	}
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			var d patch.Decoded
			check(b, d.NewSet(filters, nil).Clusters(clusters, false))
		}
	})
	b.Run("again", func(b *testing.B) {
		var d patch.Decoded
		for b.Loop() {
			check(b, d.NewSet(filters, nil).Clusters(clusters, false))
			d.Sweep()
		}
	})
}
