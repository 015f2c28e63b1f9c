package pusher

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// TestAnAliasAloneRegenerates: an ExternalName Service added by itself
// (nothing else changing) reaches the classes that see it: a sidecar's
// virtual host of the host it names answers to its names, a proxyless
// client gets a listener for it. Its services' print left aliases out,
// so the classes stayed as they were until something else changed.
func TestAnAliasAloneRegenerates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("backend", 80)}, 10, nil },
		}}
		legacy := stored("legacy", 80)
		spec := legacy.Object.(*meshv1.Service)
		spec.Resolution, spec.AliasOf = meshv1.Resolution_RESOLUTION_DNS, "backend.ns.svc.cluster.local"
		value, err := model.Encode(spec)
		if err != nil {
			t.Fatal(err)
		}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{
			{Type: meshv1.ChangeEvent_TYPE_PUT, Key: legacy.Key.String(), Revision: 11, Value: value}}}}}
		sink := &scopedSink{classes: []cache.Class{"envoy/ns/", "proxyless/ns/"}}
		_, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, 5*time.Second)
		stop()
		var domains []string
		if rc, ok := sink.resources("envoy/ns/", resource.RouteType)["80"].(*route.RouteConfiguration); ok {
			for _, vh := range rc.VirtualHosts {
				if vh.Name == "backend.ns.svc.cluster.local:80" {
					domains = vh.Domains
				}
			}
		}
		if !slices.Contains(domains, "legacy.ns.svc.cluster.local") {
			t.Errorf("the sidecar's virtual host of backend answers to %v, want the alias's names too", domains)
		}
		if _, ok := sink.resources("proxyless/ns/", resource.ListenerType)["legacy.ns.svc.cluster.local:80"]; !ok {
			t.Error("the proxyless client has no listener for the alias")
		}
	})
}
