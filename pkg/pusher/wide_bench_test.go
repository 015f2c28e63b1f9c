package pusher

import (
	"fmt"
	"slices"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// BenchmarkWideNamespace measures a full generation, into a real cache,
// of a mesh with 20,000 services in one namespace that every proxy sees
// (the heavy-input suite's case) beside a service in each of five
// namespaces whose Envoys have a class of their own, and the proxyless
// class: the cost of a change unrelated to the wide namespace while it is
// there (one of the five services changes its protocol, so that each
// class generates).
func BenchmarkWideNamespace(b *testing.B) {
	const wide = 20000
	var items []model.Stored
	for i := range wide {
		s := stored(fmt.Sprintf("w-%d", i), 80)
		s.Key.Namespace = "wide"
		s.Object.(*meshv1.Service).Hostnames = []string{fmt.Sprintf("w-%d.wide.svc.cluster.local", i)}
		items = append(items, s)
	}
	classes := slices.Clone(Classes)
	for i := range 5 {
		ns := fmt.Sprintf("ns-%d", i)
		items = append(items, serviceIn(ns, meshv1.Protocol_PROTOCOL_HTTP))
		classes = append(classes, cache.Class("envoy/"+ns+"/"))
	}
	p, c := generated(b, items, classes)
	rev := int64(1)
	for b.Loop() {
		rev++
		protocol := meshv1.Protocol_PROTOCOL_HTTP
		if rev%2 == 0 {
			protocol = meshv1.Protocol_PROTOCOL_GRPC
		}
		p.putAndGenerate(b, serviceIn("ns-0", protocol), rev)
	}
	// Each kind of proxy's clusters of the wide namespace are made once,
	// at the first generation: the generation cache holds them all.
	if miss := testutil.ToFloat64(p.m.cache.WithLabelValues("cds", "miss")); miss > 2*wide+100 {
		b.Errorf("%v cluster cache misses over %d generations: the cache does not hold %d services", miss, rev, wide)
	}
	if n := len(c.Resources("envoy/ns-3/", resource.ClusterType)); n < wide {
		b.Fatalf("ns-3's Envoys hold %d clusters, want the wide namespace's %d at least", n, wide)
	}
}
