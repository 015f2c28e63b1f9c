package e2e

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestProblemsFollowTheLeader: two replicas of the YAML source; only the
// leader lists the broken file's problem (/debug/problems, what shardctl
// analyze prints). When its leadership lapses, it forgets the problem and
// the replica that takes over lists it.
func TestProblemsFollowTheLeader(t *testing.T) {
	_, cli := testutil.Etcd(t)
	dir := t.TempDir()
	writeMesh(t, dir, "broken.yaml", `apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata: {name: broken, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - destination: {}
`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(id string) (*ingest.Report, chan error) {
		m, err := ingest.NewReport(nil)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			done <- app.Source{Etcd: cli, MeshDir: dir, Log: testutil.Log(t).With("replica", id), Report: m,
				Election: app.Election{ID: id, TTL: 2 * time.Second}}.Run(ctx)
		}()
		return m, done
	}
	served := func(m *ingest.Report) []app.Problem {
		rec := httptest.NewRecorder()
		app.ProblemsHandler(m).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/problems", nil))
		var got []app.Problem
		if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
			t.Fatalf("/debug/problems: %v: %s", err, rec.Body)
		}
		return got
	}
	a, doneA := start("a")
	testutil.Eventually(t, 20*time.Second, "the leader lists the problem", func() (bool, string) {
		got := served(a)
		return len(got) == 1 && got[0].Source == "yaml" && strings.HasPrefix(got[0].Location, "broken.yaml") &&
			got[0].Field == "spec.http[0].route[0].destination.host", "nothing listed"
	})
	b, doneB := start("b")
	if got := served(b); len(got) != 0 {
		t.Errorf("the follower lists %v", got)
	}

	// The leader's lease lapses (as when it is cut off from etcd).
	resp, err := cli.Get(ctx, store.ElectionPrefix+"source/yaml", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "a" {
		t.Fatalf("the leader's key: %v %v", resp, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "the problem moves to the new leader", func() (bool, string) {
		ga, gb := served(a), served(b)
		return len(ga) == 0 && len(gb) == 1, "a lists " + jsonOf(ga) + ", b lists " + jsonOf(gb)
	})
	cancel()
	for _, done := range []chan error{doneA, doneB} {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
