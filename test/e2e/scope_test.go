package e2e

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
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
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads := dialADS(t, cp.ads, nil)

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
	// Until the Sidecar is loaded, a proxy in demo may see every service.
	got = clusters("demo", func(c []string) bool { return slices.Equal(c, []string{greeter}) })
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

// TestConnectedProxyMovesToItsNewClass: when a Sidecar comes to apply to a
// connected proxy, its stream is ended; it reconnects saying what it holds
// and is sent only what differs in its new class. Both for SotW and Delta.
func TestConnectedProxyMovesToItsNewClass(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), shopService))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads := dialADS(t, cp.ads, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": "demo"})
	sotwNode := &core.Node{Id: "sidecar~10.0.0.2~early.demo~demo.svc.cluster.local", Metadata: meta}
	deltaNode := &core.Node{Id: "sidecar~10.0.0.3~early-delta.demo~demo.svc.cluster.local", Metadata: meta}
	greeterOnly := []string{"outbound|50051||greeter.demo.svc.cluster.local"}

	sotwRx, req := ackedBoth(t, ads, ctx, sotwNode)
	// Delta: the whole mesh's clusters, ACKed. A stream the server ends
	// before answering (a busy machine has seen it) is opened again, as a
	// proxy would; whether it was answered is read from Recv, not Send.
	var delta grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]
	var deltaRx *receiver[*discovery.DeltaDiscoveryResponse]
	var first *discovery.DeltaDiscoveryResponse
	testutil.Eventually(t, 20*time.Second, "a Delta stream answered", func() (bool, string) {
		var err error
		if delta, err = ads.DeltaAggregatedResources(ctx); err != nil {
			return false, err.Error()
		}
		deltaRx = receive(delta)
		_ = delta.Send(&discovery.DeltaDiscoveryRequest{Node: deltaNode, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}})
		if first, err = deltaRx.next(10 * time.Second); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	held := map[string]string{}
	for _, r := range first.Resources {
		held[r.Name] = r.Version
	}
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: first.Nonce}); err != nil {
		t.Fatal(err)
	}
	if got := outbound(slices.Collect(maps.Keys(held))); len(got) != 2 {
		t.Fatalf("delta proxy holds %v, want both services", got)
	}

	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), shopService, demoSidecar))

	// Both streams end; each proxy reconnects as Envoy would.
	for what, rx := range map[string]interface{ next(time.Duration) error }{
		"sotw": drain[*discovery.DiscoveryResponse]{sotwRx}, "delta": drain[*discovery.DeltaDiscoveryResponse]{deltaRx}} {
		if err := rx.next(10 * time.Second); err == nil {
			t.Fatalf("%s: the stream of a proxy whose class changed was not ended", what)
		}
	}
	sotw, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sotwRx = receive(sotw)
	req.Node, req.ResponseNonce = sotwNode, ""
	if err := sotw.Send(req); err != nil {
		t.Fatal(err)
	}
	resp, err := sotwRx.next(10 * time.Second)
	if err != nil {
		t.Fatalf("sotw: nothing after reconnecting: %v", err)
	}
	if got := outbound(names(resp.Resources)); !slices.Equal(got, greeterOnly) {
		t.Errorf("sotw: after reconnecting the proxy got %v, want the Sidecar's view %v", got, greeterOnly)
	}

	delta, err = ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deltaRx = receive(delta)
	if err := delta.Send(&discovery.DeltaDiscoveryRequest{Node: deltaNode, TypeUrl: resource.ClusterType,
		ResourceNamesSubscribe: []string{"*"}, InitialResourceVersions: held}); err != nil {
		t.Fatal(err)
	}
	dresp, err := deltaRx.next(10 * time.Second)
	if err != nil {
		t.Fatalf("delta: nothing after reconnecting: %v", err)
	}
	if len(dresp.Resources) != 0 || !slices.Equal(outbound(dresp.RemovedResources), []string{"outbound|8080||cart.shop.svc.cluster.local"}) {
		t.Errorf("delta: after reconnecting: %d resources %v, removed %v; want only the cart cluster removed",
			len(dresp.Resources), names2(dresp.Resources), dresp.RemovedResources)
	}
}

// outbound keeps the outbound clusters' names, sorted.
func outbound(names []string) []string {
	names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !strings.HasPrefix(n, "outbound|") })
	slices.Sort(names)
	return names
}

// names are the names of resources.
func names(rs []*anypb.Any) []string {
	var out []string
	for _, r := range rs {
		m, _ := r.UnmarshalNew()
		out = append(out, m.(interface{ GetName() string }).GetName())
	}
	return out
}

// ackedBoth opens a SotW stream for node's clusters and ACKs until both
// services are there; it returns the stream's receiver and its last ACK.
func ackedBoth(t *testing.T, ads discovery.AggregatedDiscoveryServiceClient, ctx context.Context, node *core.Node) (*receiver[*discovery.DiscoveryResponse], *discovery.DiscoveryRequest) {
	t.Helper()
	sotw, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rx := receive(sotw)
	req := &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}
	for {
		if err := sotw.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		req = &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		if len(outbound(names(resp.Resources))) == 2 {
			break
		}
	}
	if err := sotw.Send(req); err != nil {
		t.Fatal(err)
	}
	return rx, req
}

// drain waits for a stream's end, skipping responses.
type drain[T any] struct{ rx *receiver[T] }

func (d drain[T]) next(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := d.rx.next(time.Until(deadline)); err != nil {
			if err.Error() == "stream ended" {
				return errors.New("ended")
			}
			return nil
		}
	}
}

func names2(rs []*discovery.Resource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Name)
	}
	return out
}
