package e2e

import (
	"fmt"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/app"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestOneMuteProxyHoldsNoChangeBack: beside a proxy that never answers
// its responses and proxies that never read theirs, a grpc-go client still
// follows every change as it comes. The hold on a generation whose
// responses are still due is a minute here: were the mute proxy waited
// for, no change would reach the client within the test's wait.
func TestOneMuteProxyHoldsNoChangeBack(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{Tune: func(_ int, p *app.Pusher) {
		p.MaxHold = time.Minute
		p.XDS.MaxConcurrentPushes = 4
	}}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, a.addr, "RPCs reach backend a")

	// The mute proxy: asks for everything, never answers.
	mute, err := dialADS(t, cp.ads, nil).StreamAggregatedResources(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := mute.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "sidecar~10.0.0.66~mute.demo~demo.svc.cluster.local"}, TypeUrl: typ}); err != nil {
			t.Fatal(err)
		}
	}
	// Proxies that never read, on small windows.
	for range 20 {
		slow, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { slow.Close() })
		s, err := discovery.NewAggregatedDiscoveryServiceClient(slow).StreamAggregatedResources(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "sidecar~10.0.0.67~slow.demo~demo.svc.cluster.local"}, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
	}
	for i, to := range []backend{b, a, b} {
		writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", to)))
		allOn(t, conn, to.addr, fmt.Sprint("RPCs follow the endpoint's move ", i+1))
	}
}
