package pusher

import (
	"testing"
	"testing/synctest"
	"time"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// zonalEndpoints are endpoints of service a in the localities given.
func zonalEndpoints(t *testing.T, rev int64, localities ...string) model.Stored {
	t.Helper()
	eps := &meshv1.Endpoints{Service: "a", Shard: "test"}
	for i, l := range localities {
		eps.Endpoints = append(eps.Endpoints, &meshv1.Endpoint{Address: "10.0.0." + string(rune('1'+i)), Locality: &meshv1.Locality{Region: l, Zone: "z1"}})
	}
	return model.Stored{Key: model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: model.EndpointsName("a", "test")}, Object: eps, ModRevision: rev}
}

func event(t *testing.T, s model.Stored) *meshv1.ChangeEvent {
	t.Helper()
	v, err := model.Encode(s.Object)
	if err != nil {
		t.Fatal(err)
	}
	return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Revision: s.ModRevision, Key: s.Key.String(), Value: v}
}

// localities maps a locality table's assignment of a's port 80 to the
// priority of each region.
func regionPriorities(c *cache.Cache, class cache.Class) map[string]uint32 {
	cla, _ := c.Resources(class, resource.EndpointType)["outbound|80||a.ns.svc.cluster.local"].(*endpoint.ClusterLoadAssignment)
	out := map[string]uint32{}
	for _, g := range cla.GetEndpoints() {
		out[g.Locality.Region] = g.Priority
	}
	return out
}

// TestLocalityTables: a locality's table, filled when its first proxy
// comes, holds the assignments as its proxies see them (priorities for a
// destination with outlier detection, the shared objects for the rest,
// whose encoding is reused), and an endpoint change reaches it.
func TestLocalityTables(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		policy := model.Stored{Key: model.Key{Kind: model.KindTrafficPolicy, Namespace: "ns", Name: "a"}, ModRevision: 4,
			Object: &meshv1.TrafficPolicy{Host: "a.ns.svc.cluster.local", OutlierDetection: &meshv1.OutlierDetection{Consecutive_5XxErrors: 5}}}
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) {
				return []model.Stored{stored("a", 80), stored("b", 80), policy, zonalEndpoints(t, 5, "r1", "r2")}, 10, nil
			},
		}}
		feed := &scriptedFeed{batches: []feedBatch{{delay: 2 * time.Second, events: []*meshv1.ChangeEvent{event(t, zonalEndpoints(t, 11, "r2", "r3"))}}}}
		shared, err := cache.New(cache.Config{Classes: Classes, Types: ClassTypes, SharedTypes: SharedTypes})
		if err != nil {
			t.Fatal(err)
		}
		local, err := cache.New(cache.Config{Types: SharedTypes, Reuse: shared})
		if err != nil {
			t.Fatal(err)
		}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: shared, Localities: local}, time.Second)
		defer stop()
		local.AddClass("r1/z1/", p.FillLocality)
		if got := regionPriorities(local, "r1/z1/"); got["r1"] != 0 || got["r2"] != 1 {
			t.Errorf("priorities %v, want r1 0, r2 1", got)
		}
		if got := regionPriorities(shared, cache.Shared); got["r1"] != 0 || got["r2"] != 0 {
			t.Errorf("shared priorities %v, want none", got)
		}
		b := "outbound|80||b.ns.svc.cluster.local"
		if shared.Resources(cache.Shared, resource.EndpointType)[b] != local.Resources("r1/z1/", resource.EndpointType)[b] {
			t.Error("b's assignment is not the shared one")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := regionPriorities(local, "r1/z1/"); len(got) != 2 || got["r2"] != 0 || got["r3"] != 0 {
			t.Errorf("after the endpoint change, priorities %v, want r2 and r3 at 0 (neither is the proxy's region)", got)
		}
	})
}
