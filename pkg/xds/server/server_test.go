package server_test

import (
	"context"
	"net"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// TestStreamRateLimit: past the rate, new streams are told to retry with
// UNAVAILABLE instead of all being served at once; streams already open
// are not affected.
func TestStreamRateLimit(t *testing.T) {
	c, err := cache.New(cache.Config{Classes: []string{"all"}, Types: []string{resource.ClusterType},
		Classify: func(*core.Node) string { return "all" }})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Cache: c.Server(), StreamRate: 0.001})
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
	defer func() { cancel(); <-done }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	open := func() error {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType}); err != nil {
			return err
		}
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
