package patch_test

import (
	"slices"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/patch"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func mustAny(t testing.TB, m proto.Message) *anypb.Any {
	t.Helper()
	a, err := anypb.New(m)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func value(t testing.TB, v map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// listeners are an outbound listener on 9080 with a connection manager
// (filters a, b, router) and the inbound listener with a TCP chain on 8080.
func listeners(t *testing.T) []*listener.Listener {
	manager := &hcm.HttpConnectionManager{StatPrefix: "out", RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{RouteConfigName: "9080",
		ConfigSource: &core.ConfigSource{ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}}}}}}
	for _, name := range []string{"a", "b"} {
		manager.HttpFilters = append(manager.HttpFilters, &hcm.HttpFilter{Name: name, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &router.Router{})}})
	}
	manager.HttpFilters = append(manager.HttpFilters, &hcm.HttpFilter{Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(t, &router.Router{})}})
	addr := func(port uint32) *core.Address {
		return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{Address: "0.0.0.0", PortSpecifier: &core.SocketAddress_PortValue{PortValue: port}}}}
	}
	return []*listener.Listener{
		{Name: "0.0.0.0_9080", Address: addr(9080), FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{{
			Name: "envoy.filters.network.http_connection_manager", ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(t, manager)}}}}}},
		{Name: patch.InboundListener, Address: addr(15006), FilterChains: []*listener.FilterChain{{
			Name:             "inbound_0.0.0.0_8080",
			FilterChainMatch: &listener.FilterChainMatch{DestinationPort: wrapperspb.UInt32(8080)},
			Filters: []*listener.Filter{{Name: "envoy.filters.network.tcp_proxy", ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(t,
				&tcpproxy.TcpProxy{StatPrefix: "in", ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: "inbound|8080||"}})}}},
		}}},
	}
}

func httpFilterNames(t *testing.T, l *listener.Listener) []string {
	t.Helper()
	m := &hcm.HttpConnectionManager{}
	if err := l.FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range m.HttpFilters {
		out = append(out, f.Name)
	}
	return out
}

func filter(patches ...*meshv1.EnvoyPatch) *patch.Filter {
	return &patch.Filter{Namespace: "ns", Name: "f", Spec: &meshv1.EnvoyFilter{Patches: patches}}
}

func httpPatch(t *testing.T, op meshv1.EnvoyPatch_Operation, sub string, name string) *meshv1.EnvoyPatch {
	p := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_HTTP_FILTER, Operation: op, Context: meshv1.EnvoyPatch_CONTEXT_SIDECAR_OUTBOUND,
		Match: &meshv1.PatchMatch{Port: 9080, FilterName: "envoy.filters.network.http_connection_manager", SubFilterName: sub}}
	if name != "" {
		p.Value = value(t, map[string]any{"name": name, "typed_config": map[string]any{"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}})
	}
	return p
}

// TestHTTPFilterOperations: each operation on the HTTP filters, relative
// to the filter named, as Istio applies them; the listeners given are
// left as they were.
func TestHTTPFilterOperations(t *testing.T) {
	for _, c := range []struct {
		name  string
		patch *meshv1.EnvoyPatch
		want  string
	}{
		{"insert before", httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, "envoy.filters.http.router", "x"), "a,b,x,envoy.filters.http.router"},
		{"insert after", httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_AFTER, "a", "x"), "a,x,b,envoy.filters.http.router"},
		{"insert before, none named", httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, "", "x"), "x,a,b,envoy.filters.http.router"},
		{"insert after, none named", httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_AFTER, "", "x"), "a,b,envoy.filters.http.router,x"},
		{"insert before one absent", httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, "zz", "x"), "a,b,envoy.filters.http.router"},
		{"insert first", httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_FIRST, "b", "x"), "x,a,b,envoy.filters.http.router"},
		{"add", httpPatch(t, meshv1.EnvoyPatch_OPERATION_ADD, "", "x"), "a,b,envoy.filters.http.router,x"},
		{"replace", httpPatch(t, meshv1.EnvoyPatch_OPERATION_REPLACE, "b", "x"), "a,x,envoy.filters.http.router"},
		{"remove", httpPatch(t, meshv1.EnvoyPatch_OPERATION_REMOVE, "a", ""), "b,envoy.filters.http.router"},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := listeners(t)
			before := proto.Clone(in[0])
			s := patch.NewSet([]*patch.Filter{filter(c.patch)}, nil)
			out := s.Listeners(in, false)
			if got := strings.Join(httpFilterNames(t, out[0]), ","); got != c.want {
				t.Errorf("filters %s, want %s", got, c.want)
			}
			if !proto.Equal(before, in[0]) {
				t.Error("the listener given was modified")
			}
			if r := s.Refusals(); len(r) > 0 {
				t.Errorf("refused: %v", r)
			}
		})
	}
}

