package server_test

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/shardpilot/shardpilot/internal/testutil"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestPerStreamLimits: a node larger than MaxNodeBytes and a subscription
// of more than MaxNames names (SotW or Delta) end their stream with a
// reason, counted by limit; a stream within them is served.
func TestPerStreamLimits(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, ads, ctx := serve(t, server.Config{Registerer: reg, MaxNodeBytes: 4 << 10, MaxNames: 100, MaxNameBytes: 4 << 10})
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("cluster-%d", i)
		}
		return out
	}
	clusters := map[string]types.Resource{}
	for _, n := range names(101) {
		clusters[n] = &clusterv3.Cluster{Name: n}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	bigNode := &core.Node{Id: "big", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{
		"PADDING": structpb.NewStringValue(strings.Repeat("x", 8<<10))}}}
	versions := map[string]string{}
	for _, n := range names(101) {
		versions[n] = "v1"
	}
	for name, tc := range map[string]struct {
		node     *core.Node
		names    []string
		delta    bool
		versions map[string]string
		code     codes.Code
		says     string
	}{
		"a node within the limit":         {node: &core.Node{Id: "ok"}, names: names(100)},
		"a node past the limit":           {node: bigNode, code: codes.InvalidArgument, says: "at most 4096"},
		"too many names, SotW":            {node: &core.Node{Id: "sotw"}, names: names(101), code: codes.ResourceExhausted, says: "101 names"},
		"too many names, Delta":           {node: &core.Node{Id: "delta"}, names: names(101), delta: true, code: codes.ResourceExhausted, says: "101 names"},
		"as many names as allowed, Delta": {node: &core.Node{Id: "delta-ok"}, names: names(100), delta: true},
		// 20 names of a kilobyte: few, but too many bytes.
		"too many name bytes, SotW":  {node: &core.Node{Id: "sotw-bytes"}, names: longNames(20), code: codes.ResourceExhausted, says: "at most 4096"},
		"too many name bytes, Delta": {node: &core.Node{Id: "delta-bytes"}, names: longNames(20), delta: true, code: codes.ResourceExhausted, says: "at most 4096"},
		"too many versions held, Delta": {node: &core.Node{Id: "delta-held"}, names: []string{"*"}, delta: true, versions: versions,
			code: codes.ResourceExhausted, says: "listing 101 resource versions"},
	} {
		t.Run(name, func(t *testing.T) {
			var err error
			if tc.delta {
				s, serr := ads.DeltaAggregatedResources(ctx)
				if serr != nil {
					t.Fatal(serr)
				}
				if err = s.Send(&discovery.DeltaDiscoveryRequest{Node: tc.node, TypeUrl: resource.ClusterType, ResourceNamesSubscribe: tc.names,
					InitialResourceVersions: tc.versions}); err == nil {
					_, err = s.Recv()
				}
			} else {
				s, serr := ads.StreamAggregatedResources(ctx)
				if serr != nil {
					t.Fatal(serr)
				}
				if err = s.Send(&discovery.DiscoveryRequest{Node: tc.node, TypeUrl: resource.ClusterType, ResourceNames: tc.names}); err == nil {
					_, err = s.Recv()
				}
			}
			if status.Code(err) != tc.code || !strings.Contains(fmt.Sprint(err), tc.says) {
				t.Errorf("got %v, want %s saying %q", err, tc.code, tc.says)
			}
		})
	}
	for limit, want := range map[string]float64{"node_size": 1, "subscribed_names": 3, "subscribed_bytes": 2} {
		var got float64
		for _, m := range family(t, reg, "shardpilot_pusher_xds_limited_total").GetMetric() {
			if m.GetLabel()[0].GetValue() == limit {
				got = m.GetCounter().GetValue()
			}
		}
		if got != want {
			t.Errorf("limited %s: %v, want %v", limit, got, want)
		}
	}
}

// longNames are n names of a kilobyte each.
func longNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%04d-%s", i, strings.Repeat("x", 1019))
	}
	return out
}

// localities serves a table per locality (the proxy's zone) of load
// assignments.
type localities struct{ *cache.Cache }

func (l localities) Class(n *core.Node) cache.Class { return cache.Class(n.GetLocality().GetZone()) }
func (localities) Fill(cache.Class)                 {}

