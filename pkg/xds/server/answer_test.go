package server_test

import (
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
)

// TestUnansweredResponseDoesNotHoldTheBacklog: a proxy that never answers
// its response counts in the cache's backlog (which holds the next
// generation back) only for the answer wait; it is reported, is sent the
// next change once it answers, and leaves the backlog as it found it.
func TestUnansweredResponseDoesNotHoldTheBacklog(t *testing.T) {
	status := server.NewStreams()
	c, ads, ctx := serve(t, server.Config{AnswerWait: 200 * time.Millisecond, Streams: status})
	update := func(names ...string) {
		t.Helper()
		res := map[string]types.Resource{}
		for _, n := range names {
			res[n] = &clusterv3.Cluster{Name: n}
		}
		if _, _, _, err := c.Update("all", resource.ClusterType, res); err != nil {
			t.Fatal(err)
		}
	}
	backlog := func(want int64, what string) {
		t.Helper()
		testutil.Eventually(t, 10*time.Second, what, func() (bool, string) {
			return c.Backlog() == want, fmt.Sprint("backlog ", c.Backlog())
		})
	}
	update("a")
	mute, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := mute.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "mute"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first, err := mute.Recv()
	if err != nil {
		t.Fatal(err)
	}
	backlog(0, "the unanswered response to leave the backlog")
	streams := status.Status()
	if len(streams) != 1 || !streams[0].Types["Cluster"].Unanswered {
		t.Errorf("/debug/syncz: %+v, want the cluster response unanswered", streams)
	}
	update("a", "b") // due to the mute proxy, which the backlog no longer waits for
	backlog(0, "a change due to the excused proxy not to count")

	// It answers: the change is sent, counted until answered, and the
	// backlog is back where it was.
	if err := mute.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: first.VersionInfo, ResponseNonce: first.Nonce}); err != nil {
		t.Fatal(err)
	}
	next, err := mute.Recv()
	if err != nil || len(next.Resources) != 2 {
		t.Fatalf("after its answer: %v (%v), want both clusters", next, err)
	}
	if streams := status.Status(); streams[0].Types["Cluster"].Unanswered {
		t.Error("still reported unanswered after its answer")
	}
	if err := mute.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: next.VersionInfo, ResponseNonce: next.Nonce}); err != nil {
		t.Fatal(err)
	}
	backlog(0, "the backlog to be empty once every response is answered")
}