// TestContextsAndOrder: a patch applies in its context alone; the root
// namespace's EnvoyFilters apply first, then by priority; a patch for
// another proxy version is left out.
func TestContextsAndOrder(t *testing.T) {
	inbound := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_FILTER_CHAIN, Operation: meshv1.EnvoyPatch_OPERATION_REMOVE,
		Context: meshv1.EnvoyPatch_CONTEXT_SIDECAR_INBOUND, Match: &meshv1.PatchMatch{Port: 8080}}
	out := patch.NewSet([]*patch.Filter{filter(inbound)}, nil).Listeners(listeners(t), false)
	if len(out[1].FilterChains) != 0 || len(out[0].FilterChains) != 1 {
		t.Errorf("the inbound chain of port 8080 should go, and it alone: %d and %d chains", len(out[0].FilterChains), len(out[1].FilterChains))
	}
	if out := patch.NewSet([]*patch.Filter{filter(inbound)}, nil).Listeners(listeners(t), true); len(out[1].FilterChains) != 1 {
		t.Error("a sidecar's patch applied to a gateway")
	}

	first := filter(httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_FIRST, "", "from-root"))
	first.Root, first.Spec.Priority = true, 100
	second := filter(httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_FIRST, "", "low-priority"))
	second.Spec.Priority = -5
	third := filter(httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_FIRST, "", "high-priority"))
	third.Spec.Priority = 5
	versioned := httpPatch(t, meshv1.EnvoyPatch_OPERATION_INSERT_FIRST, "", "old-proxies")
	versioned.ProxyVersion = `^1\.2.*`
	out = patch.NewSet([]*patch.Filter{third, filter(versioned), second, first}, map[string]bool{`^1\.2.*`: false}).Listeners(listeners(t), false)
	if got, want := strings.Join(httpFilterNames(t, out[0]), ","), "high-priority,low-priority,from-root,a,b,envoy.filters.http.router"; got != want {
		t.Errorf("filters %s, want %s (each inserted first: the root's first, then by priority)", got, want)
	}
}

// TestMergeAndRefusals: a MERGE of a connection manager's settings merges
// them into its typed configuration; a patch that would make a resource
// invalid is refused and the resource kept; an ADD of a cluster that
// exists is refused.
func TestMergeAndRefusals(t *testing.T) {
	merge := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_NETWORK_FILTER, Operation: meshv1.EnvoyPatch_OPERATION_MERGE,
		Match: &meshv1.PatchMatch{FilterName: "envoy.filters.network.http_connection_manager"},
		Value: value(t, map[string]any{"typed_config": map[string]any{
			"@type":                        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
			"common_http_protocol_options": map[string]any{"idle_timeout": "30s"}}})}
	out := patch.NewSet([]*patch.Filter{filter(merge)}, nil).Listeners(listeners(t), false)
	m := &hcm.HttpConnectionManager{}
	if err := out[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
	if m.GetCommonHttpProtocolOptions().GetIdleTimeout().AsDuration().Seconds() != 30 || len(m.HttpFilters) != 3 || m.StatPrefix != "out" {
		t.Errorf("merged manager %v: want the idle timeout added and the rest kept", m)
	}

	clusters := []*cluster.Cluster{{Name: "outbound|80||a.ns", ConnectTimeout: durationpb.New(1e9),
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS}}}
	bad := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_CLUSTER, Operation: meshv1.EnvoyPatch_OPERATION_MERGE,
		Match: &meshv1.PatchMatch{ClusterPort: 80}, Value: value(t, map[string]any{"connect_timeout": "-1s"})}
	dup := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_CLUSTER, Operation: meshv1.EnvoyPatch_OPERATION_ADD,
		Value: value(t, map[string]any{"name": "outbound|80||a.ns", "connect_timeout": "2s"})}
	s := patch.NewSet([]*patch.Filter{filter(bad, dup)}, nil)
	got := s.Clusters(clusters, false)
	if len(got) != 1 || got[0].GetConnectTimeout().AsDuration().Seconds() != 1 {
		t.Errorf("clusters %v: want the one cluster, unpatched", got)
	}
	quarter := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_CLUSTER, Operation: meshv1.EnvoyPatch_OPERATION_MERGE,
		Value: value(t, map[string]any{"connect_timeout": "0.25s"})}
	if got := patch.NewSet([]*patch.Filter{filter(quarter)}, nil).Clusters(clusters, false)[0].GetConnectTimeout().AsDuration(); got.Seconds() != 0.25 {
		t.Errorf("a merged duration is %v, want 250ms: replaced whole, as Istio merges them", got)
	}
	var reasons []string
	for _, r := range s.Refusals() {
		reasons = append(reasons, r.String())
	}
	slices.Sort(reasons) // by the patch's place: the merge, then the ADD
	if len(reasons) != 2 || !strings.Contains(reasons[0], "ConnectTimeout") || !strings.Contains(reasons[1], "generated already") {
		t.Errorf("refusals %q: want the invalid merge and the duplicate", reasons)
	}
}

// TestRoutePatches: virtual hosts and routes, in RDS configurations and
// in those a listener holds inline.
func TestRoutePatches(t *testing.T) {
	rc := &route.RouteConfiguration{Name: "9080", VirtualHosts: []*route.VirtualHost{{Name: "a:9080", Domains: []string{"a"}, Routes: []*route.Route{{
		Name: "default", Match: &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: "c"}}}}}}}}
	first := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_HTTP_ROUTE, Operation: meshv1.EnvoyPatch_OPERATION_INSERT_FIRST,
		Match: &meshv1.PatchMatch{Port: 9080, VhostName: "a:9080"},
		Value: value(t, map[string]any{"name": "health", "match": map[string]any{"path": "/healthz"}, "direct_response": map[string]any{"status": 200}})}
	vh := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_VIRTUAL_HOST, Operation: meshv1.EnvoyPatch_OPERATION_ADD,
		Match: &meshv1.PatchMatch{RouteConfigName: "9080"}, Value: value(t, map[string]any{"name": "extra", "domains": []any{"extra.example.com"}})}
	got := patch.NewSet([]*patch.Filter{filter(first, vh)}, nil).Routes([]*route.RouteConfiguration{rc}, false)
	var names []string
	for _, r := range got[0].VirtualHosts[0].Routes {
		names = append(names, r.Name)
	}
	if !slices.Equal(names, []string{"health", "default"}) || len(got[0].VirtualHosts) != 2 || len(rc.VirtualHosts[0].Routes) != 1 {
		t.Errorf("routes %v, %d virtual hosts: want health first and the extra host, the given configuration untouched", names, len(got[0].VirtualHosts))
	}
}
