package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// crashing wraps the bus and kills the relay (cancels its context) at a
// chosen publish: before it, so the change is committed in etcd but not on
// the bus, or right after it, before the relay can do anything else.
type crashing struct {
	*bus.Bus
	cancel context.CancelFunc
	at     int  // the publish to crash at, counting from 1
	before bool // crash before publishing rather than after
	mu     sync.Mutex
	n      int
}

func (c *crashing) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return c.n
}

func (c *crashing) Publish(ctx context.Context, ev *meshv1.ChangeEvent) (bool, error) {
	n := c.count()
	if n == c.at && c.before {
		c.cancel()
		return false, context.Canceled
	}
	dup, err := c.Bus.Publish(ctx, ev)
	if n == c.at {
		c.cancel()
	}
	return dup, err
}

func (c *crashing) PublishAfter(ev, after *meshv1.ChangeEvent) (func(context.Context) (bool, error), error) {
	n := c.count()
	if n == c.at && c.before {
		c.cancel()
		return nil, context.Canceled
	}
	ack, err := c.Bus.PublishAfter(ev, after)
	if n == c.at {
		c.cancel()
	}
	return ack, err
}

// losing wraps the bus and loses one event in flight: it is never sent,
// and its answer, an error, comes only once the event after it has been
// sent and answered (refused, it should be).
type losing struct {
	*bus.Bus
	mu      sync.Mutex
	lose    string // the event to lose, by id; lost once
	lost    bool
	next    chan error // the answer to the event after the lost one
	nextErr error
}

func (l *losing) PublishAfter(ev, after *meshv1.ChangeEvent) (func(context.Context) (bool, error), error) {
	l.mu.Lock()
	lose, follows := id(ev) == l.lose, l.lost && l.nextErr == nil && l.next != nil
	if lose {
		l.lose, l.lost = "", true
	}
	next := l.next
	l.mu.Unlock()
	if lose {
		return func(ctx context.Context) (bool, error) {
			select {
			case err := <-next:
				l.mu.Lock()
				l.nextErr = err
				l.mu.Unlock()
			case <-ctx.Done():
			}
			return false, errors.New("nats: timeout")
		}, nil
	}
	ack, err := l.Bus.PublishAfter(ev, after)
	if err == nil && follows {
		_, aerr := ack(context.Background())
		next <- aerr
		l.mu.Lock()
		l.next = nil
		l.mu.Unlock()
	}
	return ack, err
}

