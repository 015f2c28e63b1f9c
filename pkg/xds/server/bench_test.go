package server

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/protobuf/proto"
)

// assignments returns S load assignments, one with a changed endpoint
// count when gen differs.
func assignments(S int) map[string]types.Resource {
	out := make(map[string]types.Resource, S)
	for i := range S {
		name := "outbound|80||svc-" + strconv.Itoa(i) + ".ns.svc.cluster.local"
		out[name] = &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
			LbEndpoints: []*endpoint.LbEndpoint{lbEndpoint("10.0.0.1"), lbEndpoint("10.0.0.2")}}}}
	}
	return out
}

func lbEndpoint(addr string) *endpoint.LbEndpoint {
	return &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8080}}}}}}}
}

// fleet is P streams of one kind, each watching every one of S load
// assignments (as Envoys of one class do), brought up to date and ACKed.
type fleet struct {
	table   *cache.Table
	c       *cache.Cache
	srv     *Server
	res     map[string]types.Resource
	streams []*stream
}

func newFleet(tb testing.TB, P, S int, delta bool) *fleet {
	c, err := cache.New(cache.Config{SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := New(Config{Cache: c, Hooks: OneClass("all")})
	if err != nil {
		tb.Fatal(err)
	}
	f := &fleet{c: c, srv: srv, res: assignments(S)}
	if _, _, _, err := c.Update(cache.Shared, resource.EndpointType, f.res); err != nil {
		tb.Fatal(err)
	}
	f.table, _ = c.Table(cache.Shared, resource.EndpointType)
	names := make([]string, 0, S)
	for n := range f.res {
		names = append(names, n)
	}
	var set *cache.Set
	for i := range P {
		st := &stream{srv: srv, id: int64(i + 1), delta: delta, ctx: context.Background(),
			node: &core.Node{Id: "sidecar~10.0.0.1~p" + strconv.Itoa(i) + ".ns~ns.svc.cluster.local"}}
		w := &watch{st: st, typeURL: resource.EndpointType, short: "ClusterLoadAssignment", table: f.table, owed: f.table.NewOwed()}
		if set == nil {
			set = f.table.Subscribe(w, names, false)
		} else {
			f.table.Ref(w, set)
		}
		w.set, w.fresh, w.reqFP = set, true, cache.FingerprintOf(names)
		if delta {
			w.named = f.table.Ref(w, set)
		}
		st.watches = []*watch{w}
		w.Notify()
		f.streams = append(f.streams, st)
	}
	f.pushAll(tb)
	return f
}

// pushAll computes every due response and ACKs it, as each stream's
// sender and receiver would; it returns how many responses there were.
func (f *fleet) pushAll(tb testing.TB) int {
	n := 0
	for st := f.srv.pushq.take(); st != nil; st = f.srv.pushq.take() {
		f.srv.pushq.mu.Lock()
		st.queued = false
		f.srv.pushq.mu.Unlock()
	}
	for _, st := range f.streams {
		out, err := st.next(0, false)
		if err != nil || out == nil || out == errDone {
			tb.Fatalf("stream %d: no response (%v)", st.id, err)
		}
		n++
		st.mu.Lock()
		_, _ = st.answeredLocked(st.watches[0], false, nil)
		st.mu.Unlock()
	}
	return n
}

// BenchmarkFanOut measures one endpoint change reaching P streams that
// each subscribe to S load assignments: the update, then for every
// affected stream the response computed from the log, its shared
// encoding, the nonce and the ACK. Time and allocations per affected
// stream should not grow with S; the update is reported on its own.
func BenchmarkFanOut(b *testing.B) {
	for _, delta := range []bool{false, true} {
		for _, P := range []int{1000, 5000, 20000} {
			for _, S := range []int{100, 1000, 5000} {
				mode := "sotw"
				if delta {
					mode = "delta"
				}
				b.Run(fmt.Sprintf("%s/P=%d/S=%d", mode, P, S), func(b *testing.B) {
					f := newFleet(b, P, S, delta)
					name := "outbound|80||svc-0.ns.svc.cluster.local"
					var before, mid, after runtime.MemStats
					var update, fanout time.Duration
					var allocs uint64
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						f.res[name] = &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
							LbEndpoints: []*endpoint.LbEndpoint{lbEndpoint("10.0.0.1"), lbEndpoint("10.0.1." + strconv.Itoa(i%250))}}}}
						runtime.ReadMemStats(&before)
						start := time.Now()
						if _, _, _, err := f.c.Update(cache.Shared, resource.EndpointType, f.res); err != nil {
							b.Fatal(err)
						}
						updated := time.Now()
						runtime.ReadMemStats(&mid)
						pushed := time.Now()
						f.pushAll(b)
						update, fanout = update+updated.Sub(start), fanout+time.Since(pushed)
						runtime.ReadMemStats(&after)
						allocs += after.Mallocs - mid.Mallocs
					}
					b.StopTimer()
					per := float64(b.N) * float64(P)
					// The update (today O(S): the pusher hands over whole
					// tables) is reported apart from the per-stream work.
					b.ReportMetric(float64(fanout.Nanoseconds())/per, "ns/stream")
					b.ReportMetric(float64(update.Nanoseconds())/float64(b.N), "update-ns")
					b.ReportMetric(float64(allocs)/per, "allocs/stream")
				})
			}
		}
	}
}

// BenchmarkSotWACK measures decoding and applying an ACK that names 1,000
// unchanged resources: it must allocate nothing.
func BenchmarkSotWACK(b *testing.B) {
	f := newFleet(b, 1, 1000, false)
	st := f.streams[0]
	w := st.watches[0]
	names := make([]string, 0, 1000)
	for n := range f.res {
		names = append(names, n)
	}
	raw, err := proto.Marshal(&discovery.DiscoveryRequest{VersionInfo: w.status.Sent, ResourceNames: names,
		TypeUrl: resource.EndpointType, ResponseNonce: w.nonce})
	if err != nil {
		b.Fatal(err)
	}
	r := &sotwRequest{}
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		w.inflight = true
		if err := r.decode(raw); err != nil {
			b.Fatal(err)
		}
		if err := st.applySotW(r, ""); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if w.inflight || w.set == nil || w.dirty.Load() {
		b.Fatal("the ACK was not applied as one")
	}
}
