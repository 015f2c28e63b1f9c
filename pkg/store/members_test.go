package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestMembers: announced members are listed while they run, vanish as
// soon as they stop, come back after their lease is lost, and a value that
// is not a member is an error naming its key.
func TestMembers(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	announce := func(m store.Member) (stop func()) {
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- store.Announce(ctx, cli, m, 2*time.Second, testutil.Log(t)) }()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("announce %s: %v", m.Name, err)
			}
		}
	}
	names := func(role string) string {
		ms, err := store.Members(ctx, cli, role)
		if err != nil {
			return err.Error()
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.Role+"/"+m.Name+"@"+m.Admin)
		}
		return strings.Join(out, " ")
	}
	stopB := announce(store.Member{Role: "pusher", Name: "b", Admin: "10.0.0.2:15014", ADS: "10.0.0.2:15010"})
	stopA := announce(store.Member{Role: "pusher", Name: "a", Admin: "10.0.0.1:15014"})
	stopI := announce(store.Member{Role: "ingester", Name: "i", Admin: "10.0.0.3:15015"})
	defer stopI()
	defer stopA()
	testutil.Eventually(t, 10*time.Second, "both pushers listed", func() (bool, string) {
		got := names("pusher")
		return got == "pusher/a@10.0.0.1:15014 pusher/b@10.0.0.2:15014", got
	})
	if got := names(""); got != "ingester/i@10.0.0.3:15015 pusher/a@10.0.0.1:15014 pusher/b@10.0.0.2:15014" {
		t.Errorf("every member: %s", got)
	}

	// A stopped member is gone at once, not after its lease's TTL.
	stopB()
	if got := names("pusher"); got != "pusher/a@10.0.0.1:15014" {
		t.Errorf("after b stopped: %s", got)
	}

	// A lost lease (etcd unreachable past the TTL, here revoked) puts the
	// member back under a new one.
	resp, err := cli.Get(ctx, store.MemberPrefix+"pusher/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get: %v %v", resp, err)
	}
	lost := resp.Kvs[0].Lease
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(lost)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "a announced again under a new lease", func() (bool, string) {
		resp, err := cli.Get(ctx, store.MemberPrefix+"pusher/", clientv3.WithPrefix())
		if err != nil || len(resp.Kvs) != 1 {
			return false, "not listed"
		}
		return resp.Kvs[0].Lease != lost, "still the lost lease"
	})

	if _, err := cli.Put(ctx, store.MemberPrefix+"pusher/zz", "not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Members(ctx, cli, "pusher"); err == nil || !strings.Contains(err.Error(), store.MemberPrefix+"pusher/zz") {
		t.Errorf("a garbage member: %v, want an error naming its key", err)
	}
	if err := store.Announce(ctx, cli, store.Member{Role: "pusher"}, time.Second, nil); err == nil {
		t.Error("a member without a name and an admin address was announced")
	}
}
