package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// byCluster serves each proxy from the class its node's cluster names.
type byCluster struct{ server.NoHooks }

func (byCluster) OnClassify(n *core.Node) cache.Class { return cache.Class(n.GetCluster()) }

// TestStreamsUnderChurn is the concurrency contract (see the package doc)
// under load, for the race detector: 2,000 streams over 8 connections, in
// 4 classes, SotW and Delta, named and wildcard, subscribing, changing
// their names, unsubscribing, ACKing and NACKing, ending abruptly and
// coming back, while a generator updates every class without pause and
// the status page reads every stream. Then every stream, as a client
// sees it, reaches the last generation, and once they are gone the
// server holds no stream, no backlog and no name.
func TestStreamsUnderChurn(t *testing.T) { churnTest(t, clusterKind, 0, 2000) }

// TestStreamsUnderChurnInParts is TestStreamsUnderChurn with virtual hosts,
// and Delta responses of a couple of them at most (see
// Config.DeltaResponseBytes): the parts left when a stream ends, changes
// its names or is sent a newer generation are neither lost nor held.
func TestStreamsUnderChurnInParts(t *testing.T) { churnTest(t, virtualHostKind, 64, 1000) }

// kind is the type a churn test serves: its resources carry the
// generation that made them.
type kind struct {
	typeURL string
	make    func(name, generation string) types.Resource
	read    func(a *anypb.Any) (name, generation string, err error)
}

var (
	clusterKind = kind{resource.ClusterType,
		func(name, g string) types.Resource { return &clusterv3.Cluster{Name: name, AltStatName: g} },
		func(a *anypb.Any) (string, string, error) {
			var cl clusterv3.Cluster
			err := a.UnmarshalTo(&cl)
			return cl.Name, cl.AltStatName, err
		}}
	virtualHostKind = kind{resource.VirtualHostType,
		func(name, g string) types.Resource {
			return &routev3.VirtualHost{Name: name, Domains: []string{"g" + g}}
		},
		func(a *anypb.Any) (string, string, error) {
			var vh routev3.VirtualHost
			if err := a.UnmarshalTo(&vh); err != nil || len(vh.Domains) != 1 {
				return "", "", fmt.Errorf("virtual host %v: %v", vh.Name, err)
			}
			return vh.Name, vh.Domains[0][1:], nil
		}}
)

func churnTest(t *testing.T, k kind, partBytes, streams int) {
	rounds := 4
	if testing.Short() {
		streams /= 5
	}
	const (
		classes  = 4
		conns    = 8
		clusters = 12
	)
	typeURL := k.typeURL
	var names []cache.Class
	for i := range classes {
		names = append(names, cache.Class(fmt.Sprint("c", i)))
	}
	c, err := cache.New(cache.Config{Classes: names, Types: []string{typeURL}})
	if err != nil {
		t.Fatal(err)
	}
	generation := func(g string, n int) {
		for _, class := range names {
			res := map[string]types.Resource{}
			for j := range n {
				name := fmt.Sprint("c", j)
				res[name] = k.make(name, g)
			}
			if _, _, _, err := c.Update(class, typeURL, res); err != nil {
				t.Error(err)
			}
		}
	}
	generation("0", clusters)
	reg := prometheus.NewRegistry()
	status := server.NewStreams()
	addr, ctx := serveOn(t, c, server.Config{Hooks: byCluster{}, Registerer: reg, Streams: status, MaxStreamsPerConnection: 1000,
		DeltaResponseBytes: partBytes})
	var ads []discovery.AggregatedDiscoveryServiceClient
	for range conns {
		ads = append(ads, dialADS(t, addr))
	}

	// The generator, and the status page's reader.
	stop, stopped := make(chan struct{}), make(chan struct{})
	var generations atomic.Int64
	go func() {
		defer close(stopped)
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			generation(strconv.Itoa(i), clusters/2+i%(clusters/2+1))
			generations.Add(1)
		}
	}()
	reading := make(chan struct{})
	go func() {
		defer close(reading)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				_ = status.Status()
			}
		}
	}()

	// The churn, then each stream held open until it has the last
	// generation; the generator runs until every stream has churned.
	var churned, wg sync.WaitGroup
	errs := make(chan error, streams)
	for i := range streams {
		churned.Add(1)
		wg.Go(func() {
			p := churner{ads: ads[i%conns], node: &core.Node{Id: fmt.Sprint("p", i), Cluster: string(names[i%classes])}, rng: rand.New(rand.NewPCG(uint64(i), 1)), k: k}
			// The generator runs while the streams churn: one the
			// server forgot would wait for its responses until the
			// deadline.
			wctx, cancel := context.WithTimeout(ctx, 90*time.Second)
			defer cancel()
			for round := range rounds {
				sctx, cancel := context.WithCancel(wctx)
				p.churn(sctx, i+round)
				cancel()
			}
			churned.Done()
			if wctx.Err() != nil {
				errs <- fmt.Errorf("%s: a churning stream was sent nothing for 90 s while the tables changed", p.node.Id)
				return
			}
			errs <- p.follow(wctx, i%2 == 0)
		})
	}
	churned.Wait()
	close(stop)
	<-stopped
	<-reading
	t.Logf("%d streams churned through %d generations", streams, generations.Load())
	generation("last", clusters)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	testutil.Eventually(t, 30*time.Second, "no stream, backlog or name held once the streams are gone", func() (bool, string) {
		open, held := len(status.Status()), held(t, reg)
		return open == 0 && c.Backlog() == 0 && held == 0, fmt.Sprint(open, " streams, backlog ", c.Backlog(), ", ", held, " bytes of names")
	})
}

