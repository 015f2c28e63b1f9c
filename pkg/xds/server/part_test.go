package server_test

import (
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
)

// TestDeltaResponsesPastTheLimitGoInParts: past Config.DeltaResponseBytes,
// a Delta stream is sent a large change of virtual hosts in parts, each after its answer,
// and a change made meanwhile in the next part, ahead of the large
// change's rest; the parts bring everything, and nothing comes without an
// answer; the parts with a rest hold no generation. Clusters go whole.
func TestDeltaResponsesPastTheLimitGoInParts(t *testing.T) {
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.VirtualHostType, resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	_, ads, ctx := serveCache(t, c, server.Config{DeltaResponseBytes: 4 << 10})
	all := map[string]types.Resource{}
	for i := range 200 {
		name := fmt.Sprintf("bulk-%03d", i)
		all[name] = &routev3.VirtualHost{Name: name, Domains: []string{fmt.Sprintf("h%0200d", i)}}
	}
	if _, _, _, err := c.Update("all", resource.VirtualHostType, all); err != nil {
		t.Fatal(err)
	}
	s, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.VirtualHostType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	rx := receive(s)
	seen := map[string]bool{}
	parts := 0
	for len(seen) < len(all) {
		resp, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatalf("after %d parts and %d of %d clusters: %v", parts, len(seen), len(all), err)
		}
		parts++
		for _, r := range resp.Resources {
			seen[r.Name] = true
		}
		// Its part is written after the server counted it: a part with a
		// rest is in the backlog and holds no generation (a change made
		// meanwhile goes ahead of the rest anyway); the last part holds
		// the next generation until it is answered, as any response.
		if len(seen) < len(all) && (c.Backlog() == 0 || c.Holding() != 0) {
			t.Errorf("part %d with a rest: backlog %d, holding %d; want some and none", parts, c.Backlog(), c.Holding())
		}
		if len(seen) == len(all) && c.Holding() == 0 {
			t.Errorf("the last part, unanswered, holds no generation")
		}
		if parts == 1 {
			// Unanswered, the first part is all there is.
			if more, err := rx.next(200 * time.Millisecond); err == nil {
				t.Fatalf("a second part before the first was answered: %d resources", len(more.Resources))
			}
			// A change made now goes in the next part.
			all["late"] = &routev3.VirtualHost{Name: "late", Domains: []string{"late"}}
			if _, _, _, err := c.Update("all", resource.VirtualHostType, all); err != nil {
				t.Fatal(err)
			}
		}
		if parts == 2 && !seen["late"] {
			t.Errorf("the change made after the first part is not in the second: %d resources", len(resp.Resources))
		}
		if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.VirtualHostType, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
	if parts < 5 {
		t.Errorf("%d virtual hosts of about 220 bytes came in %d parts of at most 4 KiB", len(all), parts)
	}
	// Clusters go whole, whatever their size: a route that names one
	// must find it.
	clusters := map[string]types.Resource{}
	for i := range 200 {
		name := fmt.Sprintf("c-%03d", i)
		clusters[name] = &clusterv3.Cluster{Name: name, AltStatName: fmt.Sprintf("%0200d", i)}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if resp.TypeUrl == resource.ClusterType {
			if len(resp.Resources) != len(clusters) {
				t.Errorf("clusters in a response of %d, want all %d at once", len(resp.Resources), len(clusters))
			}
			break
		}
	}
}

// deltaReceiver reads a Delta stream's responses in one goroutine, so that
// waiting for one with a deadline never loses the next.
type deltaReceiver struct {
	ch chan *discovery.DeltaDiscoveryResponse
}

func receive(s discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient) *deltaReceiver {
	r := &deltaReceiver{ch: make(chan *discovery.DeltaDiscoveryResponse, 16)}
	go func() {
		defer close(r.ch)
		for {
			resp, err := s.Recv()
			if err != nil {
				return
			}
			r.ch <- resp
		}
	}()
	return r
}

// next returns the next response, or an error if none came within d.
func (r *deltaReceiver) next(d time.Duration) (*discovery.DeltaDiscoveryResponse, error) {
	select {
	case resp, ok := <-r.ch:
		if !ok {
			return nil, fmt.Errorf("stream ended")
		}
		return resp, nil
	case <-time.After(d):
		return nil, fmt.Errorf("no response within %v", d)
	}
}
