package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLargeEndpointSetReachesTheProxy: a ServiceEntry whose endpoints
// encode to more than NATS takes in one message (about 1.1 MB) is stored
// in chunks; the proxy is served one load assignment holding every
// endpoint.
func TestLargeEndpointSetReachesTheProxy(t *testing.T) {
	const n = 60000
	var b strings.Builder
	b.WriteString(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: big, namespace: demo}
spec:
  hosts: [big.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints:
`)
	for i := range n {
		fmt.Fprintf(&b, "  - {address: 10.%d.%d.%d}\n", i>>16, (i>>8)&255, i&255)
	}
	dir := t.TempDir()
	writeMesh(t, dir, "big.yaml", b.String())
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads := dialADS(t, cp.ads, nil)
	name := generate.ClusterName(80, "", "big.example.com")
	testutil.Eventually(t, 30*time.Second, "the proxy is served every endpoint", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return false, err.Error()
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "sidecar~10.0.0.1~a.demo~demo.svc.cluster.local"},
			TypeUrl: resource.EndpointType, ResourceNames: []string{name}}); err != nil {
			return false, err.Error()
		}
		resp, err := s.Recv()
		if err != nil {
			return false, err.Error()
		}
		if len(resp.Resources) != 1 {
			return false, fmt.Sprintf("%d load assignments", len(resp.Resources))
		}
		var cla endpoint.ClusterLoadAssignment
		if err := resp.Resources[0].UnmarshalTo(&cla); err != nil {
			return false, err.Error()
		}
		got := 0
		for _, l := range cla.Endpoints {
			got += len(l.LbEndpoints)
		}
		return got == n, fmt.Sprintf("%d endpoints", got)
	})
	chunks, err := cp.etcd.Get(context.Background(), "/mesh/v1/endpoints/demo/big/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if chunks.Count < 2 {
		t.Errorf("the endpoints are stored as %d object(s); the test means them to be split", chunks.Count)
	}
}
