package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// errMoved ends a stream whose proxy belongs to another class now.
var errMoved = status.Error(codes.Unavailable, "shardpilot: the proxy's class changed; reconnect to be served its new configuration")

// errNotReady refuses a subscription before there is a config to serve.
var errNotReady = status.Error(codes.Unavailable, "shardpilot: this pusher has not loaded the mesh yet; retry")

// errTimedOut ends a stream whose proxy stopped reading.
var errTimedOut = status.Error(codes.Unavailable, "shardpilot: a response's write outlasted the send timeout")

// pushOrder is the order a stream's types are sent in when several are
// due: secrets before the clusters and listeners whose TLS uses them,
// clusters before the endpoints and routes that use them, listeners
// before the routes they name (the xDS protocol's advice).
var pushOrder = []string{resource.SecretType, resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType}

func rank(typeURL string) int {
	if i := slices.Index(pushOrder, typeURL); i >= 0 {
		return i
	}
	return len(pushOrder)
}

// stream is one xDS stream: aggregated, or of one type. Its handler's
// goroutine receives; the server's senders write its responses (see
// senders.go). Requests change the per-type watches under mu; a table that
// changes sets a watch's dirty flag and queues the stream, and a sender
// computes each due response from the cache and writes it. At most one
// response per type is in flight: changes made meanwhile are sent
// together once it is ACKed or NACKed.
type stream struct {
	srv   *Server
	id    int64
	delta bool
	ss    grpc.ServerStream
	// ctx is the stream's gRPC context, which cancel ends.
	ctx    context.Context
	cancel context.CancelFunc
	since  time.Time
	// startEpoch is the generation current when the stream began.
	startEpoch int64
	// ended says why the server ended the stream (nil: it did not);
	// endedC is closed then.
	ended  atomic.Pointer[error]
	endedC chan struct{}
	// sending is when the write in progress started (unix ns; 0: none).
	sending atomic.Int64
	// behind is set once a response of the stream went unanswered (or
	// unwritten) past Config.AnswerWait, and cleared once the stream has
	// caught up (every response it was sent answered): meanwhile none of
	// its watches holds a due unit, so that a proxy that does not answer,
	// or reads slowly, holds back the next generations for every other
	// for the answer wait at most, not at each of its answers.
	behind atomic.Bool

	// queued, running, done, parked, stopped and queuedAt are the
	// stream's place with the senders, under the push queue's lock:
	// queued while it waits for one (or, while running, to go back to the
	// queue), done once its handler returns; stopped is closed by the
	// sender running then. parked says that the write in progress
	// outlasted parkAfter and another sender took this stream's sender's
	// place.
	queued   bool
	running  bool
	done     bool
	parked   bool
	stopped  chan struct{}
	queuedAt time.Time

	// mu guards what follows against the senders and the status readers.
	// The handler, the only goroutine that changes the node, the classes
	// and the watches, reads them without it.
	mu      sync.Mutex
	closed  bool
	node    *core.Node
	nodeRaw []byte
	class   cache.Class
	// responseLimit is Config.ResponseLimit of the class, asked once.
	responseLimit int
	// secrets is the class of the proxy's identity in Config.Secrets;
	// noSecrets records that it has none (said once).
	secrets   cache.Class
	noSecrets bool
	// locality is the proxy's class in Config.Localities ("" for none).
	locality cache.Class
	watches  []*watch // in push order
	nonce    uint64
	// holders are what the names the stream subscribes to count against
	// (see NameBudget): the stream, its connection, its identity (when it
	// has one) and the server.
	holders []holderKey
}