// TestLocalityClassesAreBounded: proxies of more localities than
// MaxLocalities are served the mesh-wide load assignments, not a table
// each; a locality held already still gets its own.
func TestLocalityClassesAreBounded(t *testing.T) {
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	lc, err := cache.New(cache.Config{Types: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	_, ads, ctx := serveCache(t, c, server.Config{Registerer: reg, Localities: localities{lc}, MaxLocalities: 2})
	// The tables are empty: no answer comes, and the streams stay open
	// while the classes they made are counted.
	for _, zone := range []string{"z1", "z2", "z3", "z4", "z1"} {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p-" + zone, Locality: &core.Locality{Zone: zone}}, TypeUrl: resource.EndpointType}); err != nil {
			t.Fatal(err)
		}
		// One at a time: the streams are served side by side.
		switch zone {
		case "z1", "z2":
			testutil.Eventually(t, 10*time.Second, zone+" has its class", func() (bool, string) {
				return slices.Contains(lc.Classes(), cache.Class(zone)), fmt.Sprint(lc.Classes())
			})
		case "z3", "z4":
			want := map[string]float64{"z3": 1, "z4": 2}[zone]
			testutil.Eventually(t, 10*time.Second, zone+" is served the mesh-wide assignments", func() (bool, string) {
				n := counterValueLabelled(t, reg, "shardpilot_pusher_xds_limited_total", "locality_classes")
				return n == want, fmt.Sprint(n)
			})
		}
	}
	if got := lc.Classes(); len(got) != 2 || got[0] != "z1" || got[1] != "z2" {
		t.Errorf("locality classes %v, want z1 and z2", got)
	}
}

func counterValueLabelled(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	for _, m := range family(t, reg, name).GetMetric() {
		if m.GetLabel()[0].GetValue() == label {
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestEDSFollowsTheClassView: a stream is sent the load assignments its
// class's clusters name; one it asked for before its class named it is
// sent as soon as the class's clusters do (an Envoy does not ask again).
func TestEDSFollowsTheClassView(t *testing.T) {
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType}, SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	eds := func(name string) *clusterv3.Cluster {
		return &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS},
			EdsClusterConfig: &clusterv3.Cluster_EdsClusterConfig{ServiceName: name}}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, map[string]types.Resource{"c1": eds("c1")}); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := c.Update(cache.Shared, resource.EndpointType, map[string]types.Resource{
		"c1": &endpointv3.ClusterLoadAssignment{ClusterName: "c1"}, "c2": &endpointv3.ClusterLoadAssignment{ClusterName: "c2"}}); err != nil {
		t.Fatal(err)
	}
	_, ads, ctx := serveCache(t, c, server.Config{})
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	recv := func(typeURL string) []string {
		t.Helper()
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if resp.TypeUrl != typeURL {
			t.Fatalf("a %s response, want %s", resp.TypeUrl, typeURL)
		}
		var names []string
		for _, a := range resp.Resources {
			if typeURL == resource.EndpointType {
				cla := &endpointv3.ClusterLoadAssignment{}
				if err := a.UnmarshalTo(cla); err != nil {
					t.Fatal(err)
				}
				names = append(names, cla.ClusterName)
			} else {
				names = append(names, "cluster")
			}
		}
		slices.Sort(names)
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL, ResponseNonce: resp.Nonce, VersionInfo: resp.VersionInfo,
			ResourceNames: map[string][]string{resource.EndpointType: {"c1", "c2"}}[typeURL]}); err != nil {
			t.Fatal(err)
		}
		return names
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	recv(resource.ClusterType)
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: []string{"c1", "c2"}}); err != nil {
		t.Fatal(err)
	}
	if got := recv(resource.EndpointType); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("assignments %v before the class names c2, want c1 alone", got)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, map[string]types.Resource{"c1": eds("c1"), "c2": eds("c2")}); err != nil {
		t.Fatal(err)
	}
	recv(resource.ClusterType)
	if got := recv(resource.EndpointType); !slices.Contains(got, "c2") {
		t.Fatalf("assignments %v once the class names c2, want c2 among them", got)
	}
}

// fillingClass serves every proxy from class "late", whose clusters it
// fills when the class is first made.
type fillingClass struct {
	server.NoHooks
	c *cache.Cache
}

func (fillingClass) OnClassify(*core.Node) cache.Class { return "late" }
func (f fillingClass) OnNewClass(class cache.Class) {
	_, _, _, _ = f.c.Update(class, resource.ClusterType, map[string]types.Resource{"c1": &clusterv3.Cluster{Name: "c1",
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}})
}

