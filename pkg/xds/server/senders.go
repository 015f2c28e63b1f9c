package server

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/tap"
)

// A stream's handler goroutine only receives: the responses of every
// stream are written by the server's senders, a fixed pool of goroutines
// (MaxConcurrentPushes of them) taking the streams that have something due
// from one queue, first in first out. A stream is in the queue at most
// once and worked on by at most one sender; woken while a sender works on
// it, it goes back to the end of the queue, so a stream whose
// configuration keeps changing does not hold a sender from the others.
// Idle proxies so cost the server no sending goroutine and no stack.
// Without a limit (MaxConcurrentPushes negative), a dispatcher takes the
// same queue and starts a goroutine per stream for its turn. Either way,
// waking a stream only queues it: Notify, called under a table's lock,
// neither blocks on a write nor starts a goroutine.
//
// A write waits for the proxy to read (HTTP/2 flow control): one that
// outlasts parkAfter is parked, its sender replaced by a new one, so that
// proxies slow to read do not hold the pool from the others; the parked
// sender finishes its stream's turn and retires.

// pushQueue is the streams waiting for a sender. Its lock also guards
// each stream's place with the senders (stream.queued, running, done,
// parked, stopped and queuedAt): a stream's turn is decided where the
// queue is, under one lock.
type pushQueue struct {
	mu      sync.Mutex
	ready   sync.Cond
	items   []*stream
	stopped bool
}

func newPushQueue() *pushQueue {
	q := &pushQueue{}
	q.ready.L = &q.mu
	return q
}

// putLocked queues a stream and wakes a sender.
func (q *pushQueue) putLocked(st *stream) {
	st.queuedAt = time.Now()
	q.items = append(q.items, st)
	q.ready.Signal()
}

// get waits for a stream; nil once the queue is stopped.
func (q *pushQueue) get() *stream {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 && !q.stopped {
		q.ready.Wait()
	}
	if q.stopped {
		return nil
	}
	return q.popLocked()
}

// take returns a queued stream without waiting (nil: none).
func (q *pushQueue) take() *stream {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return nil
	}
	return q.popLocked()
}

func (q *pushQueue) popLocked() *stream {
	st := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	return st
}

func (q *pushQueue) stop() {
	q.mu.Lock()
	q.stopped = true
	q.mu.Unlock()
	q.ready.Broadcast()
}

// senders runs the pool until the queue stops. Unlimited (n < 0), one
// dispatcher takes the queue and starts a goroutine per stream for as long
// as it writes: waking a stream (Watcher.Notify, under a table's lock)
// only queues it, and never starts a goroutine itself.
func (s *Server) senders(n int) {
	if n < 0 {
		s.sending.Go(func() {
			for st := s.pushq.get(); st != nil; st = s.pushq.get() {
				s.unpooled.Go(func() { st.work() })
			}
		})
		return
	}
	for range n {
		s.sending.Go(s.sender)
	}
}

// sender works the queued streams until the queue stops, or until another
// sender took its place while it waited on a write.
func (s *Server) sender() {
	for st := s.pushq.get(); st != nil; st = s.pushq.get() {
		if replaced := st.work(); replaced {
			return
		}
	}
}

// wakeUp asks for the stream's due responses to be written.
func (st *stream) wakeUp() {
	q := st.srv.pushq
	q.mu.Lock()
	defer q.mu.Unlock()
	if st.queued || st.done {
		return
	}
	st.queued = true
	if !st.running { // else its sender queues it again when it is done
		q.putLocked(st)
	}
}

// work writes the stream's due responses, as its sender; it reports
// whether another sender took this one's place meanwhile (see park).
func (st *stream) work() (replaced bool) {
	q := st.srv.pushq
	q.mu.Lock()
	if st.done || !st.queued {
		q.mu.Unlock()
		return false
	}
	st.queued, st.running = false, true
	waited := time.Since(st.queuedAt)
	q.mu.Unlock()
	st.srv.m.queue.Observe(waited.Seconds())

	err := st.push()

	q.mu.Lock()
	st.running = false
	replaced, st.parked = st.parked, false
	if st.done {
		close(st.stopped)
		q.mu.Unlock()
		return replaced
	}
	if st.queued && err == nil {
		q.putLocked(st)
	}
	q.mu.Unlock()
	if err != nil {
		st.end(err)
	}
	return replaced
}

// park marks the stream's write that started at started as parked, if it
// still runs: its sender retires once the stream's turn ends, and the
// caller starts another in its place. It reports whether it did.
func (st *stream) park(started int64) bool {
	q := st.srv.pushq
	q.mu.Lock()
	defer q.mu.Unlock()
	if !st.running || st.parked || st.sending.Load() != started {
		return false
	}
	st.parked = true
	return true
}

// stopSending stops the stream's sending, waiting for a write in progress
// (gRPC forbids writing to a stream whose handler returned): cancelling
// the stream's context makes it return (the stream is reset then, and a
// status the server ended it with is lost; without a write in progress
// the status reaches the proxy).
func (st *stream) stopSending() {
	q := st.srv.pushq
	q.mu.Lock()
	st.done = true
	if !st.running {
		q.mu.Unlock()
		return
	}
	st.stopped = make(chan struct{})
	q.mu.Unlock()
	st.cancel()
	<-st.stopped
}

// cancelKey holds, in a stream's context, the function that cancels it.
type cancelKey struct{}

// tapCancel gives every stream a context the server can cancel: that is
// what ends a stream whose handler is blocked receiving (gRPC's receive
// and its wait for flow control both return when the stream's context is
// done).
func tapCancel(ctx context.Context, _ *tap.Info) (context.Context, error) {
	ctx, cancel := context.WithCancel(ctx)
	return context.WithValue(ctx, cancelKey{}, cancel), nil
}
