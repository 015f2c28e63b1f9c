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
// and carries every change made meanwhile, at once; the types after it in
// push order (which may name what it brings) wait with it, then follow it.
func TestResponsesPaced(t *testing.T) {
	reg := prometheus.NewRegistry()
	tables, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType}, SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	// 100 clusters of about 130 bytes: the first response paces the next
	// for about 6 s, far more than the changes below take.
	c, ads, ctx := serveCache(t, tables, server.Config{Registerer: reg, ResponseBytesPerSecond: 2000})
	clusters := func(timeout time.Duration) map[string]types.Resource {
		out := map[string]types.Resource{}
		for i := range 100 {
			n := fmt.Sprintf("outbound|8080||service-%d.namespace.svc.cluster.local", i)
			out[n] = &clusterv3.Cluster{Name: n, ConnectTimeout: durationpb.New(timeout), ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
		}
		return out
	}
	la := "outbound|8080||service-0.namespace.svc.cluster.local"
	endpoints := func(port uint32) map[string]types.Resource {
		return map[string]types.Resource{la: &endpointv3.ClusterLoadAssignment{ClusterName: la, Endpoints: []*endpointv3.LocalityLbEndpoints{{
			LbEndpoints: []*endpointv3.LbEndpoint{{HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{
				Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{Address: "10.0.0.1", PortSpecifier: &core.SocketAddress_PortValue{PortValue: port}}}}}}}}}}}}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update(cache.Shared, resource.EndpointType, endpoints(80)); err != nil {
		t.Fatal(err)
	}
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv := func() *discovery.DiscoveryResponse {
		t.Helper()
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: r.TypeUrl, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce,
			ResourceNames: map[string][]string{resource.EndpointType: {la}}[r.TypeUrl]}); err != nil {
			t.Fatal(err)
		}
		return r
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first := recv()
	if size := proto.Size(first); size < 3*2000 {
		t.Fatalf("the first response, %d bytes, paces the next for less than 3 s: the test may race its pace", size)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{la}}); err != nil {
		t.Fatal(err)
	}
	if r := recv(); r.TypeUrl != resource.EndpointType {
		t.Fatalf("got %s, want the endpoints asked for", r.TypeUrl)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the next response paced", func() (bool, string) {
		return counterValue(t, reg, "shardpilot_pusher_xds_paced_total") >= 1, "not paced"
	})
	if _, _, _, err := c.Update(cache.Shared, resource.EndpointType, endpoints(81)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	// Once the pace is over, the responses are in flight until this
	// test answers them: a backlog of 0 is seen during the pace or never.
	testutil.Eventually(t, 20*time.Second, "no backlog while the responses wait for the pace (the generations would wait for them)", func() (bool, string) {
		return c.Backlog() == 0, fmt.Sprintf("backlog %d", c.Backlog())
	})
	// Not by the watchdog, which excuses a stream whose due responses
	// wait past the answer wait, and reports it.
	if n := counterValue(t, reg, "shardpilot_pusher_xds_unanswered_responses_total"); n != 0 {
		t.Errorf("%v responses reported unanswered while they waited for the pace: they held the generations until then", n)
	}
	paced := recv()
	var timeout clusterv3.Cluster
	if paced.TypeUrl != resource.ClusterType || len(paced.Resources) != 100 || paced.Resources[0].UnmarshalTo(&timeout) != nil || timeout.ConnectTimeout.AsDuration() != 3*time.Second {
		t.Fatalf("after the pace: %s, %d resources, connect timeout %v; want the 100 clusters as last changed, first", paced.TypeUrl, len(paced.Resources), timeout.ConnectTimeout.AsDuration())
	}
	if r := recv(); r.TypeUrl != resource.EndpointType {
		t.Fatalf("after the paced clusters: %s, want the endpoints that waited behind them", r.TypeUrl)
	}
}
