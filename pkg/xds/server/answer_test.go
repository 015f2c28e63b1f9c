package server_test

import (
	"context"
	"fmt"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/protobuf/types/known/durationpb"
	"strings"
	"sync"
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

// TestBacklogSurvivesChurn: streams that come and go while the tables
// change (SotW and Delta, named and wildcard, some answering, some
// unsubscribing, every one ended abruptly) leave the backlog empty once
// they are gone. A due unit left behind holds every later generation for
// the whole maximum hold: the pushes would come in batches of that
// period for as long as the pusher runs. With the senders' pool and
// without a limit (a goroutine per stream writing, started by the
// dispatcher, never by Notify under a table's lock).
func TestBacklogSurvivesChurn(t *testing.T) {
	for name, pushes := range map[string]int{"pool": 0, "unlimited": -1} {
		t.Run(name, func(t *testing.T) { backlogSurvivesChurn(t, pushes) })
	}
}

func backlogSurvivesChurn(t *testing.T, maxConcurrentPushes int) {
	c, ads, ctx := serve(t, server.Config{MaxConcurrentPushes: maxConcurrentPushes})
	stop := make(chan struct{})
	updated := make(chan struct{})
	go func() {
		defer close(updated)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			res := map[string]types.Resource{}
			for j := range 1 + i%5 {
				res[fmt.Sprint("c", j)] = &clusterv3.Cluster{Name: fmt.Sprint("c", j), ConnectTimeout: durationpb.New(time.Duration(i) * time.Millisecond)}
			}
			if _, _, _, err := c.Update("all", resource.ClusterType, res); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range 40 {
		wg.Go(func() {
			for round := range 15 {
				sctx, cancel := context.WithCancel(ctx)
				if (w+round)%2 == 0 {
					churnSotW(sctx, ads, w, round)
				} else {
					churnDelta(sctx, ads, w, round)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	close(stop)
	<-updated
	testutil.Eventually(t, 10*time.Second, "the backlog to be empty once every stream is gone", func() (bool, string) {
		return c.Backlog() == 0, fmt.Sprint("backlog ", c.Backlog())
	})
}

// churnSotW opens a SotW stream, answers some of what it is sent and
// returns with the stream open (the caller ends it).
func churnSotW(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, w, round int) {
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return
	}
	var names []string
	if round%3 == 1 {
		names = []string{"c0", "c3"}
	}
	if s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprint("sotw-", w)}, TypeUrl: resource.ClusterType, ResourceNames: names}) != nil {
		return
	}
	for i := range round % 4 {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		if i%2 == 1 {
			names = nil // and then all of them
		}
		if s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce, ResourceNames: names}) != nil {
			return
		}
	}
}

// churnDelta is churnSotW on a Delta stream, which also unsubscribes.
func churnDelta(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, w, round int) {
	s, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return
	}
	var names []string
	if round%3 != 0 {
		names = []string{"c0", "c1", "c4"}
	}
	if s.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: fmt.Sprint("delta-", w)}, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: names}) != nil {
		return
	}
	for i := range round % 4 {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce}
		if i%2 == 1 && names != nil {
			req.ResourceNamesUnsubscribe = names // nothing is sent after this
		}
		if s.Send(req) != nil || req.ResourceNamesUnsubscribe != nil {
			return
		}
	}
}

// TestSlowReaderDoesNotHoldTheBacklog: a proxy that reads so slowly that
// a response's write outlasts the answer wait holds the backlog no longer
// than that, the types due behind the stalled write included (they are
// not in flight, and were once held until the send timeout ended the
// stream): under a steady trickle of such proxies, every generation
// would wait the whole maximum hold.
func TestSlowReaderDoesNotHoldTheBacklog(t *testing.T) {
	typs := []string{resource.ClusterType, resource.ListenerType, resource.RouteType}
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: typs})
	if err != nil {
		t.Fatal(err)
	}
	status := server.NewStreams()
	_, ads, ctx := serveCache(t, c, server.Config{AnswerWait: 200 * time.Millisecond, SendTimeout: time.Minute, Streams: status})
	update := func(typ string, res map[string]types.Resource) {
		t.Helper()
		if _, _, _, err := c.Update("all", typ, res); err != nil {
			t.Fatal(err)
		}
	}
	// Responses of 4 MB: the first is queued whole, the next waits for the
	// proxy to read.
	big := func(typ string, version int) map[string]types.Resource {
		res := map[string]types.Resource{}
		pad := strings.Repeat("x", 10<<10)
		for i := range 400 {
			name := fmt.Sprint(typ[len(typ)-5:], i)
			switch typ {
			case resource.ClusterType:
				res[name] = &clusterv3.Cluster{Name: name, AltStatName: pad + fmt.Sprint(version)}
			case resource.ListenerType:
				res[name] = &listenerv3.Listener{Name: name, StatPrefix: pad + fmt.Sprint(version)}
			default:
				res[name] = &routev3.RouteConfiguration{Name: name, VirtualHosts: []*routev3.VirtualHost{{Name: pad + fmt.Sprint(version), Domains: []string{"*"}}}}
			}
		}
		return res
	}
	for _, typ := range typs {
		update(typ, big(typ, 1))
	}
	slow, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// It asks for every type and reads nothing: the clusters are queued,
	// the listeners' write stalls, the routes are due behind it.
	for _, typ := range typs {
		if err := slow.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "slow"}, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.Eventually(t, 10*time.Second, "the slow reader to be reported and to leave the backlog", func() (bool, string) {
		streams := status.Status()
		if len(streams) != 1 {
			return false, fmt.Sprint(len(streams), " streams")
		}
		types := streams[0].Types
		if types["Cluster"] == nil || types["Listener"] == nil {
			return false, "the stream's requests not all read yet"
		}
		return types["Cluster"].Unanswered && types["Listener"].Unanswered && types["RouteConfiguration"] != nil && c.Backlog() == 0,
			fmt.Sprintf("backlog %d, types %+v", c.Backlog(), types)
	})
	// Generations make every type due again: a stream that is behind does
	// not count.
	for _, typ := range typs {
		update(typ, big(typ, 2))
	}
	if n := c.Backlog(); n != 0 {
		t.Errorf("after a generation, a stream still behind counts %d in the backlog, want 0", n)
	}
	// It answers one response at a time, late: it stays behind, and no
	// answer brings it back into the backlog, until it has answered all.
	answered := map[string]bool{}
	for len(answered) < len(typs) {
		resp, err := slow.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(answered) < len(typs)-1 {
			if n := c.Backlog(); n != 0 {
				t.Fatalf("%d types answered: the stream behind counts %d in the backlog, want 0", len(answered), n)
			}
		}
		answered[resp.TypeUrl] = true
		if err := slow.Send(&discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
	// Caught up, it counts again: the next generation waits for it.
	go func() {
		for {
			resp, err := slow.Recv()
			if err != nil || slow.Send(&discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}) != nil {
				return
			}
		}
	}()
	version := 3
	testutil.Eventually(t, 5*time.Second, "the stream to catch up", func() (bool, string) {
		version++
		update(resource.ListenerType, map[string]types.Resource{"l": &listenerv3.Listener{Name: "l", StatPrefix: fmt.Sprint(version)}})
		return c.Backlog() > 0, "backlog 0 after a generation"
	})
}
