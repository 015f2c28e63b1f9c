package app_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

const shopService = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: cart, namespace: shop}
spec:
  hosts: [cart.shop.svc.cluster.local]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.5.0.1}]
`

const demoSidecar = `
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: demo}
spec:
  egress:
  - hosts: ["./*"]
`

// TestSidecarScopesWhatAProxySees: a Sidecar limiting namespace demo to its
// own services puts demo's proxies in a class of their own that holds only
// demo's clusters; proxies elsewhere keep seeing the whole mesh.
func TestSidecarScopesWhatAProxySees(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), shopService, demoSidecar))
	cp := startControlPlane(t, yamlSource(dir))
	conn, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)

	// clusters asks for every cluster as ns's Envoy would, until cond holds.
	clusters := func(ns string, cond func([]string) bool) []string {
		t.Helper()
		meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "LABELS": map[string]any{"app": "x"}})
		node := &core.Node{Id: fmt.Sprintf("sidecar~10.0.0.1~x.%s~%s.svc.cluster.local", ns, ns), Metadata: meta}
		var last []string
		testutil.Eventually(t, 20*time.Second, "clusters for a proxy in "+ns, func() (bool, string) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			s, err := ads.StreamAggregatedResources(ctx)
			if err != nil {
				return false, err.Error()
			}
			if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
				return false, err.Error()
			}
			resp, err := s.Recv()
			if err != nil {
				return false, err.Error()
			}
			last = nil
			for _, r := range resp.Resources {
				m, _ := r.UnmarshalNew()
				// Service clusters only, not the passthrough and black hole.
				if name := m.(interface{ GetName() string }).GetName(); strings.HasPrefix(name, "outbound|") {
					last = append(last, name)
				}
			}
			slices.Sort(last)
			return cond(last), fmt.Sprint(last)
		})
		return last
	}
	greeter, cart := "outbound|50051||greeter.demo.svc.cluster.local", "outbound|8080||cart.shop.svc.cluster.local"
	got := clusters("shop", func(c []string) bool { return len(c) == 2 })
	if !slices.Equal(got, []string{greeter, cart}) {
		t.Errorf("a proxy in shop sees %v, want both services", got)
	}
	got = clusters("demo", func(c []string) bool { return len(c) > 0 })
	if !slices.Equal(got, []string{greeter}) {
		t.Errorf("a proxy in demo, whose Sidecar allows ./*, sees %v, want only %s", got, greeter)
	}
	// Widening the Sidecar reaches the class's proxies.
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), shopService,
		`
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: demo}
spec:
  egress:
  - hosts: ["./*", "shop/cart.shop.svc.cluster.local"]
`))
	clusters("demo", func(c []string) bool { return slices.Equal(c, []string{greeter, cart}) })
}

// TestConnectedProxyMovesToItsNewClass: a proxy connected before a Sidecar
// applies to it is moved to the Sidecar's class when the Sidecar appears.
func TestConnectedProxyMovesToItsNewClass(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), shopService))
	cp := startControlPlane(t, yamlSource(dir))
	conn, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rx := receive(s)
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo"})
	req := &discovery.DiscoveryRequest{Node: &core.Node{Id: "sidecar~10.0.0.2~early.demo~demo.svc.cluster.local", Metadata: meta}, TypeUrl: resource.ClusterType}
	services := func(resp *discovery.DiscoveryResponse) []string {
		var out []string
		for _, r := range resp.Resources {
			m, _ := r.UnmarshalNew()
			if name := m.(interface{ GetName() string }).GetName(); strings.HasPrefix(name, "outbound|") {
				out = append(out, name)
			}
		}
		slices.Sort(out)
		return out
	}
	// ACK until both services are there.
	for {
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		req = &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		if len(services(resp)) == 2 {
			break
		}
	}
	if err := s.Send(req); err != nil {
		t.Fatal(err)
	}
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), shopService, demoSidecar))
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := rx.next(time.Until(deadline))
		if err != nil {
			t.Fatalf("the connected proxy never got its Sidecar's view: %v", err)
		}
		if got := services(resp); slices.Equal(got, []string{"outbound|50051||greeter.demo.svc.cluster.local"}) {
			return
		}
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
}
