package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// leaderOf returns the replica leading an election ("" when none does):
// the campaign with the lowest create revision.
func leaderOf(t *testing.T, cli *clientv3.Client, election string) string {
	t.Helper()
	resp, err := cli.Get(testutil.Context(t), store.ElectionPrefix+election+"/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return ""
	}
	return string(resp.Kvs[0].Value)
}

// TestKubeNamespaceParts: one cluster's namespaces split into two parts
// are ingested by two replicas, a part each (its own source and
// election), and a grpc-go client of each namespace's service reaches its
// EndpointSlice backend; when one replica stops, the other takes its part
// over, and a Service created then in that part reaches the store and its
// client.
func TestKubeNamespaceParts(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	namespaces, backends := namespacesInTwoParts(t, kc)
	stops := map[string]context.CancelFunc{}
	var mu sync.Mutex
	// A replica: its announcement and its sources, until stopped.
	replica := func(id string) source {
		return func(ctx context.Context, in ingester) error {
			cli, log := in.etcd, in.log
			ctx, cancel := context.WithCancel(ctx)
			mu.Lock()
			stops[id] = cancel
			mu.Unlock()
			var announced sync.WaitGroup
			announced.Go(func() {
				_ = store.Announce(ctx, cli, store.Member{Role: "ingester", Name: id, Admin: id + ":15015"}, 0, log)
			})
			share := &app.Share{Etcd: cli, Role: "ingester", Every: 100 * time.Millisecond}
			_ = app.KubeSource{Etcd: cli, Cluster: "c1", Kube: kc.Config, Parts: 2, Log: log.With("replica", id),
				Election: app.Election{ID: id, TTL: time.Second, Share: share}}.Run(ctx)
			cancel()
			announced.Wait()
			return nil // a replica stopped leaves the control plane running
		}
	}
	cp := NewCluster(t, Options{}, replica("a"), replica("b"))
	cli := cp.etcd

	elections := []string{"source/" + kube.PartName("c1", 0, 2), "source/" + kube.PartName("c1", 1, 2)}
	testutil.Eventually(t, 60*time.Second, "each replica to lead one part", func() (bool, string) {
		leaders := []string{leaderOf(t, cli, elections[0]), leaderOf(t, cli, elections[1])}
		slices.Sort(leaders)
		return slices.Equal(leaders, []string{"a", "b"}), fmt.Sprint(leaders)
	})
	// Every namespace's Service is stored, by its part's source.
	services := func() map[string]string {
		items, _, _, err := store.New(cli).List(testutil.Context(t))
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, it := range items {
			if it.Key.Kind == model.KindService {
				out[it.Key.Namespace+"/"+it.Key.Name] = it.Object.GetOrigin().GetSource()
			}
		}
		return out
	}
	testutil.Eventually(t, 30*time.Second, "every Service stored by its part's source", func() (bool, string) {
		got := services()
		for _, ns := range namespaces {
			if sourceOf(got, ns+"/svc") != kube.PartName("c1", kube.PartOf(ns, 2), 2) {
				return false, fmt.Sprint(got)
			}
		}
		return true, ""
	})
	// And served: each namespace's client reaches its backend.
	for _, ns := range namespaces {
		allOn(t, dialXDS(t, cp.ads, fmt.Sprintf("xds:///svc.%s.svc.cluster.local:50051", ns)), backends[ns].addr,
			"a client of "+ns+"'s service, in part "+fmt.Sprint(kube.PartOf(ns, 2)))
	}

	// The replica leading part 0 stops; the other takes it over.
	gone := leaderOf(t, cli, elections[0])
	mu.Lock()
	stops[gone]()
	mu.Unlock()
	testutil.Eventually(t, 30*time.Second, "the other replica to lead both parts", func() (bool, string) {
		l0, l1 := leaderOf(t, cli, elections[0]), leaderOf(t, cli, elections[1])
		return l0 != "" && l0 != gone && l1 == l0, l0 + " " + l1
	})
	var late string
	for _, ns := range namespaces {
		if kube.PartOf(ns, 2) == 0 {
			late = ns
		}
	}
	lateBackend := startBackendOn(t, hostIP(t))
	createService(t, kc, late, "late", 50051)
	createWorkload(t, kc, late, "late", "late-1", "v1", lateBackend)
	testutil.Eventually(t, 30*time.Second, "a Service of the taken-over part to be stored", func() (bool, string) {
		src := sourceOf(services(), late+"/late")
		return src == kube.PartName("c1", 0, 2), src
	})
	allOn(t, dialXDS(t, cp.ads, fmt.Sprintf("xds:///late.%s.svc.cluster.local:50051", late)), lateBackend.addr,
		"a client of the service created after the takeover")
}

// namespacesInTwoParts makes namespaces until each of two parts has two,
// with a service and a backend each.
func namespacesInTwoParts(t *testing.T, kc *kubetest.Cluster) ([]string, map[string]backend) {
	ip := hostIP(t)
	var namespaces []string
	backends := map[string]backend{}
	inPart := [2]int{}
	for inPart[0] < 2 || inPart[1] < 2 {
		ns := kc.Namespace(t, nil)
		if p := kube.PartOf(ns, 2); inPart[p] < 2 {
			inPart[p]++
			namespaces = append(namespaces, ns)
			backends[ns] = startBackendOn(t, ip)
			createService(t, kc, ns, "svc", 50051)
			createWorkload(t, kc, ns, "svc", "svc-1", "v1", backends[ns])
		}
	}
	return namespaces, backends
}

// sourceOf returns the source of the stored Service named namespace/name
// (its key's name may carry the cluster: name@cluster).
func sourceOf(services map[string]string, name string) string {
	for k, src := range services {
		if k == name || strings.HasPrefix(k, name+"@") {
			return src
		}
	}
	return ""
}

// TestKubeSourceSyncedMeansWritten: an unelected replica running every
// part of a cluster says it has synced (what the ingester's readiness
// waits for) only once each part has written the cluster's state: a
// pusher started after it loads the mesh, not an empty store whose
// filling then moves every connected proxy to another class.
func TestKubeSourceSyncedMeansWritten(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	var namespaces []string
	for range 6 {
		ns := kc.Namespace(t, nil)
		createService(t, kc, ns, "svc", 50051)
		namespaces = append(namespaces, ns)
	}
	_, cli := testutil.Etcd(t)
	ctx, cancel := context.WithCancel(testutil.Context(t))
	synced := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- app.KubeSource{Etcd: cli, Cluster: "c1", Kube: kc.Config, Parts: 2, Log: testutil.Log(t),
			OnAllSynced: func() { close(synced) }}.Run(ctx)
	}()
	defer func() { cancel(); <-done }()
	select {
	case <-synced:
	case err := <-done:
		t.Fatalf("the source ended before it synced: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the source did not sync within a minute")
	}
	items, _, _, err := store.New(cli).List(testutil.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]bool{}
	for _, it := range items {
		if it.Key.Kind == model.KindService {
			stored[it.Key.Namespace] = true
		}
	}
	for _, ns := range namespaces {
		if !stored[ns] {
			t.Errorf("synced, but the Service of %s (part %d) is not in the store", ns, kube.PartOf(ns, 2))
		}
	}
}