// TestEDSBeforeTheClass: a proxy that moves from another replica asks for
// every type at once, in any order, saying which versions it holds. One
// whose first request is for load assignments, before anything made its
// class here, and whose clusters are what this replica would send (so
// none are sent), is still sent the load assignments once its class is
// made.
func TestEDSBeforeTheClass(t *testing.T) {
	newCache := func() *cache.Cache {
		c, err := cache.New(cache.Config{Types: []string{resource.ClusterType}, SharedTypes: []string{resource.EndpointType}})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, err := c.Update(cache.Shared, resource.EndpointType, map[string]types.Resource{"c1": &endpointv3.ClusterLoadAssignment{ClusterName: "c1"}}); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// The replica the proxy was on: the version of its clusters.
	other := newCache()
	_, otherADS, ctx := serveCache(t, other, server.Config{Hooks: fillingClass{c: other}})
	prevStream, err := otherADS.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := prevStream.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	held, err := prevStream.Recv()
	if err != nil {
		t.Fatal(err)
	}

	c := newCache()
	_, ads, ctx := serveCache(t, c, server.Config{Hooks: fillingClass{c: c}})
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "p"}, TypeUrl: resource.EndpointType, ResourceNames: []string{"c1"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: held.VersionInfo}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if resp.TypeUrl != resource.EndpointType || len(resp.Resources) != 1 {
		t.Errorf("first response: %d %s, want the load assignment (the clusters are held already)", len(resp.Resources), resp.TypeUrl)
	}
}

// TestMalformedRequestIsInvalid: a request the server cannot decode ends
// its stream with INVALID_ARGUMENT naming the fault, SotW and Delta.
func TestMalformedRequestIsInvalid(t *testing.T) {
	_, ads, ctx := serve(t, server.Config{})
	raw := grpc.ForceCodec(rawCodec{})
	for name, open := range map[string]func() (grpc.ClientStream, error){
		"SotW": func() (grpc.ClientStream, error) {
			return ads.StreamAggregatedResources(ctx, raw)
		},
		"Delta": func() (grpc.ClientStream, error) {
			return ads.DeltaAggregatedResources(ctx, raw)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, err := open()
			if err != nil {
				t.Fatal(err)
			}
			// Field 2 (type_url) claiming 100 bytes, holding 3.
			if err := s.SendMsg(rawMessage{0x12, 100, 'a', 'b', 'c'}); err != nil {
				t.Fatal(err)
			}
			var resp discovery.DiscoveryResponse
			err = s.RecvMsg(&resp)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(fmt.Sprint(err), "malformed") {
				t.Errorf("got %v, want INVALID_ARGUMENT saying malformed", err)
			}
		})
	}
}

// rawMessage is a request's bytes, sent as they are by rawCodec.
type rawMessage []byte

// rawCodec sends rawMessages as they are and everything else as protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(rawMessage); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

// TestFirstRequestWithAStaleNonceIsAnswered: a stream's first request of a
// type that carries a nonce from an earlier stream is answered, as a new
// subscription, not ignored as a stale one.
func TestFirstRequestWithAStaleNonceIsAnswered(t *testing.T) {
	c, ads, ctx := serve(t, server.Config{})
	if _, _, _, err := c.Update("all", resource.ClusterType, map[string]types.Resource{"a": &clusterv3.Cluster{Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "back"}, TypeUrl: resource.ClusterType, ResponseNonce: "41"}); err != nil {
		t.Fatal(err)
	}
	within(t, "the first request's answer", func() error {
		resp, err := s.Recv()
		if err == nil && len(resp.Resources) != 1 {
			err = fmt.Errorf("got %d clusters, want 1", len(resp.Resources))
		}
		return err
	})
}