// watch is what a stream holds of one type.
type watch struct {
	st      *stream
	typeURL string
	short   string
	table   *cache.Table
	// set is what the stream subscribes to; for Delta, named holds the
	// names it subscribed to explicitly and wildcard whether it asked for
	// every resource.
	set      *cache.Set
	named    *cache.Set
	wildcard bool
	// held is what the subscription counts against the stream's holders.
	held []holding
	// legacy is set when a SotW stream's first request named nothing: an
	// empty list stays the wildcard.
	legacy bool
	// reqFP is the fingerprint of the names of the last SotW request.
	reqFP cache.Fingerprint
	// asked, when set, is a request of a type whose names the class's view
	// limits (see Visibility) that the view left part of out: it is
	// subscribed to again when the view changes (see reviewAskedLocked).
	asked *asked
	// version is the table version the stream was last brought to; fresh
	// is set until the stream is answered after subscribing to set (prev
	// is what it subscribed to before); initial are the versions a new
	// Delta stream says it holds.
	version uint64
	fresh   bool
	prev    *cache.Set
	initial map[string]string
	// rest are the names the last Delta response left out past
	// Config.DeltaResponseBytes: the next carries them.
	rest []string
	// holds says the proxy holds something of the type: it said so when
	// it subscribed (a version, initial versions) or was sent a response.
	holds bool
	dirty atomic.Bool
	// dueEpoch is the generation that made the watch due: the proxy
	// needed nothing of those before it.
	dueEpoch atomic.Int64
	// inflight is set while a response waits for its ACK or NACK.
	inflight bool
	nonce    string
	status   TypeStatus
	// epoch is the generation the in-flight response was sent from;
	// credited the newest whose ACK has been reported.
	epoch, credited int64
	// sentAt is when the in-flight response was made (Unix ns).
	sentAt int64
	// owed holds the watch's units of the cache's backlog: one while a
	// change is due, one while a response is in flight; none while its
	// stream is behind.
	owed *cache.Owed
	// pacedUntil is when the next response of the type may go (Unix ns,
	// see Config.ResponseBytesPerSecond); pace wakes the watch then.
	pacedUntil int64
	pace       *time.Timer
}

// paceLeftLocked is how long the watch's next response must still wait for
// its pace: none when responses are not paced (the default, read without
// the clock) or when the proxy asks for names anew.
func (w *watch) paceLeftLocked() time.Duration {
	if w.pacedUntil == 0 || w.fresh || w.initial != nil {
		return 0
	}
	return time.Duration(w.pacedUntil - time.Now().UnixNano())
}

// waitPaceLocked leaves the due watch until its pace ends, when its stream
// is pushed again: it stays due, with what changes meanwhile, but holds no
// due unit, so that the generations do not wait for it.
func (w *watch) waitPaceLocked(d time.Duration) {
	w.owed.Excuse()
	w.st.srv.m.paced.Inc()
	if w.pace != nil {
		w.pace.Reset(d)
		return
	}
	w.pace = time.AfterFunc(d, w.st.wakeUp) // nothing once the stream is done
}

// Notify marks the watch due and wakes its stream's sender. The due unit
// is counted before the watch is marked: a sender may clear the mark (and
// drop a unit) the moment it is set, and a unit counted after that would
// be held for as long as the stream lives, every later generation waiting
// the maximum hold for it (a load test's batches did, a few runs in ten).
func (w *watch) Notify() {
	if w.dirty.Load() {
		// Due already, its unit counted: a sender clearing the mark from
		// here on reads the table after, change included.
		w.st.wakeUp()
		return
	}
	w.owed.Add(&w.st.behind)
	if w.dirty.CompareAndSwap(false, true) {
		w.dueEpoch.Store(w.st.srv.epoch())
	} else {
		w.owed.Drop() // due already, its unit counted
	}
	w.st.wakeUp()
}

// answered clears the watch's due flag.
func (w *watch) answered() {
	if w.dirty.Swap(false) {
		w.owed.Drop()
	}
}

var _ cache.Watcher = (*watch)(nil)

// end ends the stream with err as its status; it reports whether the
// stream was not ended before. Its handler returns err at once, even while
// its read waits for the proxy (see serve): the stream's context is not
// cancelled, which would reset the stream, and the proxy would never learn
// why it ended (a write in progress is, see stopSending).
func (st *stream) end(err error) bool {
	if !st.ended.CompareAndSwap(nil, &err) {
		return false
	}
	if st.endedC != nil {
		close(st.endedC)
	}
	return true
}

