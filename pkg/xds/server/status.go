package server

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// Streams is the registry of the open streams: it finds them (to end the
// streams of a class, an untrusted client or a shard), and reports, per
// stream and type, what was sent, what was ACKed and the last NACK, for
// /debug/syncz. Each stream
// keeps its own record under its own lock, so recording an ACK takes no
// lock another stream waits on. It is safe for concurrent use.
type Streams struct {
	// mu is the books of every server the registry is given to: it
	// guards the list of streams, and the servers' class counts,
	// connections and name budgets (classSet, conns, budget), each held
	// for a few map operations.
	mu      sync.Mutex
	streams map[int64]*stream
}

// StreamStatus is one proxy connection.
type StreamStatus struct {
	// Stream numbers the stream; Delta streams are negative.
	Stream int64  `json:"stream"`
	Proxy  string `json:"proxy"`
	Delta  bool   `json:"delta"`
	// Class is the proxy class the stream is served from.
	Class cache.Class `json:"class,omitempty"`
	// Identity is the class of the secrets the stream is served (its
	// peer's SPIFFE ID), "" when it is served none.
	Identity cache.Class            `json:"identity,omitempty"`
	Since    time.Time              `json:"connected"`
	Types    map[string]*TypeStatus `json:"types"`
	// Behind says that a response of the stream went unanswered past the
	// answer wait and not every one has been answered since: meanwhile
	// none of its types holds the backlog.
	Behind bool `json:"behind,omitempty"`
	// Node is the stream's own node, as admitted (several streams may
	// claim one id: answer for a stream from its node, never by its id).
	Node *core.Node `json:"-"`
}

// TypeStatus is one type on one stream.
type TypeStatus struct {
	// Sent is the version (SotW) or nonce (Delta) of the last response.
	Sent      string `json:"sent"`
	SentNonce string `json:"sent_nonce"`
	Resources int    `json:"resources"`
	// Acked is the last version (or nonce) the proxy accepted.
	Acked    string `json:"acked,omitempty"`
	LastNACK *NACK  `json:"last_nack,omitempty"`
	// Unanswered says that the last response went unanswered (or
	// unwritten) past the answer wait: the next generations no longer
	// wait for it.
	Unanswered bool `json:"unanswered,omitempty"`
	// Due says a change waits to be sent, InFlight that a response waits
	// for its answer, and Owed how many units of the pusher's backlog
	// (shardpilot_pusher_xds_backlog) the type holds for them.
	Due      bool  `json:"due,omitempty"`
	InFlight bool  `json:"in_flight,omitempty"`
	Owed     int32 `json:"owed,omitempty"`
}

// NACK is a rejected response.
type NACK struct {
	Version string    `json:"version"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// NewStreams returns an empty registry.
func NewStreams() *Streams { return &Streams{streams: map[int64]*stream{}} }

func (s *Streams) add(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.streams[st.id] = st
}

func (s *Streams) remove(st *stream) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.streams, st.id)
}

// all returns the open streams.
func (s *Streams) all() []*stream {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*stream, 0, len(s.streams))
	for _, st := range s.streams {
		out = append(out, st)
	}
	return out
}

// moved returns the streams whose proxy's class is no longer the one the
// stream is served from.
func (s *Streams) moved(classify func(*core.Node) cache.Class) []*stream {
	var out []*stream
	for _, st := range s.all() {
		st.mu.Lock()
		node, class := st.node, st.class
		st.mu.Unlock()
		if node != nil && class != "" && classify(node) != class {
			out = append(out, st)
		}
	}
	return out
}

// Node returns the node of a connected proxy, or nil.
func (s *Streams) Node(proxy string) *core.Node {
	for _, st := range s.all() {
		st.mu.Lock()
		node := st.node
		st.mu.Unlock()
		if node.GetId() == proxy && node != nil {
			return node
		}
	}
	return nil
}

// Identity returns the secrets class (SPIFFE ID) of the stream admitted
// as node, "" when it is served no secrets or is gone.
func (s *Streams) Identity(node *core.Node) cache.Class {
	for _, st := range s.all() {
		st.mu.Lock()
		n, id := st.node, st.secrets
		st.mu.Unlock()
		if n == node {
			return id
		}
	}
	return ""
}

// Streams returns a copy of every stream's status, ordered by proxy.
func (s *Streams) Status() []StreamStatus {
	var out []StreamStatus
	for _, st := range s.all() {
		st.mu.Lock()
		c := StreamStatus{Stream: st.id, Proxy: st.node.GetId(), Node: st.node, Delta: st.delta, Class: st.class, Identity: st.secrets, Since: st.since,
			Types: make(map[string]*TypeStatus, len(st.watches)), Behind: st.behind.Load()}
		for _, w := range st.watches {
			ts := w.status
			ts.Due, ts.InFlight, ts.Owed = w.dirty.Load(), w.inflight, w.owed.Held()
			if ts.LastNACK != nil {
				n := *ts.LastNACK
				ts.LastNACK = &n
			}
			c.Types[w.short] = &ts
		}
		st.mu.Unlock()
		if c.Proxy != "" {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b StreamStatus) int {
		return cmp.Or(cmp.Compare(a.Proxy, b.Proxy), cmp.Compare(a.Stream, b.Stream))
	})
	return out
}

// ServeHTTP serves /debug/syncz: every stream's status as JSON; ?proxy=<id>
// keeps one proxy's.
func (s *Streams) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	streams := s.Status()
	if p := r.URL.Query().Get("proxy"); p != "" {
		streams = slices.DeleteFunc(streams, func(st StreamStatus) bool { return st.Proxy != p })
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(streams)
}

// State says where a type stands on a stream, as istioctl's proxy-status
// does: SYNCED (the proxy ACKed the last response), NACKED (it rejected
// the last response), STALE (the last response awaits its answer) or
// NOT SENT.
func (t *TypeStatus) State() string {
	switch {
	case t.Sent == "":
		return "NOT SENT"
	case t.Acked == t.Sent:
		return "SYNCED"
	case t.LastNACK != nil && t.LastNACK.Version == t.Sent:
		return "NACKED"
	}
	return "STALE"
}
