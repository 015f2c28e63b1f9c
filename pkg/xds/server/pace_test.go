package server_test

import (
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestResponsesPaced: after a large response, the next of its type waits
// for its pace, holding nothing of the backlog the generations wait for,
// and carries every change made meanwhile, at once; a type the proxy newly
// asks for is not held by another's pace.
func TestResponsesPaced(t *testing.T) {
	reg := prometheus.NewRegistry()
	// 100 clusters of about 130 bytes: the first response paces the next
	// for about 6 s, far more than the changes below take.
	tables, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType}, SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	c, ads, ctx := serveCache(t, tables, server.Config{Registerer: reg, ResponseBytesPerSecond: 2000})
	clusters := func(timeout time.Duration) map[string]types.Resource {
		out := map[string]types.Resource{}
		for i := range 100 {
			n := fmt.Sprintf("outbound|8080||service-%d.namespace.svc.cluster.local", i)
			out[n] = &clusterv3.Cluster{Name: n, ConnectTimeout: durationpb.New(timeout), ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
		}
		return out
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters(time.Second)); err != nil {
		t.Fatal(err)
	}
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: first.VersionInfo, ResponseNonce: first.Nonce}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the next response paced", func() (bool, string) {
		return counterValue(t, reg, "shardpilot_pusher_xds_paced_total") >= 1, "not paced"
	})
	if b := c.Backlog(); b != 0 {
		t.Errorf("backlog %d while the response waits for its pace, want 0: the generations would wait for it", b)
	}
	// Another type the proxy asks for now goes at once.
	la := "outbound|8080||service-0.namespace.svc.cluster.local"
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{la}}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update(cache.Shared, resource.EndpointType, map[string]types.Resource{la: &endpointv3.ClusterLoadAssignment{ClusterName: la}}); err != nil {
		t.Fatal(err)
	}
	next, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if next.TypeUrl != resource.EndpointType {
		t.Fatalf("after a paced response, got %s first, want the endpoints newly asked for", next.TypeUrl)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	paced, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var timeout clusterv3.Cluster
	if paced.TypeUrl != resource.ClusterType || len(paced.Resources) != 100 || paced.Resources[0].UnmarshalTo(&timeout) != nil || timeout.ConnectTimeout.AsDuration() != 3*time.Second {
		t.Fatalf("the paced response: %s, %d resources, connect timeout %v; want the 100 clusters as last changed", paced.TypeUrl, len(paced.Resources), timeout.ConnectTimeout.AsDuration())
	}
	if size := proto.Size(first); size < 3*2000 {
		t.Fatalf("the first response, %d bytes, paces the next for less than 3 s: the test may race its pace", size)
	}
}
