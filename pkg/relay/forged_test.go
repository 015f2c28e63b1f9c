package relay_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	tu "github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// TestRelayResumesOnlyAfterWhatTheStoreCommitted: a last event in the
// stream that the store did not commit (far ahead, other content, or not
// signed by a signing relay) is not resumed after: the relay counts it,
// publishes a RESYNC at the store's revision, and every later change of the
// store reaches the stream.
func TestRelayResumesOnlyAfterWhatTheStoreCommitted(t *testing.T) {
	_, key, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		sign   ed25519.PrivateKey
		forged func(rev int64) *meshv1.ChangeEvent
	}{
		"a revision far ahead of the store's": {forged: func(int64) *meshv1.ChangeEvent {
			return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/services/ns/a0", Value: []byte("forged"), Revision: 1 << 40, Count: 1}
		}},
		"a revision the store has, with other content": {forged: func(rev int64) *meshv1.ChangeEvent {
			return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/services/ns/a1", Value: []byte("forged"), Revision: rev, Count: 1}
		}},
		"a delete the store never made": {forged: func(rev int64) *meshv1.ChangeEvent {
			return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/ns/a2", Revision: rev, Count: 1}
		}},
		"a true event without the relay's signature": {sign: key, forged: func(rev int64) *meshv1.ChangeEvent { return nil }},
	} {
		t.Run(name, func(t *testing.T) {
			cli, st, _ := storeAndBus(t)
			_, nc := tu.NATS(t)
			signed, err := bus.New(nc, bus.Config{Sign: tc.sign})
			if err != nil {
				t.Fatal(err)
			}
			unsigned, err := bus.New(nc, bus.Config{})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			reg := prometheus.NewRegistry()
			start := func(reg prometheus.Registerer) (stop func()) {
				r, err := relay.New(relay.Config{Watcher: st, Publisher: signed, Log: tu.Log(t), RetryDelay: 10 * time.Millisecond, Registerer: reg})
				if err != nil {
					t.Fatal(err)
				}
				rctx, rcancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- r.Run(rctx) }()
				return func() { rcancel(); <-done }
			}
			lastKey := func(want string) {
				t.Helper()
				tu.Eventually(t, 10*time.Second, "the stream ends with "+want, func() (bool, string) {
					last, _, err := signed.Last(context.Background())
					if err != nil || last == nil {
						return false, fmt.Sprint(err)
					}
					return last.Key == want, last.String()
				})
			}
			stop := start(nil)
			tu.Eventually(t, 10*time.Second, "the relay's first resync", func() (bool, string) {
				last, _, err := signed.Last(context.Background())
				return err == nil && last != nil, fmt.Sprint(err)
			})
			commit(t, cli, "a", 4)
			lastKey("/mesh/v1/services/ns/a0") // the commit's last change deletes it
			stop()

			rev, err := st.Revision(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			forged := tc.forged(rev)
			if forged == nil {
				// The store's own last change, published again without the
				// signature (another index, so as not to be deduplicated).
				forged = &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: "/mesh/v1/services/ns/a0", Revision: rev, Index: 5, Count: 6}
			}
			if _, err := unsigned.Publish(context.Background(), forged); err != nil {
				t.Fatal(err)
			}
			stop = start(reg)
			defer stop()
			tu.Eventually(t, 10*time.Second, "a resync after the foreign event", func() (bool, string) {
				last, _, err := signed.Last(context.Background())
				if err != nil || last == nil {
					return false, fmt.Sprint(err)
				}
				return last.Type == meshv1.ChangeEvent_TYPE_RESYNC && last.Revision == rev, last.String()
			})
			if got := testutil.ToFloat64(counter(t, reg, "shardpilot_relay_unconfirmed_events_total")); got != 1 {
				t.Errorf("unconfirmed events counted %v, want 1", got)
			}
			if _, err := cli.Put(context.Background(), "/mesh/v1/services/ns/after", "1"); err != nil {
				t.Fatal(err)
			}
			lastKey("/mesh/v1/services/ns/after")
			if reason, err := store.New(cli).Confirm(context.Background(), forged); err == nil && reason == "" && tc.sign == nil {
				t.Errorf("the store confirmed the forged %v", forged)
			}
		})
	}
}

// counter finds a registered metric by name.
func counter(t *testing.T, g prometheus.Gatherer, name string) prometheus.Collector {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: name}, func() float64 { return mf.GetMetric()[0].GetCounter().GetValue() })
		}
	}
	t.Fatalf("no metric %s among %d", name, len(mfs))
	return nil
}
