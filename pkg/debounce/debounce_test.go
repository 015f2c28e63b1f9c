package debounce

import (
	"context"
	"sync"
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
