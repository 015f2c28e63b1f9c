package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestEnvoySidecarGetsOutboundConfig asks the pusher for what an Envoy
// sidecar asks for — wildcard listeners and clusters over SotW and Delta
// ADS — and checks that sidecars and proxyless clients get their own
// listeners.
func TestEnvoySidecarGetsOutboundConfig(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads := dialADS(t, cp.ads, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	sidecar := &core.Node{Id: "sidecar~10.0.0.5~app-1.demo~demo.svc.cluster.local"}
	grpcMeta, _ := structpb.NewStruct(map[string]any{"GENERATOR": "grpc"})
	proxyless := &core.Node{Id: "sidecar~10.0.0.6~client.demo~demo.svc.cluster.local", Metadata: grpcMeta}

	// SotW: the first response may come before the mesh is loaded; ACK
	// and wait for the next until the listener is there. A stream the
	// pusher ends because the proxy's class changed as the mesh loaded is
	// opened again, as Envoy does.
	sotw := func(node *core.Node, typeURL string, want string) []string {
		t.Helper()
		stream, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = stream.CloseSend() }()
		req := &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL}
		for {
			if err := stream.Send(req); err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
				if stream, err = ads.StreamAggregatedResources(ctx); err != nil {
					t.Fatal(err)
				}
				req = &discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL}
				continue
			}
			if err != nil {
				t.Fatalf("%s %s: %v", node.Id, typeURL, err)
			}
			var names []string
			for _, r := range resp.Resources {
				m, err := r.UnmarshalNew()
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, m.(interface{ GetName() string }).GetName())
			}
			if slices.Contains(names, want) {
				return names
			}
			req = &discovery.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		}
	}
	if got := sotw(sidecar, resource.ListenerType, "0.0.0.0_50051"); !slices.Equal(sorted(got), []string{"0.0.0.0_50051", "virtualInbound", "virtualOutbound"}) {
		t.Errorf("sidecar listeners %v, want the outbound 0.0.0.0_50051 and the two virtual listeners", got)
	}
	// A proxyless class holds its clients' API listeners and its servers'
	// listeners, one per served port and wildcard address.
	got := sotw(proxyless, resource.ListenerType, "greeter.demo.svc.cluster.local:50051")
	api := slices.DeleteFunc(slices.Clone(got), func(n string) bool {
		return strings.HasPrefix(n, "grpc/server?xds.resource.listening_address=") || strings.HasPrefix(n, "xds.istio.io/grpc/lds/inbound/")
	})
	if !slices.Equal(api, []string{"greeter.demo.svc.cluster.local:50051"}) || !slices.Contains(got, "grpc/server?xds.resource.listening_address=[::]:50051") {
		t.Errorf("proxyless listeners %v, want the API listener and the servers' listeners", got)
	}

	// Delta: a wildcard cluster subscription.
	delta, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer delta.CloseSend()
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: sidecar, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := delta.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range resp.Resources {
		names = append(names, r.Name)
		if r.Version == "" {
			t.Errorf("delta resource %s has no version", r.Name)
		}
	}
	if !slices.Contains(names, "outbound|50051||greeter.demo.svc.cluster.local") {
		t.Errorf("delta clusters %v, want the greeter's", names)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
