package pusher

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
)

// loadDir normalizes a directory of Istio YAML into stored objects.
func loadDir(t testing.TB, dir string) []model.Stored {
	t.Helper()
	inputs, problems, err := yamldir.Read(dir, time.Time{})
	if err != nil || len(problems) > 0 {
		t.Fatal(err, problems)
	}
	objs, problems := istio.Normalize(inputs, istio.Options{})
	for _, p := range problems {
		if !p.Warning {
			t.Fatal(p)
		}
	}
	out := make([]model.Stored, len(objs))
	for i, o := range objs {
		out[i] = model.Stored{Key: o.Key, Object: o.Object, ModRevision: 1}
	}
	return out
}

// node is an Envoy sidecar of a namespace, as Istio's agent names it.
func node(ns string, proxyless bool) *core.Node {
	md := map[string]any{"NAMESPACE": ns}
	if proxyless {
		md["GENERATOR"] = "grpc"
	}
	s, _ := structpb.NewStruct(md)
	return &core.Node{Id: "sidecar~10.1.0.1~pod." + ns + "~" + ns + ".svc.cluster.local", Metadata: s}
}

func sorted[R types.Resource](res map[string]types.Resource) []R {
	out := make([]R, 0, len(res))
	for _, name := range slices.Sorted(maps.Keys(res)) {
		out = append(out, res[name].(R))
	}
	return out
}

// TestTelemetryAndEnvoyFilters: what Envoys of three namespaces are sent
// for the mesh of testdata/shaping (goldens, each resource passing
// Validate): the mesh-wide access log, none in quiet, tracing at 10% with
// a custom tag and the EnvoyFilters' patches in shop, the invalid patch
// refused (logged and counted once) with the rest served, and a proxyless
// client of shop sent none of it.
func TestTelemetryAndEnvoyFilters(t *testing.T) {
	objs := loadDir(t, "testdata/shaping")
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return objs, 10, nil },
		}}
		classes := []cache.Class{"envoy/shop/", "envoy/quiet/", "envoy/~/", "proxyless/shop/"}
		sink := &scopedSink{classes: classes}
		p, stop := run(t, Config{Loader: loader, Feed: &scriptedFeed{}, Tables: sink}, 3*time.Second)
		defer stop()
		for i, ns := range []string{"shop", "quiet", "elsewhere"} {
			if got := p.Classify(node(ns, false)); got != classes[i] {
				t.Errorf("an Envoy of %s is of class %s, want %s", ns, got, classes[i])
			}
		}
		if got := p.Classify(node("shop", true)); got != classes[3] {
			t.Errorf("a proxyless client of shop is of class %s, want %s", got, classes[3])
		}
		for _, c := range []struct {
			class cache.Class
			name  string
		}{{"envoy/shop/", "shop"}, {"envoy/quiet/", "quiet"}, {"envoy/~/", "elsewhere"}} {
			golden.CheckValid(t, "shaping-listeners-"+c.name+".json", sorted[*listener.Listener](sink.resources(c.class, resource.ListenerType)))
		}
		golden.CheckValid(t, "shaping-clusters-shop.json", sorted[*cluster.Cluster](sink.resources("envoy/shop/", resource.ClusterType)))
		golden.CheckValid(t, "shaping-routes-shop.json", sorted[*route.RouteConfiguration](sink.resources("envoy/shop/", resource.RouteType)))

		if n := testutil.ToFloat64(p.m.refusals); n != 1 {
			t.Errorf("%v refusals counted, want 1 (the broken EnvoyFilter's patch, once)", n)
		}
		reviews := sink.resources("envoy/shop/", resource.ClusterType)["outbound|9080||reviews.shop.svc.cluster.local"].(*cluster.Cluster)
		if got := reviews.GetConnectTimeout().AsDuration(); got != 1500*time.Millisecond {
			t.Errorf("reviews' connect timeout %v, want 1.5s (the valid patch applied, the invalid one refused)", got)
		}
		// The proxyless class: grpc-go is sent what it accepts, none of the
		// Envoy extensions.
		for _, typ := range []string{resource.ListenerType, resource.ClusterType} {
			for name, r := range sink.resources("proxyless/shop/", typ) {
				js, _ := protojson.Marshal(r)
				for _, envoyOnly := range []string{"lua", "access_log", "tracing", "opentelemetry", "1.500s"} {
					if strings.Contains(string(js), envoyOnly) {
						t.Errorf("proxyless %s %s holds %q", typ[strings.LastIndex(typ, ".")+1:], name, envoyOnly)
					}
				}
			}
		}
	})
}
