package server_test

import (
	"context"
	"fmt"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TestNameFloodIsBoundedInHeap: 20 Delta streams of one identity, each on
// a connection of its own, each asking for 50,000 made-up names of a
// kilobyte (a thousand a request), with the server's default limits. The
// identity holds at most its budget of names, every flooding stream is
// refused with RESOURCE_EXHAUSTED, the heap in use never grows past what
// the budget explains, another identity's proxy is served a change while
// the flood goes on, and once the flood ends the server holds nothing of
// it. Before the budgets, such a flood took the heap to 1.65 GB.
func TestNameFloodIsBoundedInHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("a gigabyte of names asked for")
	}
	const (
		streams   = 20
		perStream = 50_000
		batch     = 1_000
	)
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	version := 0
	update := func() {
		version++
		if _, _, _, err := c.Update("all", resource.ClusterType, map[string]types.Resource{
			"real": &clusterv3.Cluster{Name: "real", AltStatName: fmt.Sprint(version)}}); err != nil {
			t.Fatal(err)
		}
	}
	update()
	reg := prometheus.NewRegistry()
	addr, ctx := serveOn(t, c, server.Config{Registerer: reg, Hooks: hooks{identity: identityHeader}})
	const perIdentity = 64 << 20 // NameBudget's default

	// The victim: a proxy of another identity, holding every cluster.
	vctx, stopVictim := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "x-identity", "victim"))
	defer stopVictim()
	victim, err := dialADS(t, addr).StreamAggregatedResources(vctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "victim"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	first, err := victim.Recv()
	if err != nil {
		t.Fatal(err)
	}
	ack := func(r *discovery.DiscoveryResponse) {
		if err := victim.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: r.VersionInfo, ResponseNonce: r.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
	ack(first)

	before := heapInUse()
	liveBefore := liveHeap()
	// The live heap (marked by the last collection) is what is held;
	// the heap in use also holds garbage not yet collected.
	var peak, heldPeak atomic.Uint64
	sampling, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if live := liveHeap(); live > peak.Load() {
				peak.Store(live)
			}
			if h := uint64(held(t, reg)); h > heldPeak.Load() {
				heldPeak.Store(h)
			}
			select {
			case <-sampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// The flood.
	var wg sync.WaitGroup
	var once sync.Once
	started := make(chan struct{})
	refusals := make(chan error, streams)
	fctx, stopFlood := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "x-identity", "attacker"))
	defer stopFlood()
	for i := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			refusals <- flood(fctx, dialADS(t, addr), i, perStream, batch, func() { once.Do(func() { close(started) }) })
		}()
	}

	// Meanwhile a change reaches the victim.
	<-started // a flooding stream has sent its first names
	changed := time.Now()
	update()
	resp, err := victim.Recv()
	if err != nil {
		t.Fatalf("the victim, during the flood: %v", err)
	}
	ack(resp)
	served := time.Since(changed)

	wg.Wait()
	close(refusals)
	for err := range refusals {
		if status.Code(err) != codes.ResourceExhausted {
			t.Errorf("a flooding stream ended with %v, want RESOURCE_EXHAUSTED", err)
		}
	}
	close(sampling)
	<-sampled
	grown := int64(peak.Load()) - int64(liveBefore)
	// The identity's names, and a request in flight on each stream in its
	// copies on both ends (this process is the clients too: the names,
	// their encoding, the transport's frames, the server's read buffer,
	// the decoded request, the names interned), and slack.
	bound := int64(perIdentity) + streams*6*batch*1024 + 64<<20
	t.Logf("flood of %d×%d names of 1 KiB: names held at most %d MiB, the live heap grew at most %d MiB (bound %d MiB); the victim was served a change in %v",
		streams, perStream, heldPeak.Load()>>20, grown>>20, bound>>20, served)
	if heldPeak.Load() > perIdentity+uint64(perIdentity/4) {
		t.Errorf("names held peaked at %d MiB; the identity's budget is %d MiB", heldPeak.Load()>>20, perIdentity>>20)
	}
	if grown > bound {
		t.Errorf("the live heap grew by %d MiB during the flood; the budget explains %d MiB", grown>>20, bound>>20)
	}
	refused := 0.0
	for _, limit := range []string{"subscribed_bytes", "subscribed_bytes_stream", "subscribed_bytes_connection", "subscribed_bytes_identity",
		"subscribed_bytes_identity_rate", "subscribed_bytes_total"} {
		refused += limited(t, reg, limit)
	}
	if refused < streams {
		t.Errorf("%v refusals counted for %d flooding streams", refused, streams)
	}
	stopVictim()
	waitHeld(t, reg, 0)
	if after := heapInUse(); after > before+32<<20 {
		t.Errorf("heap in use %d MiB after the flood, %d MiB before", after>>20, before>>20)
	}
}

// liveHeap is the heap the last collection found live.
func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// flood asks on one Delta stream for n made-up names of a kilobyte, batch
// at a time, calling onSend after each request, and returns how the stream
// ended.
func flood(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, stream, n, batch int, onSend func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	pad := strings.Repeat("x", 1024)
	for sent := 0; sent < n; sent += batch {
		names := make([]string, batch)
		for i := range names {
			name := fmt.Sprintf("flood-%d-%d-", stream, sent+i)
			names[i] = name + pad[len(name):]
		}
		req := &discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNamesSubscribe: names}
		if sent == 0 {
			req.Node = &core.Node{Id: fmt.Sprintf("flood-%d", stream)}
		}
		if s.Send(req) != nil {
			break // refused: its status comes from Recv
		}
		onSend()
		select {
		case err := <-ended:
			return err
		default:
		}
	}
	select {
	case err := <-ended:
		return err
	case <-time.After(time.Minute):
		return fmt.Errorf("stream %d: 50,000 names asked for and neither served nor refused after a minute", stream)
	}
}
