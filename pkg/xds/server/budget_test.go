package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
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

// TestSubscribedBytesAreBudgeted: the names streams subscribe to are
// bounded in bytes per stream (every type together), per connection, per
// identity and in all. A set of names many streams ask for counts once
// against each: fifty streams of one identity asking for the same
// clusters are all served, while an identity making up names is refused
// past its budget on whatever connection it opens, and another identity
// is served on. What ended streams held is given back.
func TestSubscribedBytesAreBudgeted(t *testing.T) {
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType, resource.RouteType}})
	if err != nil {
		t.Fatal(err)
	}
	clusters, routes := map[string]types.Resource{}, map[string]types.Resource{}
	// The names asked for exist, so that each request is answered (what
	// a proxy makes up counts as much).
	shared := kilobyteNames("shared", 40)
	var madeUps [][]string
	for i := range 20 {
		madeUps = append(madeUps, kilobyteNames(fmt.Sprintf("made-up-%d", i), 40))
	}
	for _, n := range append(shared, slices.Concat(madeUps...)...) {
		clusters[n] = &clusterv3.Cluster{Name: n}
		routes[n] = &routev3.RouteConfiguration{Name: n}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update("all", resource.RouteType, routes); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	// 40 names of a kilobyte hold 41 KiB; a stream may hold two such
	// sets, a connection three, an identity four, the server seven. The
	// rate of new names is not what is tested here (TestNewNamesArePaidForAtTheIdentitysRate
	// is): the attacker asks for six sets within milliseconds, which the
	// default rate pays for only when the machine is slow enough.
	const set = 40 * (1024 + cache.NameOverhead)
	addr, ctx := serveOn(t, c, server.Config{Registerer: reg, MaxNameBytes: 64 << 10,
		NameBudget: server.NameBudget{PerStream: 2*set + 1, PerConnection: 3*set + 1, PerIdentity: 4*set + 1, Total: 7*set + 1, PerIdentityRate: 1 << 40},
		Hooks:      hooks{identity: identityHeader}})
	connect := func() discovery.AggregatedDiscoveryServiceClient { return dialADS(t, addr) }
	// ask opens a stream of an identity and asks for names of each type
	// in turn; it returns the stream (nil once refused) and the refusal.
	n := 0
	ask := func(ads discovery.AggregatedDiscoveryServiceClient, id string, names ...[]string) (context.CancelFunc, error) {
		n++
		sctx, stop := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "x-identity", id))
		s, err := ads.StreamAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, ns := range names {
			typeURL := []string{resource.ClusterType, resource.RouteType}[i]
			// A refused stream's Send may fail with EOF: its status comes from Recv.
			_ = s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprintf("proxy-%d", n)}, TypeUrl: typeURL, ResourceNames: ns})
			resp, err := s.Recv()
			if err != nil {
				stop()
				return nil, err
			}
			// ACKed, as a proxy does before it asks for the next type.
			if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: ns, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
				t.Fatal(err)
			}
		}
		return stop, nil
	}
	refused := func(err error, says string) {
		t.Helper()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(err), says) {
			t.Fatalf("got %v, want RESOURCE_EXHAUSTED saying %q", err, says)
		}
	}
	served := func(_ context.CancelFunc, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("refused: %v", err)
		}
	}
	madeUp := func() []string { ns := madeUps[0]; madeUps = madeUps[1:]; return ns }

	// Fifty replicas of one Deployment, on one connection, asking for the
	// same clusters and endpoints: one set of each held.
	replicas := connect()
	for range 50 {
		served(ask(replicas, "deployment", shared, shared))
	}
	if got := held(t, reg); got != 2*set {
		t.Fatalf("fifty streams asking for the same names hold %d bytes; want %d, once", got, 2*set)
	}

	// One stream may hold two sets, every type together.
	attacker := connect()
	_, err = ask(attacker, "attacker", madeUp(), madeUp())
	served(nil, err)
	_, err = ask(attacker, "attacker", madeUp(), append(madeUp(), madeUp()...)[:60])
	refused(err, "of this stream")

	// A connection, three: the attacker's second stream on it (two sets
	// more) is refused.
	_, err = ask(attacker, "attacker", madeUp(), madeUp())
	refused(err, "of the connection from")

	// An identity, four, on whatever connection.
	_, err = ask(connect(), "attacker", madeUp(), madeUp())
	served(nil, err)
	_, err = ask(connect(), "attacker", madeUp())
	refused(err, "of identity attacker")

	// The deployment is still served, and so is another identity, up to
	// the server's seven sets: 2 (deployment) + 4 (attacker) + 1.
	served(ask(replicas, "deployment", shared, shared))
	stop, err := ask(connect(), "other", madeUp())
	served(nil, err)
	_, err = ask(connect(), "third", madeUp())
	refused(err, "of the server")

	// What ended streams held is given back.
	stop()
	waitHeld(t, reg, 6*set)
	if _, err := ask(connect(), "third", madeUp()); err != nil {
		t.Fatalf("once another stream ended: %v", err)
	}
	for limit, want := range map[string]float64{"subscribed_bytes_stream": 1, "subscribed_bytes_connection": 1, "subscribed_bytes_identity": 1, "subscribed_bytes_total": 1} {
		if got := limited(t, reg, limit); got != want {
			t.Errorf("limited %s: %v, want %v", limit, got, want)
		}
	}
}

