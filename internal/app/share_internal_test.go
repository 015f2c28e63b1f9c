package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// TestShareSpreadsElections: a replica that started alone leads every
// source; once a second replica is announced and campaigns, the first
// gives sources up one at a time until each leads its fair share, and no
// source is ever led by both (nor by none for long).
func TestShareSpreadsElections(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	var mu sync.Mutex
	leaders := map[string]map[string]bool{} // source → replicas leading it
	replica := func(id string) {
		share := &Share{Etcd: cli, Role: "ingester", Every: 100 * time.Millisecond}
		e := Election{ID: id, TTL: time.Second, Share: share}
		wg.Go(func() {
			_ = store.Announce(ctx, cli, store.Member{Role: "ingester", Name: id, Admin: id + ":15015"}, 0, slog.New(slog.DiscardHandler))
		})
		for i := range 4 {
			source := fmt.Sprint("source/s", i)
			wg.Go(func() {
				_ = led(ctx, cli, e, source, slog.New(slog.DiscardHandler), nil, func(ctx context.Context) error {
					mu.Lock()
					if leaders[source] == nil {
						leaders[source] = map[string]bool{}
					}
					leaders[source][id] = true
					if len(leaders[source]) > 1 {
						t.Errorf("%s led by %v at once", source, leaders[source])
					}
					mu.Unlock()
					<-ctx.Done()
					mu.Lock()
					delete(leaders[source], id)
					mu.Unlock()
					return ctx.Err()
				})
			})
		}
	}
	count := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for _, ids := range leaders {
			for id := range ids {
				out[id]++
			}
		}
		return out
	}
	replica("a")
	testutil.Eventually(t, 20*time.Second, "the first replica to lead every source", func() (bool, string) {
		return count()["a"] == 4, fmt.Sprint(count())
	})
	replica("b")
	testutil.Eventually(t, 30*time.Second, "the sources to spread two and two", func() (bool, string) {
		c := count()
		return c["a"] == 2 && c["b"] == 2, fmt.Sprint(c)
	})
}

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// TestLeadsReportsEveryElection: each election a replica runs is reported,
// 1 while it leads it and 0 while it waits; an unelected replica leads
// all it runs; an election it no longer runs goes.
func TestLeadsReportsEveryElection(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader, waiting := &Share{Etcd: cli, Role: "ingester"}, &Share{Etcd: cli, Role: "ingester"}
	started := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		_ = led(ctx, cli, Election{ID: "a", TTL: time.Second, Share: leader}, "source/yaml", slog.New(slog.DiscardHandler), nil, func(ctx context.Context) error {
			close(started)
			<-ctx.Done()
			return ctx.Err()
		})
	})
	<-started
	wg.Go(func() {
		_ = led(ctx, cli, Election{ID: "b", TTL: time.Second, Share: waiting}, "source/yaml", slog.New(slog.DiscardHandler), nil, func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
	})
	unelected := &Share{}
	stopped := make(chan struct{})
	wg.Go(func() {
		_ = led(ctx, cli, Election{Share: unelected}, "relay", slog.New(slog.DiscardHandler), nil, func(ctx context.Context) error {
			<-ctx.Done()
			close(stopped)
			return nil
		})
	})
	testutil.Eventually(t, 10*time.Second, "every replica's elections reported", func() (bool, string) {
		a, b, u := leader.Runs(), waiting.Runs(), unelected.Runs()
		return a["source/yaml"] && len(b) == 1 && !b["source/yaml"] && u["relay"], fmt.Sprint(a, b, u)
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(waiting.Collector())
	if n, err := promtestutil.GatherAndCount(reg, "shardpilot_ingester_leads"); err != nil || n != 1 {
		t.Errorf("%d series of the waiting replica, %v: want its one election", n, err)
	}
	cancel()
	<-stopped
	testutil.Eventually(t, 10*time.Second, "the unelected replica's election gone", func() (bool, string) {
		return len(unelected.Runs()) == 0, fmt.Sprint(unelected.Runs())
	})
}