// serve runs a stream until the proxy goes, the server ends it, or a
// request is refused. read reads one request, apply applies it.
func (s *Server) serve(ss grpc.ServerStream, delta bool, read, apply func(*stream) error) error {
	ctx := ss.Context()
	cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc)
	if !ok {
		return status.Error(codes.Internal, "shardpilot: a stream not served through Server.Run")
	}
	id := s.nextID.Add(1)
	if delta {
		id = -id
	}
	st := &stream{srv: s, id: id, delta: delta, ss: ss, ctx: ctx, cancel: cancel, since: time.Now(), startEpoch: s.epoch(),
		endedC: make(chan struct{})}
	st.holders = s.holdersOf(st)
	s.cfg.Streams.add(st)
	s.m.streams.Inc()
	defer func() {
		st.end(nil)
		st.stopSending()
		s.m.streams.Dec()
		s.cfg.Streams.remove(st)
		class, secrets, locality := st.close()
		if class != "" {
			s.leave(class)
		}
		if secrets != "" {
			s.secrets.leave(secrets)
		}
		if locality != "" {
			s.localities.leave(locality)
		}
		st.mu.Lock()
		node := st.node
		st.mu.Unlock()
		if node != nil {
			s.cfg.Hooks.OnClosed(node)
		}
	}()
	// Requests are read on a goroutine of their own, one at a time, and
	// applied here: a stream the server ends returns its status at once,
	// while the read may wait for the proxy for good. The reader goes
	// when gRPC ends the stream after this returns.
	reads, more, done := make(chan error), make(chan struct{}), make(chan struct{})
	defer close(done)
	go func() {
		for {
			err := read(st)
			select {
			case reads <- err:
			case <-done:
				return
			}
			if err != nil {
				return
			}
			select {
			case <-more:
			case <-done:
				return
			}
		}
	}()
	for {
		var err error
		select {
		case err = <-reads:
			if err == nil {
				err = apply(st)
			}
		case <-st.endedC:
		}
		if e := st.ended.Load(); e != nil {
			return *e
		}
		if err == nil {
			more <- struct{}{}
			continue
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
}

// close releases the stream's subscriptions and returns its class ("" if
// it was never classified), its secrets class and its locality class (""
// if it had none).
func (st *stream) close() (class, secrets, locality cache.Class) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.closed = true
	st.releaseLocked()
	for _, w := range st.watches {
		if w.set != nil {
			w.table.Unsubscribe(w, w.set)
		}
		if w.named != nil {
			w.table.Unsubscribe(w, w.named)
		}
		w.answered()
		if w.inflight {
			w.inflight = false
			w.owed.Drop()
		}
		if w.pace != nil {
			w.pace.Stop()
		}
	}
	return st.class, st.secrets, st.locality
}

// errClosed stops a receive that finds its stream closed.
var errClosed = errors.New("server: stream closed")

// recv reads one request; one its codec could not decode, or holds more
// than a stream may ask for, is refused.
func (st *stream) recv(r any) error {
	if err := st.ss.RecvMsg(r); err != nil {
		return err
	}
	var refused error
	switch r := r.(type) {
	case *sotwRequest:
		refused = r.refused
	case *deltaRequest:
		refused = r.refused
	}
	var many tooManyVersions
	switch {
	case refused == nil:
		return nil
	case errors.As(refused, &many):
		st.srv.m.limited.WithLabelValues(limitNames).Inc()
		return status.Errorf(codes.ResourceExhausted, "shardpilot: %v", refused)
	}
	return status.Errorf(codes.InvalidArgument, "shardpilot: %v", refused)
}

// applySotW applies one decoded SotW request. An ACK whose names did not
// change allocates nothing.
func (st *stream) applySotW(r *sotwRequest, typeURL string) error {
	w, err := st.request(r.hasNode, r.node, r.typeURL, typeURL)
	if w == nil || err != nil {
		return err
	}
	st.mu.Lock()
	ack, err := st.applySotWLocked(w, r)
	// A request may make the class, or change what it sees: names left
	// out before are looked at again (nothing to do for most streams).
	st.reviewAskedLocked()
	st.mu.Unlock()
	st.confirm(ack)
	return err
}

