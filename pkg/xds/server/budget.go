package server

import (
	"fmt"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/time/rate"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// NameBudget bounds the bytes the names streams subscribe to hold (each
// name's bytes and cache.NameOverhead), per stream, per client
// connection, per identity and in the whole server. Names are held in
// interned sets shared by every stream of a class that asks for the same
// ones: a set counts once against each holder, however many of its
// streams hold it, so that the thousand replicas of a Deployment asking
// for the same names count them once against their identity, while a
// client making up names pays for each. A request that would take a
// holder past its bound ends its stream with ResourceExhausted.
type NameBudget struct {
	// PerStream bounds one stream's subscriptions, all types together.
	// Default 16 MiB.
	PerStream int
	// PerConnection bounds the streams of one client connection together.
	// Default 32 MiB.
	PerConnection int
	// PerIdentity bounds the streams of one identity (Hooks.OnIdentity)
	// together, on every connection. Default 64 MiB.
	PerIdentity int
	// Total bounds every stream of the server together: a few identities
	// cannot take the server's memory either. Default 512 MiB.
	Total int
	// PerIdentityRate bounds the bytes of names an identity newly holds
	// (sets none of its streams held) each second, after a burst of
	// PerIdentity: the replicas of a Deployment take a set once, while a
	// client that makes up names, drops them and asks again is refused,
	// and its identity's new streams are refused before any of their
	// messages is read until the rate has paid for what it asked. Default
	// 16 MiB a second.
	PerIdentityRate int
}

func (b *NameBudget) validate() error {
	for _, l := range []struct {
		v   *int
		def int
	}{{&b.PerStream, 16 << 20}, {&b.PerConnection, 32 << 20}, {&b.PerIdentity, 64 << 20}, {&b.Total, 512 << 20}, {&b.PerIdentityRate, 16 << 20}} {
		if *l.v == 0 {
			*l.v = l.def
		}
	}
	if b.PerStream < 0 || b.PerConnection < 0 || b.PerIdentity < 0 || b.Total < 0 || b.PerIdentityRate < 0 {
		return fmt.Errorf("server: subscribed name budgets of %d bytes a stream, %d a connection, %d an identity, %d in all and %d an identity newly holds a second: want positive numbers",
			b.PerStream, b.PerConnection, b.PerIdentity, b.Total, b.PerIdentityRate)
	}
	return nil
}

// holderKind is what holds names: a stream, a connection, an identity or
// the server.
type holderKind int

const (
	heldByStream holderKind = iota
	heldByConnection
	heldByIdentity
	heldByServer
	holderKinds
)

// limitHeld names each holder's limit in shardpilot_pusher_xds_limited_total;
// limitRate, an identity's rate of names newly held.
var limitHeld = [holderKinds]string{"subscribed_bytes_stream", "subscribed_bytes_connection", "subscribed_bytes_identity", "subscribed_bytes_total"}

const limitRate = "subscribed_bytes_identity_rate"

// ratesHeld is how many identities' rates are remembered (the most
// recently seen); one forgotten starts again with a full burst.
const ratesHeld = 10000

// holderKey names one holder: the stream (*stream), the connection (its
// remote address), the identity (its name) or the server (nil).
type holderKey struct {
	kind holderKind
	name any
}

func (k holderKey) String() string {
	switch k.kind {
	case heldByStream:
		return "this stream"
	case heldByConnection:
		return fmt.Sprintf("the connection from %v", k.name)
	case heldByIdentity:
		return fmt.Sprintf("identity %v", k.name)
	}
	return "the server"
}

// holding is one thing a watch's names are held in: an interned set
// (*cache.Set) or the request a class's view left part of out (*asked),
// and its bytes.
type holding struct {
	of    any
	bytes int
}

// holder is what one holder holds: each holding once, with how many of
// its watches hold it.
type holder struct {
	held  map[any]int
	bytes int
}

// budget counts the names each holder holds against NameBudget. It is
// called with streams' locks held; owes, at a stream's admission, reads
// the rates (the LRU has a lock of its own) without b.mu.
type budget struct {
	limits [holderKinds]int
	total  prometheus.Gauge
	// rates are the identities' rates of names newly held.
	rate  rate.Limit
	rates *lru.Cache[any, *rate.Limiter]

	mu      *sync.Mutex // the server's books (Streams.mu)
	holders map[holderKey]*holder
}

func newBudget(books *sync.Mutex, b NameBudget, total prometheus.Gauge) *budget {
	rates, _ := lru.New[any, *rate.Limiter](ratesHeld)
	return &budget{mu: books, limits: [holderKinds]int{b.PerStream, b.PerConnection, b.PerIdentity, b.Total}, total: total,
		rate: rate.Limit(b.PerIdentityRate), rates: rates, holders: map[holderKey]*holder{}}
}

// refusal says which holder a move would take past its limit (or, with
// rate, an identity past its rate) and what it would hold (or take).
type refusal struct {
	over  holderKey
	bytes int
	rate  bool
}

// move has the holders of keys hold add in place of drop. When a holder
// that grew would hold more than its limit, or an identity would newly
// hold more than its rate allows, nothing moves and the refusal is
// returned with ok false.
func (b *budget) move(keys []holderKey, add, drop []holding) (no refusal, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	refused := false
	var identity holderKey
	grown := 0 // what the identity newly holds
	for _, k := range keys {
		h := b.holders[k]
		if h == nil {
			h = &holder{held: map[any]int{}}
			b.holders[k] = h
		}
		was := h.bytes
		h.apply(add, drop)
		if h.bytes > was && h.bytes > b.limits[k.kind] && !refused {
			no, refused = refusal{over: k, bytes: h.bytes}, true // undone below, once every holder moved
		}
		if k.kind == heldByIdentity {
			identity, grown = k, h.bytes-was
		}
	}
	if !refused && grown > 0 {
		// What the identity newly holds, within every limit, is paid from
		// its rate; what it asked past the rate stays owed, so that its
		// next streams wait until it is paid.
		if l := b.rateOf(identity); !l.ReserveN(time.Now(), grown).OK() || l.Tokens() < 0 {
			no, refused = refusal{over: identity, bytes: grown, rate: true}, true
		}
	}
	if refused {
		for _, k := range keys {
			b.holders[k].apply(drop, add)
		}
	}
	for _, k := range keys {
		if h := b.holders[k]; len(h.held) == 0 {
			delete(b.holders, k)
		}
	}
	if s := b.holders[holderKey{kind: heldByServer}]; s != nil {
		b.total.Set(float64(s.bytes))
	} else {
		b.total.Set(0)
	}
	return no, !refused
}

// rateOf is an identity's rate of names newly held: a burst of its
// limit, then NameBudget.PerIdentityRate a second.
func (b *budget) rateOf(k holderKey) *rate.Limiter {
	if l, ok := b.rates.Get(k.name); ok {
		return l
	}
	l := rate.NewLimiter(b.rate, b.limits[heldByIdentity])
	b.rates.Add(k.name, l) // under b.mu: no other move adds it meanwhile
	return l
}

// owes reports whether an identity asked for more new names than its
// rate has yet paid for: its new streams are refused until it has.
func (b *budget) owes(identity string) bool {
	l, ok := b.rates.Peek(identity)
	return ok && l.Tokens() < 0
}

// apply holds add and releases drop.
func (h *holder) apply(add, drop []holding) {
	for _, a := range add {
		if h.held[a.of]++; h.held[a.of] == 1 {
			h.bytes += a.bytes
		}
	}
	for _, d := range drop {
		if h.held[d.of]--; h.held[d.of] <= 0 {
			delete(h.held, d.of)
			h.bytes -= d.bytes
		}
	}
}

// holdingsLocked is what w's subscription holds of names the proxy
// asked for: the request a view left part of out, else the interned set
// of the names it asked for (a Delta watch's named set; a SotW watch's
// set, nothing for the wildcard).
func (w *watch) holdingsLocked() []holding {
	switch {
	case w.asked != nil:
		return []holding{{w.asked, w.asked.bytes}}
	case w.named != nil:
		return []holding{{w.named, w.named.Bytes()}}
	case w.set != nil && !w.st.delta && w.set.Bytes() > 0:
		return []holding{{w.set, w.set.Bytes()}}
	}
	return nil
}

// holdLocked counts what w's subscription holds against the stream's
// holders, in place of what it held before. A holder it would take past
// its limit ends the stream with ResourceExhausted (the stream's close
// releases what w held).
func (st *stream) holdLocked(w *watch) error {
	now := w.holdingsLocked()
	if len(now) == len(w.held) && (len(now) == 0 || now[0] == w.held[0]) {
		return nil
	}
	no, ok := st.srv.budget.move(st.holders, now, w.held)
	switch {
	case !ok && no.rate:
		st.srv.m.limited.WithLabelValues(limitRate).Inc()
		return status.Errorf(codes.ResourceExhausted, "shardpilot: %s asks for %d bytes of names it held none of, past its rate of %d a second; retry later",
			no.over, no.bytes, int(st.srv.budget.rate))
	case !ok:
		st.srv.m.limited.WithLabelValues(limitHeld[no.over.kind]).Inc()
		return status.Errorf(codes.ResourceExhausted, "shardpilot: the names subscribed would take %d bytes of %s; at most %d are taken",
			no.bytes, no.over, st.srv.budget.limits[no.over.kind])
	}
	w.held = now
	return nil
}

// releaseLocked releases what the stream's watches hold.
func (st *stream) releaseLocked() {
	var drop []holding
	for _, w := range st.watches {
		drop = append(drop, w.held...)
		w.held = nil
	}
	if len(drop) > 0 {
		st.srv.budget.move(st.holders, nil, drop)
	}
}

// holdersOf returns what a new stream's names count against.
func (s *Server) holdersOf(st *stream) []holderKey {
	keys := []holderKey{{kind: heldByStream, name: st}}
	if p, ok := peer.FromContext(st.ctx); ok && p.Addr != nil {
		keys = append(keys, holderKey{kind: heldByConnection, name: p.Addr.String()})
	}
	if id := s.cfg.Hooks.OnIdentity(st.ctx); id != "" {
		keys = append(keys, holderKey{kind: heldByIdentity, name: id})
	}
	return append(keys, holderKey{kind: heldByServer})
}

// askedBytes is what the names of a request a view left part of out hold.
func askedBytes(names []string) int {
	return nameBytes(names) + len(names)*cache.NameOverhead
}
