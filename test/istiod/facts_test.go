package istiod

import (
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestFacts: lists of named things are keyed by name (and turn, where
// names repeat), a virtual host's routes are in order too, plain lists
// are sets, telemetry is left out, and a comparison counts what both say.
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
	if c.Compared != 6 || c.Equal != 5 || len(c.Differences) != 1 || c.Differences[0] != "vh.routes[default].route.cluster: c | d" {
		t.Errorf("comparison %+v", c)
	}
	// Routes of one name (one rule's matches) are told apart by their
	// turn, and the routes' order is a fact of its own.
	first, second := proto.CloneOf(a.Routes[0]), proto.CloneOf(a.Routes[0])
	second.Match = &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/a"}}
	a.Routes = append(a.Routes, first, second)
	fa, _ = Of("vh", a)
	if fa["vh.routes[default #3].match.prefix"] != "/a" || fa["vh.routes.order"] != "default, default #2, default #3" {
		t.Errorf("routes of one name: %v", fa)
	}
	withMeta, _ := Of("c", &cluster.Cluster{Name: "c", AltStatName: "s", Metadata: &core.Metadata{FilterMetadata: map[string]*structpb.Struct{"istio": meta}},
		PerConnectionBufferLimitBytes: wrapperspb.UInt32(32768)})
	if len(withMeta) != 2 || withMeta["c.per_connection_buffer_limit_bytes"] != "32768" {
		t.Errorf("telemetry not left out: %v", withMeta)
	}
}