// applySotWLocked applies a SotW request to the watch of its type, and
// returns what its ACK confirms.
func (st *stream) applySotWLocked(w *watch, r *sotwRequest) (ack confirmation, err error) {
	if st.closed {
		return ack, errClosed
	}
	first := w.set == nil
	// A type's first request on a stream answers nothing sent on it: a
	// nonce it carries (from an earlier stream) is ignored, not taken for
	// a stale one, which would leave the request unanswered.
	if len(r.nonce) > 0 && !first {
		if string(r.nonce) != w.nonce {
			return ack, nil // a stale nonce: the request is superseded
		}
		if w.inflight {
			if ack, err = st.answeredLocked(w, r.hasError, r.errorDetail); err != nil {
				return ack, err
			}
		}
	}
	if !first && r.fp == w.reqFP {
		return ack, nil
	}
	if first {
		w.legacy = len(r.ends) == 0
	}
	// Most subscriptions exist already (a class's streams ask for the same
	// names; a reconnect storm asks again for all of them): found from the
	// request's bytes, no name is copied. No names at all may mean the
	// wildcard, which is decided below.
	if len(r.ends) > st.srv.cfg.MaxNames {
		return ack, st.tooManyNames(len(r.ends))
	}
	if len(r.names) > st.srv.cfg.MaxNameBytes {
		return ack, st.tooManyBytes(len(r.names))
	}
	view := st.visibleLocked(w)
	var set *cache.Set
	if len(r.ends) > 0 && (view == nil || allVisible(r.eachName, view)) {
		set = w.table.SubscribeExisting(w, r.fp, r.eachName)
		w.asked = nil
	}
	if set == nil {
		names := r.nameList()
		wildcard := slices.Contains(names, "*") || len(names) == 0 && (first || w.legacy)
		if view != nil {
			names = st.keepVisibleLocked(w, view, names, wildcard, true)
			if wildcard {
				names, wildcard = view.Names(), false
			}
		}
		if wildcard {
			names = nil
		}
		set = w.table.Subscribe(w, names, wildcard)
	}
	st.subscribeLocked(w, set)
	w.reqFP = r.fp
	if err := st.holdLocked(w); err != nil {
		return ack, err
	}
	if first && len(r.version) > 0 {
		w.holds = true
		// A proxy that moved from another replica, or reconnected, says
		// what it holds: if it is what this replica would send, only the
		// next change is.
		if v, at := w.set.ContentVersion(); len(r.nonce) == 0 && v == string(r.version) {
			w.version, w.fresh, w.prev = at, false, nil
			w.status.Sent, w.status.Acked = v, v
			w.credited = st.srv.epoch()
			return ack, nil
		}
	}
	w.Notify()
	return ack, nil
}

// applyDelta applies one decoded Delta request.
func (st *stream) applyDelta(r *deltaRequest, typeURL string) error {
	defer r.release()
	w, err := st.request(r.hasNode, r.node, r.typeURL, typeURL)
	if w == nil || err != nil {
		return err
	}
	st.mu.Lock()
	ack, err := st.applyDeltaLocked(w, r)
	st.reviewAskedLocked()
	st.mu.Unlock()
	st.confirm(ack)
	return err
}