func runRelay(t *testing.T, ctx context.Context, w relay.Watcher, p relay.Publisher) <-chan error {
	t.Helper()
	r, err := relay.New(relay.Config{Watcher: w, Publisher: p, Log: testutil.Log(t), RetryDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return done
}

// commit writes n changes, one of them a transaction of two keys.
func commit(t *testing.T, cli *clientv3.Client, prefix string, n int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		key := fmt.Sprintf("/mesh/v1/services/ns/%s%d", prefix, i%3)
		if _, err := cli.Put(ctx, key, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Txn(ctx).Then(
		clientv3.OpPut("/mesh/v1/services/ns/"+prefix+"-x", ""),
		clientv3.OpDelete("/mesh/v1/services/ns/"+prefix+"0"),
	).Commit(); err != nil {
		t.Fatal(err)
	}
}

// streamContent returns every event in the stream, in order.
func streamContent(t *testing.T, b *bus.Bus) []*meshv1.ChangeEvent {
	t.Helper()
	last, err := b.LastSeq(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []*meshv1.ChangeEvent
	if last == 0 {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := errors.New("done")
	err = b.Consume(ctx, 1, func(seq uint64, ev *meshv1.ChangeEvent) error {
		out = append(out, ev)
		if seq == last {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatal(err)
	}
	return out
}

// etcdHistory returns every change under /mesh/v1/ from the etcd history.
func etcdHistory(t *testing.T, cli *clientv3.Client) []*meshv1.ChangeEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rev, err := store.New(cli).Revision(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*meshv1.ChangeEvent
	stop := errors.New("done")
	err = store.New(cli).Watch(ctx, 0, func(evs []*meshv1.ChangeEvent) error {
		out = append(out, evs...)
		if evs[0].Revision >= rev {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatal(err)
	}
	return out
}

func id(ev *meshv1.ChangeEvent) string {
	return fmt.Sprintf("%s %s@%d.%d", ev.Type, ev.Key, ev.Revision, ev.Index)
}

func TestRelayLosesAndDoublesNothingWhenKilled(t *testing.T) {
	tests := map[string]struct {
		at     int
		before bool
	}{
		"killed after an etcd commit, before its publish": {at: 4, before: true},
		"killed right after a publish":                    {at: 4},
		"killed inside a revision of two events":          {at: 8, before: true},
		"killed after the first event of a revision":      {at: 7},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cli, st, b := storeAndBus(t)
			// The stream starts with a RESYNC (publish 1); then come five
			// single changes (2-6) and a revision of two (7 and 8).
			ctx, cancel := context.WithCancel(context.Background())
			done := runRelay(t, ctx, st, &crashing{Bus: b, cancel: cancel, at: tc.at, before: tc.before})
			testutil.Eventually(t, 10*time.Second, "relay starts the stream", func() (bool, string) {
				seq, err := b.LastSeq(context.Background())
				return seq > 0, fmt.Sprint(seq, err)
			})
			commit(t, cli, "a", 5)
			<-ctx.Done()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			// More changes while no relay runs.
			commit(t, cli, "b", 4)

			ctx2, cancel2 := context.WithCancel(context.Background())
			done2 := runRelay(t, ctx2, st, b)
			history := etcdHistory(t, cli)
			want := history[len(history)-1]
			testutil.Eventually(t, 10*time.Second, "relay catches up", func() (bool, string) {
				last, _, err := b.Last(context.Background())
				if err != nil || last == nil {
					return false, fmt.Sprint(err)
				}
				return last.Revision == want.Revision && last.Index == want.Index, id(last)
			})
			cancel2()
			if err := <-done2; err != nil {
				t.Fatal(err)
			}

			got := streamContent(t, b)
			if got[0].Type != meshv1.ChangeEvent_TYPE_RESYNC {
				t.Errorf("stream starts with %s, want a RESYNC", id(got[0]))
			}
			// After the RESYNC at revision R, the stream holds every change
			// after R exactly once, in order.
			var wantEvents []*meshv1.ChangeEvent
			for _, ev := range history {
				if ev.Revision > got[0].Revision {
					wantEvents = append(wantEvents, ev)
				}
			}
			got = got[1:]
			if len(got) != len(wantEvents) {
				t.Errorf("stream holds %d changes, etcd committed %d", len(got), len(wantEvents))
			}
			for i := range min(len(got), len(wantEvents)) {
				if id(got[i]) != id(wantEvents[i]) {
					t.Errorf("stream event %d is %s, want %s", i, id(got[i]), id(wantEvents[i]))
				}
			}
		})
	}
}

func TestTwoRelaysDoubleNothing(t *testing.T) {
	cli, st, b := storeAndBus(t)
	ctx, cancel := context.WithCancel(context.Background())
	d1 := runRelay(t, ctx, st, b)
	d2 := runRelay(t, ctx, st, b)
	commit(t, cli, "a", 30)
	history := etcdHistory(t, cli)
	testutil.Eventually(t, 10*time.Second, "relays catch up", func() (bool, string) {
		last, _, err := b.Last(context.Background())
		if err != nil || last == nil {
			return false, fmt.Sprint(err)
		}
		return last.Revision == history[len(history)-1].Revision, id(last)
	})
	cancel()
	<-d1
	<-d2
	seen := map[string]bool{}
	for _, ev := range streamContent(t, b) {
		if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC {
			continue
		}
		if seen[id(ev)] {
			t.Errorf("%s is in the stream twice", id(ev))
		}
		seen[id(ev)] = true
	}
}

func TestRelayResyncsAfterCompaction(t *testing.T) {
	cli, st, b := storeAndBus(t)
	// A stream that stopped at revision 2, then etcd moved on and compacted.
	if _, err := cli.Put(context.Background(), "/mesh/v1/services/ns/a", "1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Publish(context.Background(), &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/services/ns/a", Value: []byte("1"), Revision: 2, Count: 1}); err != nil {
		t.Fatal(err)
	}
	commit(t, cli, "a", 5)
	rev, _ := st.Revision(context.Background())
	if _, err := cli.Compact(context.Background(), rev); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := runRelay(t, ctx, st, b)
	testutil.Eventually(t, 10*time.Second, "relay publishes a resync", func() (bool, string) {
		last, _, err := b.Last(context.Background())
		if err != nil || last == nil {
			return false, fmt.Sprint(err)
		}
		return last.Type == meshv1.ChangeEvent_TYPE_RESYNC && last.Revision == rev, id(last)
	})
	// And it follows the store from there.
	if _, err := cli.Put(context.Background(), "/mesh/v1/services/ns/after", "1"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "relay follows after the resync", func() (bool, string) {
		last, _, err := b.Last(context.Background())
		if err != nil || last == nil {
			return false, fmt.Sprint(err)
		}
		return last.Key == "/mesh/v1/services/ns/after", id(last)
	})
	cancel()
	<-done
}

// TestRelayLosesNothingWhenAPublishFailsInFlight: when one event of the
// window is lost, the bus refuses every later one (each is published on
// the condition that the one before is stored), and the relay starts again
// from what the bus holds: the stream is the store's history, in order,
// once.
func TestRelayLosesNothingWhenAPublishFailsInFlight(t *testing.T) {
	cli, st, b := storeAndBus(t)
	// Changes committed before the relay starts arrive in one burst, so
	// that the lost event has others in flight behind it.
	ctx, cancel := context.WithCancel(context.Background())
	done := runRelay(t, ctx, st, b)
	testutil.Eventually(t, 10*time.Second, "relay starts the stream", func() (bool, string) {
		seq, err := b.LastSeq(context.Background())
		return seq > 0, fmt.Sprint(seq, err)
	})
	cancel()
	<-done
	commit(t, cli, "a", 20)
	history := etcdHistory(t, cli)
	lose := history[len(history)-15]

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	l := &losing{Bus: b, lose: id(lose), next: make(chan error, 1)}
	done = runRelay(t, ctx, st, l)
	want := history[len(history)-1]
	testutil.Eventually(t, 10*time.Second, "relay catches up", func() (bool, string) {
		last, _, err := b.Last(context.Background())
		if err != nil || last == nil {
			return false, fmt.Sprint(err)
		}
		return id(last) == id(want), id(last)
	})
	cancel()
	<-done
	l.mu.Lock()
	if l.nextErr == nil || !strings.Contains(l.nextErr.Error(), "wrong last msg ID") {
		t.Errorf("the event after the lost one was answered %v, want it refused for the wrong last message", l.nextErr)
	}
	l.mu.Unlock()
	got := streamContent(t, b)[1:]
	var wantEvents []string
	for _, ev := range history {
		if ev.Revision > streamContent(t, b)[0].Revision {
			wantEvents = append(wantEvents, id(ev))
		}
	}
	var gotEvents []string
	for _, ev := range got {
		gotEvents = append(gotEvents, id(ev))
	}
	if fmt.Sprint(gotEvents) != fmt.Sprint(wantEvents) {
		t.Errorf("stream holds\n%v\nwant\n%v", gotEvents, wantEvents)
	}
}

// storeAndBus starts etcd and NATS and returns etcd's client, the store
// on it and the bus on NATS.
func storeAndBus(t *testing.T) (*clientv3.Client, *store.Store, *bus.Bus) {
	t.Helper()
	_, cli := testutil.Etcd(t)
	_, nc := testutil.NATS(t)
	b, err := bus.New(nc, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ensure(context.Background()); err != nil {
		t.Fatal(err)
	}
	return cli, store.New(cli), b
}
