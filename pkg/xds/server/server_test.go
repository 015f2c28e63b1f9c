package server_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// serve runs a server (of one class, "all", unless cfg has a classifier) on
// a cache of clusters, and
// returns the cache, an ADS client of it and a context that lives as long
// as the test.
func serve(t *testing.T, cfg server.Config) (*cache.Cache, discovery.AggregatedDiscoveryServiceClient, context.Context) {
	t.Helper()
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	return serveCache(t, c, cfg)
}

// serveCache is serve on a cache of the caller's.
func serveCache(t *testing.T, c *cache.Cache, cfg server.Config) (*cache.Cache, discovery.AggregatedDiscoveryServiceClient, context.Context) {
	t.Helper()
	addr, ctx := serveOn(t, c, cfg)
	return c, dialADS(t, addr), ctx
}

// serveOn serves a cache of the caller's (one class, "all", unless cfg
// says otherwise) until the test ends, and returns its address and a
// context that ends with it.
func serveOn(t *testing.T, c *cache.Cache, cfg server.Config) (string, context.Context) {
	t.Helper()
	cfg.Cache = c
	if cfg.Hooks == nil {
		cfg.Hooks = server.OneClass("all")
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	return lis.Addr().String(), ctx
}

// dialADS connects to addr in plaintext until the test ends (the
// connection closes before the server stops).
func dialADS(t *testing.T, addr string) discovery.AggregatedDiscoveryServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return discovery.NewAggregatedDiscoveryServiceClient(conn)
}

// TestStreamRateLimit: past the rate, new streams are told to retry with
// UNAVAILABLE instead of all being served at once; streams already open
// are not affected.
func TestStreamRateLimit(t *testing.T) {
	_, ads, ctx := serve(t, server.Config{StreamRate: 0.001})
	open := func() error {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		// A refused stream's Send may fail with EOF: its status comes from Recv.
		_ = s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType})
		_, err = s.Recv()
		return err
	}
	if err := open(); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	if err := open(); status.Code(err) != codes.Unavailable {
		t.Fatalf("second stream at once: %v, want UNAVAILABLE", err)
	}
}

// TestSlowReaderDoesNotHoldTheSenders: with one push slot, a proxy that
// never reads its stream does not hold the slot: once its write waits on
// flow control, another sender takes its place and the next proxy is
// served, long before the send timeout.
func TestSlowReaderDoesNotHoldTheSenders(t *testing.T) {
	reg, big, dial := stalledWrite(t, time.Minute)
	fs, err := dial().StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := fs.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "fast"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	within(t, "the proxy behind the slow one", func() error {
		resp, err := fs.Recv()
		if err == nil && len(resp.Resources) != len(big) {
			err = fmt.Errorf("got %d clusters, want %d", len(resp.Resources), len(big))
		}
		return err
	})
	if n := counterValue(t, reg, "shardpilot_pusher_xds_parked_writes_total"); n < 1 {
		t.Errorf("%v writes parked, want the slow proxy's", n)
	}
	if n := counterValue(t, reg, "shardpilot_pusher_xds_send_timeouts_total"); n != 0 {
		t.Errorf("%v send timeouts, want none yet", n)
	}
}

// TestSendTimeoutEndsAStalledStream: a write that outlasts the send
// timeout ends its stream.
func TestSendTimeoutEndsAStalledStream(t *testing.T) {
	reg, _, _ := stalledWrite(t, 300*time.Millisecond)
	testutil.Eventually(t, 10*time.Second, "the stalled stream to be ended", func() (bool, string) {
		n := counterValue(t, reg, "shardpilot_pusher_xds_send_timeouts_total")
		return n == 1, fmt.Sprint(n, " send timeouts")
	})
}

// stalledWrite serves, with one push slot, responses far larger than a
// stream's flow-control window to a proxy that never reads: gRPC takes the
// first whole, and the next blocks until the proxy reads. It returns once
// that second write started, with the server's metrics, the clusters and
// a dial of the server with the same small windows.
func stalledWrite(t *testing.T, sendTimeout time.Duration) (*prometheus.Registry, map[string]types.Resource, func() discovery.AggregatedDiscoveryServiceClient) {
	t.Helper()
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType, resource.ListenerType}})
	if err != nil {
		t.Fatal(err)
	}
	big := map[string]types.Resource{}
	listeners := map[string]types.Resource{}
	for i := range 64 {
		name := fmt.Sprintf("cluster-%d", i)
		big[name] = &clusterv3.Cluster{Name: name, AltStatName: strings.Repeat("x", 64<<10)}
		listeners[name] = &listenerv3.Listener{Name: name, StatPrefix: strings.Repeat("x", 64<<10)}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, big); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update("all", resource.ListenerType, listeners); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	srv, err := server.New(server.Config{Cache: c, Hooks: server.OneClass("all"), MaxConcurrentPushes: 1, SendTimeout: sendTimeout,
		Registerer: reg, DrainTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis) }()
	t.Cleanup(func() { cancel(); <-done })
	dial := func() discovery.AggregatedDiscoveryServiceClient {
		// Fixed windows (no BDP growth): an unread stream fills up.
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return discovery.NewAggregatedDiscoveryServiceClient(conn)
	}
	ss, err := dial().StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := ss.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "slow"}, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
	// The slow proxy never calls Recv. Wait until its second write started.
	testutil.Eventually(t, 10*time.Second, "the slow proxy's second write to start", func() (bool, string) {
		var n float64
		if f := family(t, reg, "shardpilot_pusher_xds_responses_total"); f != nil {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
		return n >= 2, fmt.Sprintf("%v responses written", n)
	})
	return reg, big, dial
}

