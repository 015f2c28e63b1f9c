package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
)

// blocking holds the callouts of proxies and classes whose name starts
// with "slow" until released, and says when each is entered.
type blocking struct {
	server.NoHooks
	c       *cache.Cache
	entered chan string
	release chan struct{}
}

func (b *blocking) hold(what string) {
	b.entered <- what
	<-b.release
}

func (b *blocking) OnNode(_ context.Context, n *core.Node) (*core.Node, error) {
	if n.GetId() == "slow-admit" {
		b.hold("admit")
	}
	return n, nil
}

func (b *blocking) OnClassify(n *core.Node) cache.Class { return cache.Class(n.GetId()) }

func (b *blocking) OnNewClass(class cache.Class) {
	if class == "slow-fill" {
		b.hold("fill")
	}
	_, _, _, _ = b.c.Update(class, resource.ClusterType, map[string]types.Resource{"c": &clusterv3.Cluster{Name: "c"}})
}

// TestCallsOutWithoutLocks: while the server waits on a callback (a
// proxy's admission, a class's fill), no lock of its own is held: the
// streams' status reads, and the proxies of other classes are admitted
// and served, a new class filled beside the one that waits.
func TestCallsOutWithoutLocks(t *testing.T) {
	c, err := cache.New(cache.Config{Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	b := &blocking{c: c, entered: make(chan string), release: make(chan struct{})}
	status := server.NewStreams()
	_, ads, ctx := serveCache(t, c, server.Config{Hooks: b, Streams: status})
	open := func(id string) (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		// A failed send shows in the Recv that follows.
		_ = s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id}, TypeUrl: resource.ClusterType})
		return s, nil
	}
	served := func(id string) error {
		s, err := open(id)
		if err != nil {
			return err
		}
		resp, err := s.Recv()
		if err != nil || len(resp.GetResources()) != 1 {
			return fmt.Errorf("%s while another waits: %v (%v), want its cluster", id, resp, err)
		}
		return nil
	}
	for _, slow := range []string{"slow-admit", "slow-fill"} {
		t.Run(slow, func(t *testing.T) {
			waiting, err := open(slow)
			if err != nil {
				t.Fatal(err)
			}
			what := <-b.entered
			within(t, "the streams' status", func() error { _ = status.Status(); return nil })
			within(t, "another proxy", func() error { return served("fast-" + what) })
			b.release <- struct{}{}
			if resp, err := waiting.Recv(); err != nil || len(resp.GetResources()) != 1 {
				t.Fatalf("%s once released: %v (%v)", slow, resp, err)
			}
		})
	}
}

// within runs f, failing the test if it has not returned in 30s (it
// waits on a lock the server should not hold).
func within(t *testing.T, what string, f func() error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s waited on a callback another stream is in", what)
	}
}
