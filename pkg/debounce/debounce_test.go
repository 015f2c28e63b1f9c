package debounce

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestDebounce(t *testing.T) {
	tests := map[string]struct {
		adds []time.Duration // offsets of Add calls from the start
		want []struct {
			at time.Duration
			n  int
		}
	}{
		"single value waits the quiet period": {
			adds: []time.Duration{0},
			want: []struct {
				at time.Duration
				n  int
			}{{100 * time.Millisecond, 1}},
		},
		"burst merges and settles after the last add": {
			adds: []time.Duration{0, 50 * time.Millisecond, 90 * time.Millisecond},
			want: []struct {
				at time.Duration
				n  int
			}{{190 * time.Millisecond, 3}},
		},
		"a steady stream is cut at the maximum delay": {
			adds: func() []time.Duration {
				var d []time.Duration
				for i := range 30 {
					d = append(d, time.Duration(i)*45*time.Millisecond)
				}
				return d
			}(),
			want: []struct {
				at time.Duration
				n  int
			}{{time.Second, 23}, {1405 * time.Millisecond, 7}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				d, err := New(Config[int]{Quiet: 100 * time.Millisecond, MaxDelay: time.Second,
					Merge: func(a, b int) int { return a + b }})
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				type got struct {
					at time.Duration
					n  int
				}
				var mu sync.Mutex
				var gots []got
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() {
					defer close(done)
					_ = d.Run(ctx, func(n int) {
						mu.Lock()
						gots = append(gots, got{time.Since(start), n})
						mu.Unlock()
					})
				}()
				for _, at := range tc.adds {
					time.Sleep(at - time.Since(start))
					d.Add(1)
				}
				time.Sleep(5 * time.Second)
				cancel()
				<-done
				if len(gots) != len(tc.want) {
					t.Fatalf("got %d hand-offs %v, want %d", len(gots), gots, len(tc.want))
				}
				for i, w := range tc.want {
					if gots[i].at != w.at || gots[i].n != w.n {
						t.Errorf("hand-off %d: got %v after %s, want %d after %s", i, gots[i].n, gots[i].at, w.n, w.at)
					}
				}
			})
		})
	}
}

func TestConfigValidate(t *testing.T) {
	merge := func(a, b int) int { return a }
	for name, c := range map[string]Config[int]{
		"zero quiet":        {MaxDelay: time.Second, Merge: merge},
		"max below quiet":   {Quiet: time.Second, MaxDelay: time.Millisecond, Merge: merge},
		"no merge function": {Quiet: time.Millisecond, MaxDelay: time.Second},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

// TestHoldWaitsForTheConsumer: a settled value is held while Hold says the
// consumer is busy, at most until the maximum hold, and goes at once
// (after the quiet period) when it is not.
func TestHoldWaitsForTheConsumer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var busy atomic.Bool
		d, err := New(Config[int]{Quiet: 10 * time.Millisecond, MaxDelay: time.Second, MaxHold: 3 * time.Second,
			Merge: func(a, b int) int { return a + b }, Hold: busy.Load})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		type got struct {
			at time.Duration
			n  int
		}
		out := make(chan got, 10)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- d.Run(ctx, func(n int) { out <- got{time.Since(start), n} }) }()

		d.Add(1) // idle: goes after the quiet period
		if g := <-out; g != (got{10 * time.Millisecond, 1}) {
			t.Errorf("idle: %+v, want 1 at 10ms", g)
		}
		busy.Store(true) // busy: held, merging what comes, until busy ends
		d.Add(1)
		time.Sleep(200 * time.Millisecond)
		d.Add(1)
		time.Sleep(100 * time.Millisecond)
		busy.Store(false)
		if g := <-out; g.n != 2 || g.at < 310*time.Millisecond || g.at > 330*time.Millisecond {
			t.Errorf("busy until 310ms: %+v, want 2 just after", g)
		}
		busy.Store(true) // busy for good: cut at the maximum hold
		d.Add(1)
		mark := time.Since(start)
		if g := <-out; g.n != 1 || g.at-mark != 3*time.Second {
			t.Errorf("always busy: %+v, want 1 three seconds after %s", g, mark)
		}
		// Changes that never settle, while busy: also held to the maximum hold.
		mark = time.Since(start)
		for range 40 {
			d.Add(1) // at 0, 100ms, ... 2.9s: 30 before the maximum hold
			time.Sleep(100 * time.Millisecond)
		}
		if g := <-out; g.n < 30 || g.n > 31 || g.at-mark != 3*time.Second {
			t.Errorf("never quiet, always busy: %+v, want 30 three seconds after %s", g, mark)
		}
		cancel()
		<-done
	})
}

// TestTake: a part of the pending value goes at once; the rest stays
// pending in its batch and settles as before; taking all leaves nothing.
func TestTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := New(Config[[]string]{Quiet: 100 * time.Millisecond, MaxDelay: time.Second,
			Merge: func(a, b []string) []string { return append(a, b...) }})
		if err != nil {
			t.Fatal(err)
		}
		split := func(want string) func([]string) ([]string, []string, bool, bool) {
			return func(pending []string) (taken, rest []string, took, left bool) {
				for _, v := range pending {
					if v == want {
						taken = append(taken, v)
					} else {
						rest = append(rest, v)
					}
				}
				return taken, rest, len(taken) > 0, len(rest) > 0
			}
		}
		if _, ok := d.Take(split("eds")); ok {
			t.Error("took from nothing pending")
		}
		d.Add([]string{"full"})
		d.Add([]string{"eds"})
		if got, ok := d.Take(split("eds")); !ok || len(got) != 1 {
			t.Errorf("Take = %v, %v; want [eds]", got, ok)
		}
		if _, ok := d.Take(split("eds")); ok {
			t.Error("took the same value twice")
		}
		ctx, cancel := context.WithCancel(t.Context())
		var handed [][]string
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = d.Run(ctx, func(v []string) { handed = append(handed, v) })
		}()
		time.Sleep(time.Second)
		synctest.Wait()
		if len(handed) != 1 || len(handed[0]) != 1 || handed[0][0] != "full" {
			t.Errorf("handed on %v, want [[full]]", handed)
		}
		d.Add([]string{"eds"})
		if got, ok := d.Take(split("eds")); !ok || len(got) != 1 {
			t.Errorf("Take = %v, %v; want [eds]", got, ok)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if len(handed) != 1 {
			t.Errorf("handed on %v after all was taken, want nothing more", handed)
		}
		cancel()
		<-done
	})
}