// churner is one proxy coming and going.
type churner struct {
	ads  discovery.AggregatedDiscoveryServiceClient
	node *core.Node
	rng  *rand.Rand
	k    kind
}

// someNames returns a few of the clusters' names, c0 (which every
// generation holds and changes) always among them: a stream that asks for
// them is sent something at each generation.
func (p *churner) someNames() []string {
	out := []string{"c0"}
	for j := 1; j < 12; j++ {
		if p.rng.IntN(3) == 0 {
			out = append(out, fmt.Sprint("c", j))
		}
	}
	return out
}

// churn opens a stream and, for a few responses, answers (ACK or NACK) and
// changes what it asks for; it returns with the stream open (the caller
// ends it) or ended by the server.
func (p *churner) churn(ctx context.Context, seed int) {
	if seed%2 == 0 {
		s, err := p.ads.StreamAggregatedResources(ctx)
		if err != nil || s.Send(&discovery.DiscoveryRequest{Node: p.node, TypeUrl: p.k.typeURL, ResourceNames: p.someNames()}) != nil {
			return
		}
		for range 1 + p.rng.IntN(4) {
			resp, err := s.Recv()
			if err != nil {
				return
			}
			req := &discovery.DiscoveryRequest{TypeUrl: p.k.typeURL, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce, ResourceNames: p.someNames()}
			if p.rng.IntN(8) == 0 {
				req.VersionInfo, req.ErrorDetail = "", status.New(codes.InvalidArgument, "refused").Proto()
			}
			if s.Send(req) != nil {
				return
			}
		}
		return
	}
	s, err := p.ads.DeltaAggregatedResources(ctx)
	if err != nil || s.Send(&discovery.DeltaDiscoveryRequest{Node: p.node, TypeUrl: p.k.typeURL, ResourceNamesSubscribe: p.someNames()}) != nil {
		return
	}
	for range 1 + p.rng.IntN(4) {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: p.k.typeURL, ResponseNonce: resp.Nonce,
			ResourceNamesSubscribe: p.someNames(), ResourceNamesUnsubscribe: p.someNames()[1:]}
		if s.Send(req) != nil {
			return
		}
	}
}

// follow opens a stream for every cluster (SotW with the wildcard, or
// Delta naming them all) and ACKs what it is sent until it holds the last
// generation of every cluster.
func (p *churner) follow(ctx context.Context, sotw bool) error {
	held := map[string]string{} // cluster → its generation
	complete := func() bool {
		if len(held) != 12 {
			return false
		}
		for _, g := range held {
			if g != "last" {
				return false
			}
		}
		return true
	}
	if sotw {
		s, err := p.ads.StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: p.node, TypeUrl: p.k.typeURL}); err != nil {
			return err
		}
		for !complete() {
			resp, err := s.Recv()
			if err != nil {
				return fmt.Errorf("%s (SotW): %v, holding %v", p.node.Id, err, held)
			}
			if p.k.typeURL == resource.ClusterType {
				clear(held) // a full state
			}
			for _, a := range resp.Resources {
				name, g, err := p.k.read(a)
				if err != nil {
					return err
				}
				held[name] = g
			}
			if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: p.k.typeURL, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
				return err
			}
		}
		return nil
	}
	s, err := p.ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	var all []string
	for j := range 12 {
		all = append(all, fmt.Sprint("c", j))
	}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: p.node, TypeUrl: p.k.typeURL, ResourceNamesSubscribe: all}); err != nil {
		return err
	}
	for !complete() {
		resp, err := s.Recv()
		if err != nil {
			return fmt.Errorf("%s (Delta): %v, holding %v", p.node.Id, err, held)
		}
		for _, r := range resp.Resources {
			name, g, err := p.k.read(r.Resource)
			if err != nil {
				return err
			}
			held[name] = g
		}
		for _, name := range resp.RemovedResources {
			delete(held, name)
		}
		if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: p.k.typeURL, ResponseNonce: resp.Nonce}); err != nil {
			return err
		}
	}
	return nil
}