// TestResponseLimit: a response past the class's ResponseLimit is not
// sent (a client would refuse it and the stream with it) and is counted.
// The client is told why, in the status that ends its stream, never left
// waiting in silence: one that holds nothing of the type, and one that
// holds a version (told it keeps it), served again once its configuration
// fits; a client naming fewer resources is served.
func TestResponseLimit(t *testing.T) {
	reg := prometheus.NewRegistry()
	tables, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType, resource.ListenerType}})
	if err != nil {
		t.Fatal(err)
	}
	c, ads, ctx := serveCache(t, tables, server.Config{Registerer: reg, Hooks: hooks{limit: 2000}})
	clusters := map[string]types.Resource{}
	var all []string
	for i := range 100 {
		n := fmt.Sprintf("outbound|8080||service-with-a-long-name-%d.namespace.svc.cluster.local", i)
		clusters[n], all = &clusterv3.Cluster{Name: n}, append(all, n)
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	open := func(id, version string, names []string) grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse] {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id}, TypeUrl: resource.ClusterType, ResourceNames: names, VersionInfo: version}); err != nil {
			t.Fatal(err)
		}
		return s
	}
	few := open("few", "", all[:2])
	if r, err := few.Recv(); err != nil || len(r.Resources) != 2 {
		t.Fatalf("a client naming 2 clusters: %v resources, %v", len(r.GetResources()), err)
	}
	_, err = open("nothing", "", all).Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "over the 2000 it takes") {
		t.Fatalf("a client holding nothing, over the limit: %v, want its stream ended with the reason", err)
	}
	// One that holds a version (from another pusher, before the mesh
	// grew) keeps it, and is told so, after the responses of its other
	// types that fit.
	if _, _, _, err := c.Update("all", resource.ListenerType, map[string]types.Resource{"l": &listenerv3.Listener{Name: "l"}}); err != nil {
		t.Fatal(err)
	}
	holding, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*discovery.DiscoveryRequest{{Node: &core.Node{Id: "holding"}, TypeUrl: resource.ListenerType},
		{TypeUrl: resource.ClusterType, ResourceNames: all, VersionInfo: "an-earlier-version"}} {
		if err := holding.Send(r); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := holding.Recv(); err != nil || r.TypeUrl != resource.ListenerType {
		t.Fatalf("a client over the limit for its clusters: %v, %v; want its listeners first", r.GetTypeUrl(), err)
	}
	_, err = holding.Recv()
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "the client keeps the Cluster resources it holds") {
		t.Fatalf("a client holding a version, over the limit: %v, want its stream ended with the reason", err)
	}
	testutil.Eventually(t, 10*time.Second, "both responses counted", func() (bool, string) {
		for _, m := range family(t, reg, "shardpilot_pusher_xds_limited_total").GetMetric() {
			if m.GetLabel()[0].GetValue() == "response_size" && m.GetCounter().GetValue() == 2 {
				return true, ""
			}
		}
		return false, "not counted"
	})
	kept := map[string]types.Resource{}
	for _, n := range all[:5] {
		kept[n] = clusters[n]
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, kept); err != nil {
		t.Fatal(err)
	}
	if r, err := open("holding", "an-earlier-version", all).Recv(); err != nil || len(r.Resources) != 5 {
		t.Fatalf("a client holding a version, once its clusters fit: %v resources, %v", len(r.GetResources()), err)
	}
	if r, err := open("nothing-again", "", all).Recv(); err != nil || len(r.Resources) != 5 {
		t.Fatalf("a client holding nothing, once its clusters fit: %v resources, %v", len(r.GetResources()), err)
	}
}

// heapInUse is the heap in use after two collections (what pools keep
// survives one).
func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestFloodsHoldNoMemory: 150 streams whose node carries 3 MB of metadata
// and 50 Delta streams listing 100,000 resource versions each are refused,
// and the server holds nothing of them afterwards (under 32 MiB more heap
// in use, clients included); before the limits, such streams made it hold
// gigabytes.
func TestFloodsHoldNoMemory(t *testing.T) {
	reg := prometheus.NewRegistry()
	_, ads, ctx := serve(t, server.Config{Registerer: reg})
	before := heapInUse()
	meta := &structpb.Struct{Fields: map[string]*structpb.Value{"PADDING": structpb.NewStringValue(strings.Repeat("x", 3<<20))}}
	versions := make(map[string]string, 100_000)
	for i := range 100_000 {
		versions[fmt.Sprintf("outbound|80||svc-%d.ns.svc.cluster.local", i)] = "v1"
	}
	flood := func(n int, one func(i int) error) {
		errs := make(chan error, n)
		sem := make(chan struct{}, 10) // ten at a time: the clients' copies are in this process too
		for i := range n {
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				errs <- one(i)
			}()
		}
		for range n {
			if err := <-errs; status.Code(err) != codes.InvalidArgument && status.Code(err) != codes.ResourceExhausted {
				t.Errorf("a flooding stream ended with %v, want it refused", err)
			}
		}
	}
	flood(150, func(i int) error {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: fmt.Sprint("meta-", i), Metadata: meta}, TypeUrl: resource.ClusterType}); err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	})
	flood(50, func(i int) error {
		s, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			return err
		}
		if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: fmt.Sprint("delta-", i)}, TypeUrl: resource.ClusterType,
			ResourceNamesSubscribe: []string{"*"}, InitialResourceVersions: versions}); err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	})
	versions, meta = nil, nil
	after := heapInUse()
	t.Logf("heap in use: %d MiB before the floods, %d MiB after", before>>20, after>>20)
	if after > before+32<<20 {
		t.Errorf("the floods left %d MiB more heap in use", (after-before)>>20)
	}
}