// applyDeltaLocked applies a Delta request to the watch of its type, and
// returns what its ACK confirms.
func (st *stream) applyDeltaLocked(w *watch, r *deltaRequest) (ack confirmation, err error) {
	if st.closed {
		return ack, errClosed
	}
	first := w.set == nil
	if len(r.nonce) > 0 && string(r.nonce) == w.nonce && w.inflight {
		if ack, err = st.answeredLocked(w, r.hasError, r.errorDetail); err != nil {
			return ack, err
		}
	}
	wildcard := w.wildcard
	var add []string
	var remove map[string]bool // made only when something is unsubscribed
	for _, n := range r.subscribe {
		if n == "*" {
			wildcard = true
		} else {
			add = append(add, n)
		}
	}
	for _, n := range r.unsubscribe {
		if n == "*" {
			wildcard = false
		} else {
			if remove == nil {
				remove = map[string]bool{}
			}
			remove[n] = true
		}
	}
	if first && len(r.subscribe) == 0 {
		wildcard = true // a first request that names nothing asks for everything
	}
	if !first && wildcard == w.wildcard && len(add) == 0 && len(remove) == 0 {
		return ack, nil
	}
	if view := st.visibleLocked(w); view != nil {
		names := append(w.explicitLocked(), add...)
		names = slices.DeleteFunc(names, func(n string) bool { return remove[n] })
		if len(names) > st.srv.cfg.MaxNames {
			return ack, st.tooManyNames(len(names))
		}
		if n := nameBytes(names); n > st.srv.cfg.MaxNameBytes {
			return ack, st.tooManyBytes(n)
		}
		st.subscribeDeltaLocked(w, view, names, wildcard, true)
	} else {
		var namespaces []string // newly asked for virtual hosts' namespaces
		if first || len(add) > 0 || len(remove) > 0 {
			var names []string
			if w.named != nil {
				names = w.named.Names()
			}
			if w.typeURL == resource.VirtualHostType && !first {
				namespaces = slices.DeleteFunc(slices.Clone(add), func(n string) bool { return w.named != nil && w.named.Has(n) })
			}
			names = append(names, add...)
			names = slices.DeleteFunc(names, func(n string) bool { return remove[n] })
			if len(names) > st.srv.cfg.MaxNames {
				return ack, st.tooManyNames(len(names))
			}
			if n := nameBytes(names); n > st.srv.cfg.MaxNameBytes {
				return ack, st.tooManyBytes(n)
			}
			named := w.table.Subscribe(w, names, false)
			if w.named != nil {
				w.table.Unsubscribe(w, w.named)
			}
			w.named = named
			// Envoy asks for the virtual hosts of a route configuration
			// by its name, their namespace (<route configuration>/<host>).
			// A class's route configurations are those every proxy of it
			// asks for: the names are kept, and answered as the wildcard.
			wildcard = wildcard || w.typeURL == resource.VirtualHostType && len(names) > 0
		}
		w.wildcard = wildcard
		if wildcard {
			st.subscribeLocked(w, w.table.Subscribe(w, nil, true))
		} else {
			st.subscribeLocked(w, w.table.Ref(w, w.named))
		}
		if len(namespaces) > 0 && wildcard && (!w.fresh || w.prev != nil) {
			// Envoy asks for a namespace again when it makes a route
			// configuration's virtual hosts subscription anew (their
			// source changed, or the configuration came back): it holds
			// none of them, and is sent them all.
			w.prev, w.fresh = cache.AllBut(namespaces), true
		}
	}
	if err := st.holdLocked(w); err != nil {
		return ack, err
	}
	if first && len(r.initial) > 0 {
		w.initial, w.holds = r.initial, true
	}
	w.Notify()
	return ack, nil
}

// subscribeLocked makes set, which w holds a subscription to, what it is
// answered from: fresh, from what it held of the set before.
func (st *stream) subscribeLocked(w *watch, set *cache.Set) {
	if w.set != nil {
		w.table.Unsubscribe(w, w.set)
		if w.set == set {
			return
		}
		if !w.fresh {
			w.prev = w.set
		}
	}
	w.set, w.fresh = set, true
}

// confirmation is what an ACK newly confirms: the epochs (from, to] of
// a type; none when to is 0.
type confirmation struct {
	typeURL  string
	from, to int64
}

// confirm tells the hooks what an ACK confirmed, once the stream's
// lock is released.
func (st *stream) confirm(c confirmation) {
	if c.to > 0 {
		st.srv.cfg.Hooks.OnConfirmed(c.typeURL, c.from, c.to)
	}
}

