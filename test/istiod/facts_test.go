package istiod

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestFacts: lists of named things are keyed by name, plain lists are
// sets, telemetry is left out, and a comparison counts what both say.
func TestFacts(t *testing.T) {
	meta, _ := structpb.NewStruct(map[string]any{"istio": "x"})
	a := &route.VirtualHost{Name: "r:80", Domains: []string{"r", "r:80"}, Routes: []*route.Route{{Name: "default",
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: "c"}}}}}}
	b := &route.VirtualHost{Name: "r:80", Domains: []string{"r:80", "r"}, Routes: []*route.Route{{Name: "default",
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: "d"}}}}}}
	fa, err := Of("vh", a)
	if err != nil {
		t.Fatal(err)
	}
	fb, _ := Of("vh", b)
	if fa["vh.domains[]=r"] != "present" || fa["vh.routes[default].route.cluster"] != "c" {
		t.Errorf("facts %v", fa)
	}
	c := Compare(fa, fb)
	if c.Compared != 5 || c.Equal != 4 || len(c.Differences) != 1 || c.Differences[0] != "vh.routes[default].route.cluster: c | d" {
		t.Errorf("comparison %+v", c)
	}
	withMeta, _ := Of("c", &cluster.Cluster{Name: "c", AltStatName: "s", Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": meta}},
		PerConnectionBufferLimitBytes: wrapperspb.UInt32(32768)})
	if len(withMeta) != 2 || withMeta["c.per_connection_buffer_limit_bytes"] != "32768" {
		t.Errorf("telemetry not left out: %v", withMeta)
	}
}
