package pusher

import (
	"fmt"
	"slices"
	"testing"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"

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
	items, classes := wideMesh(wide)
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

// wideMesh is BenchmarkWideNamespace's mesh and classes.
func wideMesh(wide int) ([]model.Stored, []cache.Class) {
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
	return items, classes
}

// BenchmarkWideNamespaceRoute measures, in BenchmarkWideNamespace's mesh,
// a change of a VirtualService of one of the five services (its timeout):
// each class reroutes its virtual host (see Pusher.rerouteClass), and
// generates nothing else. BenchmarkWideNamespaceRoute/whole generates
// every class whole for the same change, as every route change did
// before, for the ratio.
func BenchmarkWideNamespaceRoute(b *testing.B) {
	for _, whole := range []bool{false, true} {
		name := "rerouted"
		if whole {
			name = "whole"
		}
		b.Run(name, func(b *testing.B) {
			items, classes := wideMesh(20000)
			p, c := generated(b, items, classes)
			const host = "a.ns-0.svc.cluster.local"
			rev := int64(1)
			for b.Loop() {
				rev++
				rule := model.Stored{Key: model.Key{Kind: model.KindRouteRule, Namespace: "ns-0", Name: "a"},
					Object: routeRule(host, time.Duration(rev)*time.Second)}
				p.put(b, rule, rev)
				p.generate(change{n: 1, since: time.Now(), full: true, whole: whole})
			}
			if !whole && testutil.ToFloat64(p.m.classes.WithLabelValues("rerouted")) == 0 {
				b.Error("no class was rerouted")
			}
			rc, _ := c.Resources("envoy/ns-3/", resource.RouteType)["80"].(*route.RouteConfiguration)
			i := slices.IndexFunc(rc.GetVirtualHosts(), func(vh *route.VirtualHost) bool { return vh.Name == host+":80" })
			if i < 0 || rc.VirtualHosts[i].Routes[0].GetRoute().GetTimeout().AsDuration() != time.Duration(rev)*time.Second {
				b.Errorf("ns-3's Envoys' route configuration 80 does not route %s with the last change's timeout (%ds)", host, rev)
			}
		})
	}
}