func family(t *testing.T, reg *prometheus.Registry, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	if f := family(t, reg, name); f != nil {
		return f.GetMetric()[0].GetCounter().GetValue()
	}
	return 0
}

// TestNotReadyIsUnavailable: before there is a config to serve, a proxy is
// told to retry (UNAVAILABLE) rather than sent an empty one it would apply.
func TestNotReadyIsUnavailable(t *testing.T) {
	ready := &readyWhen{}
	c, ads, ctx := serve(t, server.Config{Hooks: ready})
	ask := func() (*discovery.DiscoveryResponse, error) {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		_ = s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType})
		return s.Recv()
	}
	if _, err := ask(); status.Code(err) != codes.Unavailable {
		t.Fatalf("before the mesh is loaded: %v, want UNAVAILABLE", err)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, map[string]types.Resource{"x": &clusterv3.Cluster{Name: "x"}}); err != nil {
		t.Fatal(err)
	}
	ready.Store(true)
	if resp, err := ask(); err != nil || len(resp.Resources) != 1 {
		t.Fatalf("once loaded: %v (%v), want the one cluster", resp, err)
	}
}

// readyWhen serves every proxy from class "all", ready once set.
type readyWhen struct {
	server.NoHooks
	atomic.Bool
}

func (r *readyWhen) OnReady() bool                     { return r.Load() }
func (r *readyWhen) OnClassify(*core.Node) cache.Class { return "all" }

// byNode puts every proxy in a class of its own, named by its node id.
type byNode struct{ server.NoHooks }

func (byNode) OnClassify(n *core.Node) cache.Class { return cache.Class(n.GetId()) }

// hooks serve every proxy from class "all", with the calls a test sets.
type hooks struct {
	server.NoHooks
	stream   func(context.Context) (context.Context, error)
	identity func(context.Context) string
	limit    int
}

func (hooks) OnClassify(*core.Node) cache.Class { return "all" }

func (h hooks) OnStream(ctx context.Context) (context.Context, error) {
	if h.stream != nil {
		return h.stream(ctx)
	}
	return ctx, nil
}

func (h hooks) OnIdentity(ctx context.Context) string {
	if h.identity != nil {
		return h.identity(ctx)
	}
	return ""
}

func (h hooks) OnResponseLimit(cache.Class) int { return h.limit }

// TestIdleClassesAreDropped: a class added for a proxy is dropped once no
// proxy has used it for ClassIdle, and added again when one comes back.
func TestIdleClassesAreDropped(t *testing.T) {
	c, ads, ctx := serve(t, server.Config{Hooks: byNode{}, ClassIdle: 100 * time.Millisecond, Log: testutil.Log(t)})

	open := func(id string) context.CancelFunc {
		sctx, stop := context.WithCancel(ctx)
		stream, err := ads.StreamAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id}, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		return stop
	}
	has := func(class cache.Class) bool { return slices.Contains(c.Classes(), class) }
	stopA := open("proxy-a")
	stopB := open("proxy-b")
	if !has("proxy-a") || !has("proxy-b") {
		t.Fatalf("classes %v, want one per proxy", c.Classes())
	}
	stopA()
	testutil.Eventually(t, 10*time.Second, "the class without a proxy is dropped", func() (bool, string) {
		return !has("proxy-a") && has("proxy-b"), fmt.Sprint(c.Classes())
	})
	time.Sleep(300 * time.Millisecond) // several idle periods: b is still used
	if !has("proxy-b") || !has("all") {
		t.Fatalf("classes %v, want proxy-b's and the one the cache was made with", c.Classes())
	}
	defer open("proxy-a")()
	if !has("proxy-a") {
		t.Fatalf("classes %v: a returning proxy's class was not added again", c.Classes())
	}
	stopB()
}

// TestSendersServeEveryStream: with one sender, and with a goroutine per
// stream writing (unlimited), every stream gets its first response and
// then, after its ACK, each change.
func TestSendersServeEveryStream(t *testing.T) {
	for _, senders := range []int{1, -1} {
		t.Run(fmt.Sprintf("senders=%d", senders), func(t *testing.T) {
			c, ads, ctx := serve(t, server.Config{MaxConcurrentPushes: senders})
			update := func(n int) {
				res := map[string]types.Resource{}
				for i := range n {
					name := fmt.Sprintf("cluster-%d", i)
					res[name] = &clusterv3.Cluster{Name: name}
				}
				if _, _, _, err := c.Update("all", resource.ClusterType, res); err != nil {
					t.Fatal(err)
				}
			}
			update(1)
			var streams []discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
			for i := range 20 {
				s, err := ads.StreamAggregatedResources(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprintf("p%d", i)}, TypeUrl: resource.ClusterType}); err != nil {
					t.Fatal(err)
				}
				streams = append(streams, s)
			}
			for round := 1; round <= 3; round++ {
				for i, s := range streams {
					resp, err := s.Recv()
					if err != nil {
						t.Fatalf("round %d, stream %d: %v", round, i, err)
					}
					if len(resp.Resources) != round {
						t.Fatalf("round %d, stream %d: %d clusters, want %d", round, i, len(resp.Resources), round)
					}
					if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
						t.Fatal(err)
					}
				}
				update(round + 1)
			}
		})
	}
}
