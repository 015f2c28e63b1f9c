package server

import (
	"context"
	"sync"

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
	mu    sync.Mutex
	byID  map[int64]context.CancelFunc
	recvs sync.WaitGroup // receives left behind by ended streams; they return as the stream closes
}

type streamKey struct{}

// endable is a server stream that can be ended by cancelling its context.
type endable struct {
	grpc.ServerStream
	ctx   context.Context
	recvs *sync.WaitGroup
}

func (e *endable) Context() context.Context { return e.ctx }

// RecvMsg receives in a goroutine of its own so that ending the stream
// makes it return at once; the receive left behind returns when gRPC closes
// the stream, right after the handler returns.
func (e *endable) RecvMsg(m any) error {
	if e.ctx.Err() != nil {
		return errMoved
	}
	done := make(chan error, 1)
	e.recvs.Add(1)
	go func() {
		defer e.recvs.Done()
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
	err := handler(srv, &endable{ServerStream: ss, ctx: ctx, recvs: &s.recvs})
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
