package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

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