// answeredLocked records the ACK or, with an error detail, the NACK of the
// in-flight response of w, and wakes the sender if changes waited for it.
// It returns what an ACK confirms.
func (st *stream) answeredLocked(w *watch, nacked bool, detail []byte) (ack confirmation, _ error) {
	var nack *rpcstatus.Status
	if nacked {
		nack = &rpcstatus.Status{}
		if err := proto.Unmarshal(detail, nack); err != nil {
			return ack, status.Errorf(codes.InvalidArgument, "shardpilot: request for %s: error_detail: %v", w.short, err)
		}
	}
	w.inflight = false
	w.owed.Drop() // the response counted as due until answered
	w.status.Unanswered = false
	if st.behind.Load() && st.caughtUpLocked() {
		st.behind.Store(false)
	}
	s := st.srv
	if nack != nil {
		w.status.LastNACK = &NACK{Version: w.status.Sent, Message: nack.GetMessage(), At: time.Now()}
		s.m.nacks.WithLabelValues(w.short).Inc()
		s.cfg.Log.Warn("proxy rejected a response", "stream", st.id, "proxy", st.node.GetId(), "type", w.short,
			"nonce", w.nonce, "reason", nack.GetMessage())
	} else {
		w.status.Acked = w.status.Sent
		if w.epoch > w.credited {
			ack = confirmation{w.typeURL, w.credited, w.epoch}
			w.credited = w.epoch
		}
	}
	if w.dirty.Load() {
		st.wakeUp()
	}
	return ack, nil
}

// caughtUpLocked reports whether every response of the stream is
// answered (what is due meanwhile goes out at once).
func (st *stream) caughtUpLocked() bool {
	for _, w := range st.watches {
		if w.inflight {
			return false
		}
	}
	return true
}

// push sends every due response, in push order. A type that waits for its
// pace holds back the types after it, whose responses may name what its
// own brings (routes a new cluster).
func (st *stream) push() error {
	var over error
	held := false
	for i := 0; ; i++ {
		out, err := st.next(i, held)
		if tl, ok := err.(tooLarge); ok {
			// The other types' responses go out first: every stream the
			// client opens brings them, while this one does not fit.
			over = cmp.Or(over, tl.error)
			continue
		}
		if err != nil {
			return err
		}
		if out == errDone {
			return over
		}
		if out == errPaced {
			held = true
			continue
		}
		if out == nil {
			continue
		}
		if err := st.send(out); err != nil {
			return err
		}
	}
}

// errDone says that no watch is left; errPaced that the watch waits for
// its pace.
var errDone, errPaced = &outgoing{}, &outgoing{}

// tooLarge is a response past the stream's ResponseLimit: the status the
// stream ends with once the other types' responses are written.
type tooLarge struct{ error }

// next computes the response due for the i-th watch: nil when none is (or
// a type before it waits for its pace: held), errPaced when it waits for
// its own, errDone past the last watch.
func (st *stream) next(i int, held bool) (*outgoing, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if i >= len(st.watches) {
		return errDone, nil
	}
	w := st.watches[i]
	if w.inflight || w.set == nil || !w.dirty.Load() {
		return nil, nil
	}
	if held {
		// It goes after the type before it, with the same wait: due,
		// without holding the generations.
		w.owed.Excuse()
		return nil, nil
	}
	if wait := w.paceLeftLocked(); wait > 0 {
		// The last response of the type was large for the time since
		// it: what changed meanwhile goes together when its pace ends.
		w.waitPaceLocked(wait)
		return errPaced, nil
	}
	due := w.dueEpoch.Load()
	w.answered()
	req := cache.Request{Set: w.set, From: w.version, Fresh: w.fresh, Prev: w.prev, Initial: w.initial}
	var resp cache.Response
	var err error
	if st.delta {
		if partial(w.typeURL) {
			req.Limit, req.Owed = st.srv.cfg.DeltaResponseBytes, w.rest
		}
		resp, err = w.table.Delta(req)
	} else {
		resp, err = w.table.SotW(req)
	}
	if err != nil {
		st.srv.cfg.Log.Error("cannot encode a response", "proxy", st.node.GetId(), "type", w.short, "err", err)
		return nil, nil
	}
	if limit := st.responseLimit; limit > 0 && len(resp.Body) > limit {
		return nil, st.tooLargeLocked(w, resp, limit)
	}
	w.version, w.fresh, w.prev, w.initial, w.holds, w.rest = resp.To, false, nil, nil, true, resp.Rest
	// A watch sent a part holds no generation until its last part is
	// sent (see cache.Owed).
	w.owed.Apart(len(resp.Rest) > 0)
	if w.credited > 0 {
		// Generations that did not touch what the proxy watches are not
		// its changes: an ACK measures only those from the one that made
		// the watch due.
		w.credited = max(w.credited, due-1)
	}
	if resp.Empty() {
		return nil, nil
	}
	if w.typeURL == resource.ClusterType {
		st.reviewAskedLocked()
	}
	out := st.sendingLocked(w, resp)
	if len(resp.Rest) > 0 {
		// The rest is due once this is answered, from the same
		// generation; an ACK of part of it confirms none of it.
		w.Notify()
		w.dueEpoch.Store(due)
		w.epoch = w.credited
	}
	return out, nil
}

