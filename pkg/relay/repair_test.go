package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	shtest "github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// waitForKey waits until the stream holds an event of key, and returns the
// stream's content up to it.
func waitForKey(t *testing.T, b *bus.Bus, key string) []*meshv1.ChangeEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []*meshv1.ChangeEvent
	found := errors.New("found")
	err := b.Consume(ctx, 1, func(_ uint64, ev *meshv1.ChangeEvent) error {
		got = append(got, ev)
		if ev.GetKey() == key {
			return found
		}
		return nil
	})
	if !errors.Is(err, found) {
		t.Fatalf("no event of %s in the stream (%d events): %v", key, len(got), err)
	}
	return got
}

// waitFollowing waits until the relay has published its first event (the
// RESYNC of an empty stream): the changes committed before it are in the
// RESYNC's reload, not published one by one.
func waitFollowing(t *testing.T, b *bus.Bus) {
	t.Helper()
	shtest.Eventually(t, 30*time.Second, "the relay's first event", func() (bool, string) {
		seq, err := b.LastSeq(context.Background())
		return err == nil && seq > 0, fmt.Sprint(seq, err)
	})
}

// TestValuesTheBusCannotCarryFlow: a value over NATS's payload limit (under
// etcd's) and a key whose namespace holds a space, written into etcd by
// anything, do not stop the stream: the first is carried by reference (the
// event names the key and revision), the second on the subject every
// consumer follows; the change after them is published.
func TestValuesTheBusCannotCarryFlow(t *testing.T) {
	cli, s, b := storeAndBus(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runRelay(t, ctx, s, b)
	waitFollowing(t, b)

	big := bytes.Repeat([]byte("x"), 1200<<10)
	puts := []struct{ key, value string }{
		{"/mesh/v1/services/ns/big", string(big)},
		{"/mesh/v1/services/my ns/odd", "odd"},
		{"/mesh/v1/services/ns/after", "after"},
	}
	for _, p := range puts {
		if _, err := cli.Put(ctx, p.key, p.value); err != nil {
			t.Fatal(err)
		}
	}
	got := waitForKey(t, b, "/mesh/v1/services/ns/after")
	byKey := map[string]*meshv1.ChangeEvent{}
	for _, ev := range got {
		byKey[ev.GetKey()] = ev
	}
	if ev := byKey["/mesh/v1/services/ns/big"]; ev == nil || !ev.ByReference || len(ev.Value) != 0 {
		t.Errorf("the oversized value's event: %v, want it carried by reference", ev)
	} else if reason, err := s.Confirm(ctx, ev); err != nil || reason != "" {
		t.Errorf("the store does not confirm the event by reference: %q %v", reason, err)
	}
	if ev := byKey["/mesh/v1/services/my ns/odd"]; ev == nil || string(ev.Value) != "odd" || bus.Subject(ev) != bus.SubjectPrefix+"._unknown" {
		t.Errorf("the odd key's event: %v, want it on %s._unknown", ev, bus.SubjectPrefix)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRestoredStoreStartsANewHistory: a stream holding events of revisions
// the store has not reached (etcd restored from an older snapshot) is not
// resumed: the relay publishes a RESYNC marked restored, in a new epoch,
// and the changes the restored store commits next, at revisions the
// stream's de-duplication window still holds, are published, not dropped.
func TestRestoredStoreStartsANewHistory(t *testing.T) {
	_, old := shtest.Etcd(t)
	_, nc := shtest.NATS(t)
	b, err := bus.New(nc, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := runRelay(t, ctx, store.New(old), b)
	waitFollowing(t, b)
	commit(t, old, "before", 12)
	waitForKey(t, b, "/mesh/v1/services/ns/before-x")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	before := len(streamContent(t, b))

	// The restored store: fewer revisions than the stream has seen.
	_, restored := shtest.Etcd(t)
	reg := prometheus.NewRegistry()
	r, err := relay.New(relay.Config{Watcher: store.New(restored), Publisher: b, Log: shtest.Log(t), RetryDelay: 10 * time.Millisecond, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	restarted := make(chan error, 1)
	go func() { restarted <- r.Run(ctx) }()
	shtest.Eventually(t, 10*time.Second, "the repair", func() (bool, string) { return repairs(t, reg) == 1, "" })
	// Revisions the old history used, its ids still in the window.
	commit(t, restored, "after", 3)
	waitForKey(t, b, "/mesh/v1/services/ns/after-x")
	shtest.Eventually(t, 10*time.Second, "the restored store's last change in the stream", func() (bool, string) {
		last, _, err := b.Last(context.Background())
		return err == nil && last.GetType() == meshv1.ChangeEvent_TYPE_DELETE, fmt.Sprint(last, err)
	})
	got := streamContent(t, b)[before:]
	if len(got) == 0 || got[0].Type != meshv1.ChangeEvent_TYPE_RESYNC || !got[0].Restored || got[0].Epoch == 0 {
		t.Fatalf("the stream after the restore begins with %v, want a RESYNC marked restored in a new epoch", got[0])
	}
	var keys []string
	for _, ev := range got[1:] {
		if ev.Epoch != got[0].Epoch {
			t.Errorf("event %s of epoch %d, want the new one, %d", id(ev), ev.Epoch, got[0].Epoch)
		}
		keys = append(keys, id(ev))
	}
	var want []string
	for _, ev := range etcdHistory(t, restored) {
		want = append(want, id(ev))
	}
	if !slices.Equal(keys, want) {
		t.Errorf("published after the restore: %v; want the restored store's changes after the RESYNC, %v", keys, want)
	}
	if n := repairs(t, reg); n != 1 {
		t.Errorf("%v repairs counted, want 1", n)
	}
	cancel()
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
}

// refusing refuses every publish of one key, as a bus answers a write it
// will never take.
type refusing struct {
	*bus.Bus
	key string
	mu  sync.Mutex
	n   int
}

func (r *refusing) PublishAfter(ev, after *meshv1.ChangeEvent) (func(context.Context) (bool, error), error) {
	if ev.Key == r.key {
		r.mu.Lock()
		r.n++
		r.mu.Unlock()
		return nil, fmt.Errorf("bus: publish revision %d: nats: refused (%w)", ev.Revision, model.ErrNotStored)
	}
	return r.Bus.PublishAfter(ev, after)
}

// TestRelayRepairsAStreamThatRefuses: a write the bus keeps refusing is
// retried until RepairAfter, then the relay starts a new history (a RESYNC
// at the store's revision, which every pusher reloads at) and the changes
// after it flow. While it is stuck it stays unhealthy: no pass that fails
// at its first publish makes it healthy again.
func TestRelayRepairsAStreamThatRefuses(t *testing.T) {
	cli, s, b := storeAndBus(t)
	p := &refusing{Bus: b, key: "/mesh/v1/services/ns/wedge"}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, reg, done := checkedRelay(t, ctx, relay.Config{Watcher: s, Publisher: p, RepairAfter: time.Second})
	waitFollowing(t, b)
	commit(t, cli, "a", 2)
	waitForKey(t, b, "/mesh/v1/services/ns/a-x")
	if _, err := cli.Put(ctx, p.key, "w"); err != nil {
		t.Fatal(err)
	}
	shtest.Eventually(t, 10*time.Second, "the relay to fail", func() (bool, string) { return !r.Healthy(), "" })
	for range 50 { // half the time to repair: never healthy meanwhile
		if r.Healthy() && r.Stuck() == 0 {
			t.Fatal("the relay says it is healthy while every pass fails")
		}
		time.Sleep(10 * time.Millisecond)
	}
	shtest.Eventually(t, 10*time.Second, "the repair", func() (bool, string) {
		return repairs(t, reg) == 1, ""
	})
	// What the RESYNC did not cover flows.
	if _, err := cli.Put(ctx, "/mesh/v1/services/ns/later", "l"); err != nil {
		t.Fatal(err)
	}
	got := waitForKey(t, b, "/mesh/v1/services/ns/later")
	var resync *meshv1.ChangeEvent
	for _, ev := range got {
		if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC && ev.Epoch != 0 {
			resync = ev
		}
	}
	if resync == nil {
		t.Fatalf("no RESYNC of a new epoch in %d events", len(got))
	}
	if n := repairs(t, reg); n != 1 {
		t.Errorf("%v repairs counted, want 1", n)
	}
	shtest.Eventually(t, 10*time.Second, "the relay healthy again", func() (bool, string) { return r.Healthy(), "" })
	p.mu.Lock()
	if p.n < 2 {
		t.Errorf("the refused write was tried %d times, want retries before the repair", p.n)
	}
	p.mu.Unlock()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// repairs returns the relay's repairs, all reasons together.
func repairs(t *testing.T, g prometheus.Gatherer) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() == "shardpilot_relay_repairs_total" {
			for _, m := range mf.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// switchedWatcher is a store that is swapped for another under a running
// relay, as etcd restored from a snapshot is the same endpoint: the
// relay's watch of the old one goes on, bringing nothing.
type switchedWatcher struct {
	mu  sync.Mutex
	cur *store.Store
}

func (w *switchedWatcher) get() *store.Store {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.cur
}

func (w *switchedWatcher) Revision(ctx context.Context) (int64, error) { return w.get().Revision(ctx) }
func (w *switchedWatcher) Watch(ctx context.Context, from int64, fn func([]*meshv1.ChangeEvent) error) error {
	return w.get().Watch(ctx, from, fn)
}
func (w *switchedWatcher) Confirm(ctx context.Context, ev *meshv1.ChangeEvent) (string, error) {
	return w.get().Confirm(ctx, ev)
}

// TestStoreRestoredUnderTheRelay: etcd restored while the relay follows it
// (its watch reconnects past revisions the restored store reuses, and
// would never bring their changes) is noticed within CheckEvery: the last
// event published is no longer the store's, and the relay starts a new
// history whose changes are published.
func TestStoreRestoredUnderTheRelay(t *testing.T) {
	_, old := shtest.Etcd(t)
	_, restored := shtest.Etcd(t)
	_, nc := shtest.NATS(t)
	b, err := bus.New(nc, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w := &switchedWatcher{cur: store.New(old)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, reg, done := checkedRelay(t, ctx, relay.Config{Watcher: w, Publisher: b})
	waitFollowing(t, b)
	commit(t, old, "before", 12)
	waitForKey(t, b, "/mesh/v1/services/ns/before-x")

	w.mu.Lock()
	w.cur = store.New(restored)
	w.mu.Unlock()
	shtest.Eventually(t, 10*time.Second, "the repair", func() (bool, string) { return repairs(t, reg) == 1, "" })
	commit(t, restored, "after", 3)
	got := waitForKey(t, b, "/mesh/v1/services/ns/after-x")
	var resync *meshv1.ChangeEvent
	for _, ev := range got {
		if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC && ev.Restored {
			resync = ev
		}
	}
	if resync == nil {
		t.Errorf("no RESYNC marked restored before the restored store's changes")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// checkedRelay runs a relay of cfg, checking every 100 ms, with a registry
// of its own for its metrics, until ctx is done.
func checkedRelay(t *testing.T, ctx context.Context, cfg relay.Config) (*relay.Relay, *prometheus.Registry, <-chan error) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Log, cfg.RetryDelay, cfg.CheckEvery, cfg.Registerer = shtest.Log(t), 10*time.Millisecond, 100*time.Millisecond, reg
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return r, reg, done
}
