package kube_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// TestIstioChangesSyncTheirResourceAlone: a change of one VirtualService
// or DestinationRule (any Istio resource that normalizes by itself) is
// normalized and written alone, its deletion deletes it alone, and an
// invalid change of it keeps its last valid version; the other resources
// are neither read again nor compared with the store. A WorkloadEntry's
// change reaches the ServiceEntry whose endpoints it joins, reading only
// the ServiceEntries and WorkloadEntries of its namespace.
func TestIstioChangesSyncTheirResourceAlone(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	_, cli := testutil.Etcd(t)
	ns := kc.Namespace(t, nil)
	const n = 10
	hosts := make([]any, n)
	for i := range n {
		hosts[i] = fmt.Sprintf("h%d.example.com", i)
	}
	apply(t, kc, istioObject("WorkloadEntry", "v1", ns, "vm-1", map[string]any{"address": "10.4.0.1", "labels": map[string]any{"app": "vm"}}))
	apply(t, kc, istioObject("ServiceEntry", "v1", ns, "vms", map[string]any{
		"hosts": hosts, "resolution": "STATIC",
		"ports":            []any{map[string]any{"number": 80, "name": "http", "protocol": "HTTP"}},
		"workloadSelector": map[string]any{"labels": map[string]any{"app": "vm"}},
	}))
	for i := range n {
		apply(t, kc, istioObject("VirtualService", "v1", ns, fmt.Sprintf("vs-%d", i), routeTo(hosts[i].(string), "1s")))
		apply(t, kc, istioObject("DestinationRule", "v1", ns, fmt.Sprintf("dr-%d", i), map[string]any{"host": hosts[i]}))
	}
	var mu sync.Mutex
	var synced []ingest.Result
	r := startSource(t, kc, cli, "c1", func(c *kube.Config) {
		c.OnSynced = func(res ingest.Result) {
			mu.Lock()
			defer mu.Unlock()
			synced = append(synced, res)
		}
	})
	for i := range n {
		r.object(t, fmt.Sprintf("/mesh/v1/routerules/%s/vs-%d", ns, i), "the VirtualServices are written", nil)
	}
	syncs := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(synced)
	}
	// wrote waits for the first sync after the from'th that wrote
	// something, and checks it wrote one object and found unchanged ones
	// (those it compared with the store), whatever syncs without writes
	// came between.
	wrote := func(from, unchanged int) {
		t.Helper()
		var res ingest.Result
		testutil.Eventually(t, 10*time.Second, "the sync that wrote it", func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			for _, res = range synced[from:] {
				if res.Written > 0 {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d syncs since, none wrote", len(synced)-from)
		})
		if res.Written != 1 || res.Unchanged != unchanged {
			t.Errorf("the sync wrote %d objects and compared %d unchanged ones, want 1 and %d: %+v", res.Written, res.Unchanged, unchanged, res)
		}
	}

	timeout := func(want string) func(model.Object) (bool, string) {
		return func(o model.Object) (bool, string) {
			got := o.(*meshv1.RouteRule).GetHttp()[0].GetTimeout().AsDuration().String()
			return got == want, got
		}
	}

	// One VirtualService changes: it alone is written, and no other
	// resource is compared with the store (none is unchanged).
	from := syncs()
	updateSpec(t, kc, ns, "VirtualService", "vs-3", routeTo("h3.example.com", "3s"))
	r.object(t, "/mesh/v1/routerules/"+ns+"/vs-3", "the changed VirtualService is written", timeout("3s"))
	wrote(from, 0)
	r.object(t, "/mesh/v1/routerules/"+ns+"/vs-4", "the others stay", timeout("1s"))

	// An invalid change keeps its last valid version; a later valid one
	// is written.
	bad := routeTo("h3.example.com", "5s")
	bad["http"].([]any)[0].(map[string]any)["match"] = []any{map[string]any{"uri": map[string]any{"regex": "/(unclosed"}}}
	updateSpec(t, kc, ns, "VirtualService", "vs-3", bad)
	eventFor(t, kc, ns, "VirtualService", "vs-3", "spec.http[0].match[0].uri.regex")
	r.object(t, "/mesh/v1/routerules/"+ns+"/vs-3", "an invalid change keeps the last valid version", timeout("3s"))
	updateSpec(t, kc, ns, "VirtualService", "vs-3", routeTo("h3.example.com", "4s"))
	r.object(t, "/mesh/v1/routerules/"+ns+"/vs-3", "a valid change after it is written", timeout("4s"))

	// A deletion deletes it alone.
	deleteIstio(t, kc, ns, "VirtualService", "vs-5")
	r.absent(t, "/mesh/v1/routerules/"+ns+"/vs-5", "a deleted VirtualService leaves the store")
	deleteIstio(t, kc, ns, "DestinationRule", "dr-6")
	r.absent(t, "/mesh/v1/trafficpolicies/"+ns+"/dr-6", "a deleted DestinationRule leaves the store")
	for _, key := range []string{"routerules/" + ns + "/vs-6", "trafficpolicies/" + ns + "/dr-5"} {
		r.object(t, "/mesh/v1/"+key, "the others stay", nil)
	}

	// A WorkloadEntry is joined into its ServiceEntry's endpoints: its
	// change reaches them, and reads the ServiceEntries and
	// WorkloadEntries of its namespace alone (the ServiceEntry's service
	// is unchanged, and nothing else is compared).
	from = syncs()
	updateSpec(t, kc, ns, "WorkloadEntry", "vm-1", map[string]any{"address": "10.4.0.2", "labels": map[string]any{"app": "vm"}})
	r.object(t, "/mesh/v1/endpoints/"+ns+"/vms/c1", "a WorkloadEntry's change reaches its ServiceEntry's endpoints", func(o model.Object) (bool, string) {
		e := o.(*meshv1.Endpoints)
		return len(e.Endpoints) == 1 && e.Endpoints[0].Address == "10.4.0.2", fmt.Sprint(e)
	})
	wrote(from, 1)
	// A WorkloadEntry that goes takes its endpoint with it.
	deleteIstio(t, kc, ns, "WorkloadEntry", "vm-1")
	r.absent(t, "/mesh/v1/endpoints/"+ns+"/vms/c1", "a deleted WorkloadEntry's endpoint goes")
	r.object(t, "/mesh/v1/services/"+ns+"/vms", "its ServiceEntry stays", nil)
}