// TestSubscribedBytesAreGivenBack: a Delta stream's names count as a
// SotW stream's, and once the streams end the server holds nothing.
func TestSubscribedBytesAreGivenBack(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, ads, ctx := serve(t, server.Config{Registerer: reg, NameBudget: server.NameBudget{PerConnection: 10 * 10 * (1024 + cache.NameOverhead)}})
	clusters := map[string]types.Resource{}
	for i := range 11 {
		for _, n := range kilobyteNames(fmt.Sprint(i), 10) {
			clusters[n] = &clusterv3.Cluster{Name: n}
		}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	var stops []context.CancelFunc
	for i := range 11 {
		sctx, stop := context.WithCancel(ctx)
		stops = append(stops, stop)
		names := kilobyteNames(fmt.Sprint(i), 10)
		var err error
		if i%2 == 0 {
			s, serr := ads.StreamAggregatedResources(sctx)
			if serr != nil {
				t.Fatal(serr)
			}
			_ = s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType, ResourceNames: names})
			_, err = s.Recv()
		} else {
			s, serr := ads.DeltaAggregatedResources(sctx)
			if serr != nil {
				t.Fatal(serr)
			}
			_ = s.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: names})
			_, err = s.Recv()
		}
		if i < 10 && err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
		if i == 10 && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the eleventh stream of a connection that may hold ten: %v, want RESOURCE_EXHAUSTED", err)
		}
	}
	for _, stop := range stops {
		stop()
	}
	waitHeld(t, reg, 0)
}

// waitHeld waits until the server's streams hold want bytes of names:
// a stream its client ended is released once the server hears of it.
func waitHeld(t *testing.T, reg *prometheus.Registry, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for held(t, reg) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes of names held; want %d", held(t, reg), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// identityHeader is a stream's identity as its x-identity header names it.
func identityHeader(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	return strings.Join(md.Get("x-identity"), "")
}

// kilobyteNames are n names of a kilobyte each, prefixed.
func kilobyteNames(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		name := fmt.Sprintf("%s-%04d-", prefix, i)
		out[i] = name + strings.Repeat("x", 1024-len(name))
	}
	return out
}

// held is what the server's streams hold of names, in bytes.
func held(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	return int(family(t, reg, "shardpilot_pusher_xds_subscribed_bytes").GetMetric()[0].GetGauge().GetValue())
}

// limited is how often a limit refused a request.
func limited(t *testing.T, reg *prometheus.Registry, limit string) float64 {
	t.Helper()
	for _, m := range family(t, reg, "shardpilot_pusher_xds_limited_total").GetMetric() {
		if m.GetLabel()[0].GetValue() == limit {
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestNewNamesArePaidForAtTheIdentitysRate: an identity pays, from a
// rate, for the names it newly holds. Ten replicas asking for the same
// names pay once; an identity that drops its names and asks for others,
// over and over, is refused past its rate, and then opens no stream at
// all until the rate has paid for what it asked.
func TestNewNamesArePaidForAtTheIdentitysRate(t *testing.T) {
	const set = 10 * (1024 + cache.NameOverhead)
	sets := [][]string{kilobyteNames("a", 10), kilobyteNames("b", 10), kilobyteNames("c", 10), kilobyteNames("shared", 10)}
	reg := prometheus.NewRegistry()
	c, ads, ctx := serve(t, server.Config{Registerer: reg,
		// A burst of two sets, then a byte a second: nothing more.
		NameBudget: server.NameBudget{PerIdentity: 2*set + 1, PerIdentityRate: 1},
		Hooks:      hooks{identity: identityHeader}})
	clusters := map[string]types.Resource{}
	for _, n := range slices.Concat(sets...) {
		clusters[n] = &clusterv3.Cluster{Name: n}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	// ask opens a stream of an identity asking for names; it returns the
	// refusal, or what ends the stream.
	ask := func(id string, names []string) (context.CancelFunc, error) {
		sctx, stop := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "x-identity", id))
		s, err := ads.StreamAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id}, TypeUrl: resource.ClusterType, ResourceNames: names})
		if _, err := s.Recv(); err != nil {
			stop()
			return nil, err
		}
		return stop, nil
	}
	for i := range 10 {
		if _, err := ask("replicas", sets[3]); err != nil {
			t.Fatalf("replica %d asking for the names the others hold: %v", i, err)
		}
	}
	before := held(t, reg)
	for i, names := range sets[:2] {
		stop, err := ask("churner", names)
		if err != nil {
			t.Fatalf("the churner's set %d, within its burst: %v", i, err)
		}
		stop()
		waitHeld(t, reg, before)
	}
	_, err := ask("churner", sets[2])
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(err), "past its rate") {
		t.Fatalf("the churner's third set past its rate: %v, want RESOURCE_EXHAUSTED saying so", err)
	}
	_, err = ask("churner", nil)
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(err), "more new names than its rate") {
		t.Fatalf("a new stream of the churner, owing: %v, want RESOURCE_EXHAUSTED before anything is read", err)
	}
	if _, err := ask("replicas", sets[3]); err != nil {
		t.Fatalf("another replica meanwhile: %v", err)
	}
	if got := limited(t, reg, "subscribed_bytes_identity_rate"); got != 2 {
		t.Errorf("limited subscribed_bytes_identity_rate: %v, want 2", got)
	}
}