// partial reports whether a Delta response of a type may go in parts
// (Config.DeltaResponseBytes): load assignments and virtual hosts, which a
// proxy takes in any order. Clusters and listeners go whole: a route or a
// listener that names a cluster must find it, and a proxy that starts
// asks for its listeners once it has its first clusters.
func partial(typeURL string) bool {
	return typeURL == resource.EndpointType || typeURL == resource.VirtualHostType
}

// tooLargeLocked reports a response past the client's limit, which would
// refuse it and the stream with it, and returns the status its stream
// ends with once the other types' responses are written (see push): the
// client is never left waiting in silence. One that holds something of
// the type keeps it (a grpc-go client serves what it holds while it
// reconnects, and is told again while its configuration does not fit).
func (st *stream) tooLargeLocked(w *watch, resp cache.Response, limit int) error {
	st.srv.m.limited.WithLabelValues(limitResponse).Inc()
	hint := "subscribe to fewer names, or narrow what the proxy sees with a Sidecar's egress hosts"
	kept := ""
	if w.holds {
		kept = fmt.Sprintf(", the client keeps the %s resources it holds", w.short)
	}
	st.srv.cfg.Log.Warn("a response too large for its client: its stream is ended with the reason", "proxy", st.node.GetId(),
		"class", st.class, "type", w.short, "bytes", len(resp.Body), "resources", resp.Resources, "limit", limit, "holds", w.holds, "hint", hint)
	return tooLarge{status.Errorf(codes.ResourceExhausted, "shardpilot: the %s response for this proxy is %d bytes (%d resources), over the %d it takes: not sent%s; %s",
		w.short, len(resp.Body), resp.Resources, limit, kept, hint)}
}

// sendingLocked records a response of the watch as in flight (its nonce,
// its pace, the generation it is sent from, its status) and returns it.
func (st *stream) sendingLocked(w *watch, resp cache.Response) *outgoing {
	st.nonce++
	w.nonce = strconv.FormatUint(st.nonce, 10)
	w.inflight = true
	w.sentAt = time.Now().UnixNano()
	if rate := st.srv.cfg.ResponseBytesPerSecond; rate > 0 {
		w.pacedUntil = w.sentAt + int64(len(resp.Body))*int64(time.Second)/int64(rate)
	}
	w.owed.Add(&w.st.behind)
	w.epoch = st.srv.epoch()
	if w.credited == 0 {
		// A new subscription is not credited with changes made before it,
		// nor, on a new stream, with those made before the stream: a
		// proxy that connects late did not converge late.
		w.credited = max(w.epoch-1, st.startEpoch)
	}
	w.status.Sent = resp.Version
	if st.delta {
		w.status.Sent = "nonce-" + w.nonce
	}
	w.status.SentNonce, w.status.Resources = w.nonce, resp.Resources
	st.srv.m.responses.WithLabelValues(w.short).Inc()
	return newOutgoing(resp.Body, w.nonce)
}

// send writes one response.
func (st *stream) send(out *outgoing) error {
	s := st.srv
	start := time.Now()
	st.sending.Store(start.UnixNano())
	err := st.ss.SendMsg(out)
	st.sending.Store(0)
	s.m.send.Observe(time.Since(start).Seconds())
	if err != nil {
		return fmt.Errorf("server: send: %w", err)
	}
	return nil
}
