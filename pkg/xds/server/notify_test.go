package server

import (
	"runtime"
	"sync"
	"testing"
)

// TestNotifyRacingTheSender: a change notified while a sender takes the
// watch's last one leaves no due unit behind once both are done and the
// watch is answered. A unit counted after the sender cleared the mark was
// held for the stream's life, and every later generation waited the
// maximum hold for it.
func TestNotifyRacingTheSender(t *testing.T) {
	f := newFleet(t, 1, 1, false)
	w := f.streams[0].watches[0]
	if n := w.owed.Held(); n != 0 {
		t.Fatalf("%d units held before the race", n)
	}
	procs := runtime.GOMAXPROCS(0)
	for i := range 50000 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() { <-start; w.Notify() })
		wg.Go(func() {
			<-start
			for range i % max(procs, 4) {
				runtime.Gosched()
			}
			w.answered()
		})
		close(start)
		wg.Wait()
		w.answered()
		if n := w.owed.Held(); n != 0 {
			t.Fatalf("round %d: %d units held by a watch neither due nor in flight", i, n)
		}
	}
	if b := f.c.Backlog(); b != 0 {
		t.Errorf("backlog %d after the races", b)
	}
}
