package ingest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

func TestLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var syncs []time.Duration
		var fulls []bool
		start := time.Now()
		fail := true
		l := NewLoop(Loop{
			Quiet: 100 * time.Millisecond, MaxDelay: time.Second, Resync: time.Minute, RetryDelay: time.Second,
			Sync: func(_ context.Context, full bool) error {
				syncs = append(syncs, time.Since(start))
				fulls = append(fulls, full)
				if fail {
					fail = false
					return errors.New("store down")
				}
				return nil
			},
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- l.Run(ctx) }()
		time.Sleep(2 * time.Second) // first sync fails at 0, the retry succeeds at 1s
		for range 5 {               // a burst of changes: one sync after it settles
			l.Changed()
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(time.Minute) // a resync
		cancel()
		<-done
		want := []time.Duration{0, time.Second, 2*time.Second + 300*time.Millisecond, time.Minute}
		if len(syncs) != len(want) {
			t.Fatalf("syncs at %v, want %v", syncs, want)
		}
		// The start, its retry and the resync read everything; the change
		// only what changed.
		if wantFull := []bool{true, true, false, true}; !slices.Equal(fulls, wantFull) {
			t.Errorf("full syncs %v, want %v", fulls, wantFull)
		}
		for i := range want {
			if syncs[i] != want[i] {
				t.Errorf("sync %d at %s, want %s", i, syncs[i], want[i])
			}
		}
	})
}

// TestLoopSyncsASourceThatNeverStops: changes closer together than the
// quiet period still reach a sync once the maximum delay has passed.
func TestLoopSyncsASourceThatNeverStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var syncs []time.Duration
		start := time.Now()
		l := NewLoop(Loop{
			Quiet: 100 * time.Millisecond, MaxDelay: time.Second, Resync: time.Hour,
			Sync: func(context.Context, bool) error {
				syncs = append(syncs, time.Since(start))
				return nil
			},
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- l.Run(ctx) }()
		time.Sleep(time.Millisecond)
		for range 36 { // a change every 70ms for 2.5s
			l.Changed()
			time.Sleep(70 * time.Millisecond)
		}
		time.Sleep(time.Second)
		cancel()
		<-done
		// The initial sync, one at each maximum delay, one after the quiet.
		want := []time.Duration{0, 1001 * time.Millisecond, 2051 * time.Millisecond, 2551 * time.Millisecond}
		if len(syncs) != len(want) {
			t.Fatalf("syncs at %v, want %v", syncs, want)
		}
		for i := range want {
			if syncs[i] != want[i] {
				t.Errorf("sync %d at %s, want %s", i, syncs[i], want[i])
			}
		}
	})
}

// TestLoopWithoutQuietSyncsAtOnce: with no quiet period a change is synced
// at once, changes during a sync are synced together after it, and a
// failed sync still waits for its retry.
func TestLoopWithoutQuietSyncsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var syncs []time.Duration
		start := time.Now()
		var l *Loop
		l = NewLoop(Loop{
			Resync: time.Hour, RetryDelay: time.Second,
			Sync: func(_ context.Context, full bool) error {
				syncs = append(syncs, time.Since(start))
				switch len(syncs) {
				case 2: // changes arrive while it syncs
					time.Sleep(10 * time.Millisecond)
					l.Changed()
					l.Changed()
				case 3:
					return errors.New("store down")
				}
				return nil
			},
		})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- l.Run(ctx) }()
		time.Sleep(50 * time.Millisecond)
		l.Changed()
		synctest.Wait()
		l.Changed() // during the retry's wait: no sync before it
		time.Sleep(2 * time.Second)
		cancel()
		<-done
		want := []time.Duration{0, 50 * time.Millisecond, 60 * time.Millisecond, 1060 * time.Millisecond}
		if !slices.Equal(syncs, want) {
			t.Fatalf("syncs at %v, want %v", syncs, want)
		}
	})
}

// pendingSink is a Sink whose objects wait until its third retry.
type pendingSink struct {
	Writer
	retries []time.Duration
	start   time.Time
}

func (p *pendingSink) Pending() bool { return len(p.retries) < 3 }

func (p *pendingSink) WentBack(context.Context) (bool, error) { return false, nil }

func (p *pendingSink) RetryPending(context.Context) (Result, error) {
	p.retries = append(p.retries, time.Since(p.start))
	return Result{}, nil
}

// TestLoopRetriesPendingObjects: while a sync left objects waiting for
// other sources, the Loop retries them every PendingEvery, and stops once
// none wait.
func TestLoopRetriesPendingObjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &pendingSink{start: time.Now()}
		l := NewLoop(Loop{Writer: sink, PendingEvery: 5 * time.Second, Resync: time.Hour,
			Sync: func(context.Context, bool) error { return nil }})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- l.Run(ctx) }()
		time.Sleep(time.Minute)
		cancel()
		<-done
		if want := []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second}; !slices.Equal(sink.retries, want) {
			t.Errorf("retries at %v, want %v", sink.retries, want)
		}
	})
}
