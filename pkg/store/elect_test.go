package store_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// TestFailover: the leader crashes (its client goes away without
// resigning); the follower leads within the TTL; the crashed leader's
// fenced writes are refused.
func TestFailover(t *testing.T) {
	e, _ := testutil.Etcd(t)
	cliA, cliB := client(t, e.Endpoint), client(t, e.Endpoint)
	defer cliB.Close()
	const ttl = 2 * time.Second
	var leader atomic.Value // "a" or "b"
	fenced := make(chan *store.Store, 2)
	run := func(ctx context.Context, cli *clientv3.Client, id string) chan error {
		done := make(chan error, 1)
		el := &store.Elector{Client: cli, Name: "test", ID: id, TTL: ttl, Log: testutil.Log(t)}
		go func() {
			done <- el.Run(ctx, func(ctx context.Context, s *store.Store) error {
				leader.Store(id)
				fenced <- s
				<-ctx.Done()
				return nil
			})
		}()
		return done
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	doneA := run(ctxA, cliA, "a")
	aStore := <-fenced
	ctxB, cancelB := context.WithCancel(context.Background())
	doneB := run(ctxB, cliB, "b")

	k := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}
	if _, _, err := aStore.Put(context.Background(), k, service(time.Now(), 80)); err != nil {
		t.Fatalf("leader's fenced put: %v", err)
	}
	if leader.Load() != "a" {
		t.Fatalf("leader %v, want a", leader.Load())
	}

	// Crash a: its keepalives stop, so its lease lapses after the TTL.
	crashed := time.Now()
	cliA.Close()
	bStore := <-fenced
	took := time.Since(crashed)
	t.Logf("b took over %s after a crashed (TTL %s)", took.Round(10*time.Millisecond), ttl)
	if took > ttl+3*time.Second {
		t.Errorf("takeover took %s, want within the TTL %s (plus a campaign)", took, ttl)
	}
	cancelA()
	<-doneA

	// a's client is gone; a fenced store over a live client shows the fence.
	if _, _, err := bStore.Put(context.Background(), k, service(time.Now(), 81)); err != nil {
		t.Fatalf("new leader's put: %v", err)
	}
	cancelB()
	<-doneB
	// b resigned: its fenced store may no longer write.
	if _, _, err := bStore.Put(context.Background(), k, service(time.Now(), 82)); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a former leader's put: %v, want ErrNotLeader", err)
	}
}
