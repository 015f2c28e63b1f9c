package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errMoved ends a stream whose proxy belongs to another class now.
var errMoved = status.Error(codes.Unavailable, "shardpilot: the proxy's class changed; reconnect to be served its new configuration")

// streams lets the server end a proxy's stream from outside its handler,
// which go-control-plane's server does not offer: each stream's receives
// are made to fail once it is ended, and its handler then returns. This is
// how a proxy whose class changed (a Sidecar or Gateway now applies to it)
// is made to reconnect: it says which versions it holds, and is sent only
// what differs in its new class.
type streams struct {
	mu     sync.Mutex
	byID   map[int64]context.CancelFunc
	recvs  receives
	pushes pushLimit
}

// receives counts the receives in flight, so that Run returns only after
// the last has: some are left behind by ended streams and return as gRPC
// closes the stream. (go-control-plane's receiving goroutine outlives the
// handler, so a receive can start while Run waits: a WaitGroup would not do.)
type receives struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   *sync.Cond
}

// start counts a receive; it fails once the server has stopped.
func (r *receives) start() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.n++
	return true
}

func (r *receives) done() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n--
	if r.n == 0 && r.idle != nil {
		r.idle.Broadcast()
	}
}

// wait refuses new receives and waits for those in flight.
func (r *receives) wait() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	if r.idle == nil {
		r.idle = sync.NewCond(&r.mu)
	}
	for r.n > 0 {
		r.idle.Wait()
	}
}

type streamKey struct{}

// endable is a server stream that can be ended by cancelling its context.
// Its sends wait for a push slot when the server limits concurrent pushes.
type endable struct {
	grpc.ServerStream
	ctx    context.Context
	cancel context.CancelFunc
	recvs  *receives
	pushes *pushLimit
}

// pushLimit bounds how many responses are being written at once, and for
// how long one may hold its slot: a proxy that does not read its stream
// gives up the slot when the timeout passes (its stream is then ended), so
// it never holds up the others.
type pushLimit struct {
	slots   chan struct{} // nil: unlimited
	timeout time.Duration // 0: none
	m       *metrics
	log     *slog.Logger
}

// SendMsg writes a response once a push slot is free.
func (e *endable) SendMsg(m any) error {
	l := e.pushes
	queued := time.Now()
	if l.slots != nil {
		select {
		case l.slots <- struct{}{}:
		case <-e.ctx.Done():
			return errMoved
		}
	}
	start := time.Now()
	l.m.queue.Observe(start.Sub(queued).Seconds())
	var once sync.Once
	release := func() {
		once.Do(func() {
			if l.slots != nil {
				<-l.slots
			}
		})
	}
	var timer *time.Timer
	if l.timeout > 0 {
		timer = time.AfterFunc(l.timeout, func() {
			release()
			e.cancel()
			l.m.timeouts.Inc()
			l.log.Warn("a response's write outlasted the send timeout; ending the stream", "timeout", l.timeout)
		})
	}
	err := e.ServerStream.SendMsg(m)
	if timer != nil {
		timer.Stop()
	}
	release()
	l.m.send.Observe(time.Since(start).Seconds())
	return err
}

func (e *endable) Context() context.Context { return e.ctx }

// RecvMsg receives in a goroutine of its own so that ending the stream
// makes it return at once; the receive left behind returns when gRPC closes
// the stream, right after the handler returns.
func (e *endable) RecvMsg(m any) error {
	if e.ctx.Err() != nil || !e.recvs.start() {
		return errMoved
	}
	done := make(chan error, 1)
	go func() {
		defer e.recvs.done()
		done <- e.ServerStream.RecvMsg(m)
	}()
	select {
	case err := <-done:
		return err
	case <-e.ctx.Done():
		return errMoved
	}
}

// intercept makes every stream endable.
func (s *streams) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	ctx = context.WithValue(ctx, streamKey{}, cancel)
	err := handler(srv, &endable{ServerStream: ss, ctx: ctx, cancel: cancel, recvs: &s.recvs, pushes: &s.pushes})
	if err == nil && ctx.Err() != nil && ss.Context().Err() == nil {
		return errMoved
	}
	return err
}

// opened learns the go-control-plane id of a stream from its context.
func (s *streams) opened(ctx context.Context, id int64) {
	end, ok := ctx.Value(streamKey{}).(context.CancelFunc)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[int64]context.CancelFunc{}
	}
	s.byID[id] = end
}

func (s *streams) closed(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, id)
}

// end ends a stream and reports whether it was open.
func (s *streams) end(id int64) bool {
	s.mu.Lock()
	end, ok := s.byID[id]
	s.mu.Unlock()
	if ok {
		end()
	}
	return ok
}
