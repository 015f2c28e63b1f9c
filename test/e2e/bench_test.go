package e2e

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

const benchClasses = 50

// benchShared services, in a namespace every class's Sidecar imports, give
// each class 1,000 resources of every per-service type.
const benchShared = 1000

// BenchmarkEndpointChange measures one endpoint change, from its write to
// etcd until every proxy watching the changed service has received it,
// with the same 50 classes (a namespace each, scoped by a Sidecar that also
// imports 1,000 shared services) and 50 or 1,000 connected proxies. The goal: nearly the same cost. It also
// reports the heap each connected proxy adds. The simulated proxies run in
// the same process, so CPU and heap figures include their side.
// Run with: go test -run '^$' -bench EndpointChange -benchtime 20x ./test/e2e/
func BenchmarkEndpointChange(b *testing.B) {
	for _, n := range []int{50, 1000} {
		b.Run(fmt.Sprintf("proxies=%d/classes=%d", n, benchClasses), func(b *testing.B) { benchEndpointChange(b, n) })
	}
}

func endpointsOf(i, gen int) *meshv1.Endpoints {
	eps := &meshv1.Endpoints{Origin: &meshv1.Origin{Source: "bench"}, Service: fmt.Sprintf("svc-%d", i), Shard: "bench"}
	for j := range 5 {
		eps.Endpoints = append(eps.Endpoints, &meshv1.Endpoint{Address: fmt.Sprintf("10.%d.%d.%d", i, gen%250, j+1)})
	}
	return eps
}

func benchEndpointChange(b *testing.B, proxies int) {
	// Every proxy connects from this host: its connections are not bounded.
	cp := NewCluster(b, Options{Unloaded: true, XDS: server.Config{MaxConnectionsPerSource: -1}})
	cli, ps := cp.etcd, cp.pusher
	st := store.New(cli)
	ctx := context.Background()
	putBenchMesh(b, st)
	testutil.Eventually(b, 30*time.Second, "the pusher loads the mesh", func() (bool, string) {
		rev, _ := st.Revision(ctx)
		return ps.GeneratedRevision() >= rev, fmt.Sprint(ps.GeneratedRevision(), rev)
	})

	// The simulated proxies: 100 streams per connection, each an Envoy in
	// one of the namespaces that asks for its clusters, then their
	// assignments, and ACKs everything.
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	updates := make([]chan string, benchClasses) // per namespace: the versions proxies received
	for i := range updates {
		updates[i] = make(chan string, proxies)
	}
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	synced := make(chan struct{}, proxies)
	var wg sync.WaitGroup
	defer wg.Wait()
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	for p := range proxies {
		if p%100 == 0 {
			c, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			conns = append(conns, c)
		}
		ads := discovery.NewAggregatedDiscoveryServiceClient(conns[len(conns)-1])
		class := p % benchClasses
		wg.Go(func() { simulateEnvoy(pctx, ads, class, p, synced, updates[class]) })
	}
	for range proxies {
		select {
		case <-synced:
		case <-time.After(60 * time.Second):
			b.Fatal("proxies did not sync within 60s")
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	perProxy := (float64(after.HeapInuse) - float64(before.HeapInuse)) / float64(proxies) / 1024

	watchers := proxies / benchClasses
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	for i := range b.N {
		if _, _, err := st.Put(ctx, model.Key{Kind: model.KindEndpoints, Namespace: "ns-0", Name: model.EndpointsName("svc-0", "bench")}, endpointsOf(0, i+1)); err != nil {
			b.Fatal(err)
		}
		for range watchers {
			select {
			case <-updates[0]:
			case <-time.After(30 * time.Second):
				b.Fatal("an endpoint change did not reach every watching proxy within 30s")
			}
		}
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) / time.Duration(b.N)
	b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/change")
	b.ReportMetric(perProxy, "heap-KB/proxy")
}

// putBenchMesh writes the benchmark's mesh into the store: a service with
// a Sidecar per namespace, and the shared namespace's services.
func putBenchMesh(b *testing.B, st *store.Store) {
	ctx := context.Background()
	put := func(k model.Key, o model.Object) {
		if _, _, err := st.Put(ctx, k, o); err != nil {
			b.Fatal(err)
		}
	}
	for i := range benchClasses {
		ns := fmt.Sprintf("ns-%d", i)
		put(model.Key{Kind: model.KindService, Namespace: ns, Name: fmt.Sprintf("svc-%d", i)}, &meshv1.Service{
			Origin: &meshv1.Origin{Source: "bench"}, Hostnames: []string{fmt.Sprintf("svc-%d.%s.svc.cluster.local", i, ns)},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
		})
		put(model.Key{Kind: model.KindEndpoints, Namespace: ns, Name: model.EndpointsName(fmt.Sprintf("svc-%d", i), "bench")}, endpointsOf(i, 0))
		put(model.Key{Kind: model.KindScope, Namespace: ns, Name: "default"}, &meshv1.Scope{
			Origin: &meshv1.Origin{Source: "bench"}, Egress: []*meshv1.EgressListener{{Hosts: []string{"./*", "shared/*"}}}})
	}
	for i := range benchShared {
		name := fmt.Sprintf("common-%d", i)
		put(model.Key{Kind: model.KindService, Namespace: "shared", Name: name}, &meshv1.Service{
			Origin: &meshv1.Origin{Source: "bench"}, Hostnames: []string{name + ".shared.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
		})
		put(model.Key{Kind: model.KindEndpoints, Namespace: "shared", Name: model.EndpointsName(name, "bench")}, &meshv1.Endpoints{
			Origin: &meshv1.Origin{Source: "bench"}, Service: name, Shard: "bench",
			Endpoints: []*meshv1.Endpoint{{Address: fmt.Sprintf("10.200.%d.%d", i/250, i%250+1)}}})
	}
}

// simulateEnvoy plays an Envoy sidecar in namespace ns-<class>: wildcard
// clusters, then the assignments of the clusters received, ACKing each
// response; every assignment update after the first is reported.
func simulateEnvoy(ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, class, id int, synced chan<- struct{}, updates chan<- string) {
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		return
	}
	ns := fmt.Sprintf("ns-%d", class)
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns})
	node := &core.Node{Id: fmt.Sprintf("sidecar~10.9.%d.%d~p%d.%s~%s.svc.cluster.local", id/250, id%250, id, ns, ns), Metadata: meta}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		return
	}
	edsSeen := 0
	var names []string // the clusters subscribed to: every EDS ACK names them all, as Envoy's does
	for {
		resp, err := s.Recv()
		if err != nil {
			return
		}
		ack := &discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		switch resp.TypeUrl {
		case resource.ClusterType:
			if err := s.Send(ack); err != nil {
				return
			}
			names = names[:0]
			for _, r := range resp.Resources {
				m, _ := r.UnmarshalNew()
				names = append(names, m.(interface{ GetName() string }).GetName())
			}
			if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
				return
			}
		case resource.EndpointType:
			ack.ResourceNames = names
			if err := s.Send(ack); err != nil {
				return
			}
			edsSeen++
			if edsSeen == 1 {
				synced <- struct{}{}
			} else {
				updates <- resp.VersionInfo
			}
		}
	}
}
