package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/app"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
)

// receiver reads a stream's responses in one goroutine, so that waiting
// for one with a deadline never loses the next.
type receiver[T any] struct{ ch chan T }

func receive[T any](stream interface{ Recv() (T, error) }) *receiver[T] {
	r := &receiver[T]{ch: make(chan T, 16)}
	go func() {
		defer close(r.ch)
		for {
			v, err := stream.Recv()
			if err != nil {
				return
			}
			r.ch <- v
		}
	}()
	return r
}

// next returns the next response, or an error if none came within d.
func (r *receiver[T]) next(d time.Duration) (T, error) {
	select {
	case v, ok := <-r.ch:
		if !ok {
			var zero T
			return zero, errors.New("stream ended")
		}
		return v, nil
	case <-time.After(d):
		var zero T
		return zero, errors.New("no response")
	}
}

// TestNACKedConfigIsNotResent: a proxy that rejects what it was sent is not
// sent the same thing again (go-control-plane's own caches can re-send a
// NACKed response in a loop); the next real change does reach it. Both for
// SotW and Delta, and for a proxy that never ACKed anything.
func TestNACKedConfigIsNotResent(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn) // and CSDS, on the same port
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nack := &status.Status{Code: int32(codes.InvalidArgument), Message: "rejected by test"}
	const silence = 700 * time.Millisecond // well past the debounce of a real change

	// Wait until the mesh is loaded, so that later responses come only
	// from NACKs or changes.
	waitForCluster := func(node *core.Node) {
		t.Helper()
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.CloseSend()
		rx := receive(s)
		req := &discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}
		for {
			if err := s.Send(req); err != nil {
				t.Fatal(err)
			}
			resp, err := rx.next(20 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Resources) > 0 {
				return
			}
			req = &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		}
	}
	waitForCluster(&core.Node{Id: "sidecar~10.0.0.9~probe.demo~demo.svc.cluster.local"})
	cp.settled(t) // nothing else is on its way: any response now would be a resend

	t.Run("sotw", func(t *testing.T) {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer s.CloseSend()
		rx := receive(s)
		node := &core.Node{Id: "sidecar~10.0.0.7~nacker.demo~demo.svc.cluster.local"}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		resp, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		// NACK without ever having ACKed: version_info stays empty.
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce, ErrorDetail: nack}); err != nil {
			t.Fatal(err)
		}
		if again, err := rx.next(silence); err == nil {
			t.Fatalf("the NACKed version was sent again (version %s)", again.VersionInfo)
		}
		nackReported(t, cp, conn, node, resp.VersionInfo)
		writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b), greeterSplit))
		next, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatalf("the next real change did not reach the proxy: %v", err)
		}
		if next.VersionInfo == resp.VersionInfo {
			t.Errorf("got version %s again, want a new one", next.VersionInfo)
		}
	})

	t.Run("delta", func(t *testing.T) { nackedDelta(t, ads, dir, nack, silence) })
}

// nackedDelta: a Delta proxy that NACKs its clusters is never sent them
// again at the version it rejected; the next real change reaches it.
func nackedDelta(t *testing.T, ads discovery.AggregatedDiscoveryServiceClient, dir string, nack *status.Status, silence time.Duration) {
	ctx := t.Context()
	s, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseSend()
	rx := receive(s)
	node := &core.Node{Id: "sidecar~10.0.0.8~dnacker.demo~demo.svc.cluster.local"}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rx.next(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce, ErrorDetail: nack}); err != nil {
		t.Fatal(err)
	}
	// What arrives now can only be a later change (the SotW subtest's
	// edit may still be on its way): never what was rejected.
	nacked := map[string]string{}
	for _, r := range resp.Resources {
		nacked[r.Name] = r.Version
	}
	for {
		again, err := rx.next(silence)
		if err != nil {
			break
		}
		for _, r := range again.Resources {
			if nacked[r.Name] == r.Version {
				t.Fatalf("resource %s was sent again at the version the proxy rejected (%s)", r.Name, r.Version)
			}
		}
		if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: again.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
	writeMesh(t, dir, "other.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: other, namespace: demo}
spec:
  hosts: [other.demo.svc.cluster.local]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.9.0.1}]
`)
	if _, err := rx.next(10 * time.Second); err != nil {
		t.Fatalf("the next real change did not reach the proxy: %v", err)
	}
}

// nackReported checks that a proxy's NACK of its clusters at version is
// reported everywhere an operator looks: /debug/syncz, /debug/config_dump
// and CSDS on the ADS port (conn), which refuses a request for every proxy
// past its bound.
func nackReported(t *testing.T, cp *Cluster, conn *grpc.ClientConn, node *core.Node, version string) {
	t.Helper()
	ctx := t.Context()
	// The NACK is recorded for /debug/syncz.
	rec := httptest.NewRecorder()
	cp.status.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/syncz?proxy="+node.Id, nil))
	var streams []server.StreamStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &streams); err != nil {
		t.Fatal(err)
	}
	if len(streams) != 1 || streams[0].Types["Cluster"].LastNACK == nil ||
		streams[0].Types["Cluster"].LastNACK.Version != version || streams[0].Types["Cluster"].LastNACK.Message != "rejected by test" {
		t.Errorf("/debug/syncz does not record the NACK of %s: %s", version, rec.Body)
	}
	// And /debug/config_dump shows what the proxy's class holds.
	rec = httptest.NewRecorder()
	cp.dump.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/config_dump?proxy="+node.Id, nil))
	var dump struct {
		Class     string                       `json:"class"`
		Resources map[string][]json.RawMessage `json:"resources"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &dump); err != nil {
		t.Fatalf("config_dump: %v: %s", err, rec.Body)
	}
	if dump.Class != "envoy/demo/" || len(dump.Resources["Cluster"]) == 0 || len(dump.Resources["ClusterLoadAssignment"]) == 0 {
		t.Errorf("config_dump for %s: class %q, %d clusters, %d assignments", node.Id, dump.Class, len(dump.Resources["Cluster"]), len(dump.Resources["ClusterLoadAssignment"]))
	}
	// And Envoy's CSDS on the ADS port says the clusters were NACKed.
	cs, err := statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(ctx, &statusv3.ClientStatusRequest{
		NodeMatchers: []*matcherv3.NodeMatcher{{NodeId: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: node.Id}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.Config) != 1 || len(cs.Config[0].GenericXdsConfigs) == 0 || cs.Config[0].GenericXdsConfigs[0].ClientStatus != adminv3.ClientResourceStatus_NACKED {
		t.Errorf("CSDS for %s: %v, want its clusters NACKED", node.Id, cs)
	}
	// A request for every proxy is refused past the bound, and says
	// how to ask instead.
	if _, err := (&app.CSDS{Dump: cp.dump, MaxUnmatched: -1}).FetchClientStatus(ctx, &statusv3.ClientStatusRequest{}); grpcstatus.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "node matchers") {
		t.Errorf("CSDS for every proxy past the bound: %v, want FailedPrecondition naming node matchers", err)
	}
	// A response past the size bound is refused, measured before it is
	// built.
	if _, err := (&app.CSDS{Dump: cp.dump, MaxBytes: 64}).FetchClientStatus(ctx, &statusv3.ClientStatusRequest{}); grpcstatus.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), "would exceed") {
		t.Errorf("CSDS past its size bound: %v, want ResourceExhausted", err)
	}
}
