package pusher

import (
	"fmt"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// BenchmarkShaping measures what Telemetries and EnvoyFilters add to a
// class's generation: the mesh of testdata/shaping with 200 more HTTP
// services of namespace shop, generated for shop's Envoys without
// (plain) and with (shaped) its access logs, tracing and patches. The
// ratio of the two is the cost of the shaping, per class generation.
func BenchmarkShaping(b *testing.B) {
	objs := loadDir(b, "testdata/shaping")
	for i := range 200 {
		s := stored(fmt.Sprintf("svc-%d", i), 9080)
		s.Key.Namespace = "shop"
		s.Object.(*meshv1.Service).Hostnames = []string{fmt.Sprintf("svc-%d.shop.svc.cluster.local", i)}
		objs = append(objs, s)
	}
	bld := meshbuild.New()
	bld.Reset(objs)
	mesh := bld.Build().Mesh
	view := generate.View{Namespace: "shop"}
	m := mesh.For(view)
	sec := mesh.PoliciesFor("shop", nil)
	generateClass := func(s shaping) int {
		clusters := s.clusters(generate.Clusters(m, generate.Envoy))
		routes := s.routes(generate.Routes(m, generate.Envoy))
		listeners := s.listeners(generate.Listeners(m, generate.Envoy, sec))
		return len(clusters) + len(routes) + len(listeners)
	}
	b.Run("plain", func(b *testing.B) {
		for b.Loop() {
			generateClass(shaping{})
		}
	})
	b.Run("shaped", func(b *testing.B) {
		p := &Pusher{} // its decoded patches kept from one generation to the next
		for b.Loop() {
			s := p.shapingFor(mesh, envoyOnly(sec), "shop", nil, false)
			generateClass(s)
			if len(s.patches.Refusals()) != 1 {
				b.Fatalf("refusals %v, want the broken patch's", s.patches.Refusals())
			}
		}
	})
}
