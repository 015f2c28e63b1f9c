package app_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/cmd/internal/app"
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
// election); when one replica stops, the other takes its part over, and a
// Service created then in that part reaches the store.
func TestKubeNamespaceParts(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	// Namespaces until each part has two.
	var namespaces []string
	inPart := [2]int{}
	for inPart[0] < 2 || inPart[1] < 2 {
		ns := kc.Namespace(t, nil)
		if p := kube.PartOf(ns, 2); inPart[p] < 2 {
			inPart[p]++
			namespaces = append(namespaces, ns)
		}
	}
	for i, ns := range namespaces {
		createService(t, kc, ns, "svc", int32(8080+i))
	}
	_, cli := testutil.Etcd(t)
	var wg sync.WaitGroup
	replica := func(id string) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		share := &app.Share{Etcd: cli, Role: "ingester", Every: 100 * time.Millisecond}
		wg.Go(func() {
			_ = store.Announce(ctx, cli, store.Member{Role: "ingester", Name: id, Admin: id + ":15015"}, 0, testutil.Log(t))
		})
		wg.Go(func() {
			_ = app.KubeSource{Etcd: cli, Cluster: "c1", Kube: kc.Config, Parts: 2, Log: testutil.Log(t).With("replica", id),
				Election: app.Election{ID: id, TTL: time.Second, Share: share}}.Run(ctx)
		})
		return cancel
	}
	stopA := replica("a")
	stopB := replica("b")
	t.Cleanup(func() { stopA(); stopB(); wg.Wait() })

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

	// The replica leading part 0 stops; the other takes it over.
	gone := leaderOf(t, cli, elections[0])
	map[string]context.CancelFunc{"a": stopA, "b": stopB}[gone]()
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
	createService(t, kc, late, "late", 9090)
	testutil.Eventually(t, 30*time.Second, "a Service of the taken-over part to be stored", func() (bool, string) {
		src := sourceOf(services(), late+"/late")
		return src == kube.PartName("c1", 0, 2), src
	})
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
