package server

import (
	"cmp"

	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
)

// Status records, per stream and type, what was sent, what was ACKed and
// the last NACK, for /debug/syncz. It is safe for concurrent use.
type Status struct {
	mu      sync.Mutex
	streams map[int64]*StreamStatus
}

// StreamStatus is one proxy connection.
type StreamStatus struct {
	// Stream is go-control-plane's stream id, negated for Delta streams.
	Stream int64  `json:"stream"`
	Proxy  string `json:"proxy"`
	Delta  bool   `json:"delta"`
	// Class is the proxy class the stream is served from.
	Class string                 `json:"class,omitempty"`
	Since time.Time              `json:"connected"`
	Types map[string]*TypeStatus `json:"types"`
	node  *core.Node
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
	// sent remembers the version and epoch of each outstanding nonce.
	sent map[string]sentResponse
	// credited is the newest epoch whose ACK has been reported.
	credited int64
}

type sentResponse struct {
	version string
	epoch   int64
}

// NACK is a rejected response.
type NACK struct {
	Version string    `json:"version"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// NewStatus returns an empty Status.
func NewStatus() *Status { return &Status{streams: map[int64]*StreamStatus{}} }

// open records a stream at its first request and reports whether it is new.
func (s *Status) open(id int64, delta bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.streams[id]; ok {
		return false
	}
	s.streams[id] = &StreamStatus{Stream: id, Delta: delta, Since: time.Now(), Types: map[string]*TypeStatus{}}
	return true
}

// close forgets a stream and reports whether it was known.
func (s *Status) close(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.streams[id]
	delete(s.streams, id)
	return ok
}

func (s *Status) typ(id int64, node *core.Node, typeURL string) *TypeStatus {
	st := s.streams[id]
	if st == nil {
		return nil
	}
	if node != nil {
		st.Proxy, st.node = node.GetId(), node
	}
	t := st.Types[shortType(typeURL)]
	if t == nil {
		t = &TypeStatus{sent: map[string]sentResponse{}}
		st.Types[shortType(typeURL)] = t
	}
	return t
}

// request records an ACK or a NACK of the response with the request's
// nonce. An ACK returns the epochs it newly confirms, (from, to].
func (s *Status) request(id int64, node *core.Node, classify func(*core.Node) string, typeURL, nonce string, nack *NACK) (from, to int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.streams[id]; st != nil && st.Class == "" && node != nil && classify != nil {
		st.Class = classify(node)
	}
	t := s.typ(id, node, typeURL)
	if t == nil || nonce == "" {
		return 0, 0
	}
	sent, ok := t.sent[nonce]
	if !ok {
		return 0, 0
	}
	// Older nonces can no longer be answered.
	clear(t.sent)
	if nack != nil {
		nack.Version = sent.version
		t.LastNACK = nack
		return 0, 0
	}
	t.Acked = sent.version
	if sent.epoch <= t.credited {
		return 0, 0
	}
	from, t.credited = t.credited, sent.epoch
	return from, sent.epoch
}

func (s *Status) response(id int64, typeURL, version, nonce string, resources int, epoch int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.typ(id, nil, typeURL)
	if t == nil {
		return
	}
	t.Sent, t.SentNonce, t.Resources = version, nonce, resources
	t.sent[nonce] = sentResponse{version, epoch}
	if t.credited == 0 {
		// A new subscription is not credited with changes made before it.
		t.credited = epoch - 1
	}
}

// moved returns the streams whose proxy's class is no longer the one the
// stream is served from.
func (s *Status) moved(classify func(*core.Node) string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []int64
	for id, st := range s.streams {
		if st.node != nil && st.Class != "" && classify(st.node) != st.Class {
			out = append(out, id)
		}
	}
	return out
}

// Node returns the node of a connected proxy, or nil.
func (s *Status) Node(proxy string) *core.Node {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.streams {
		if st.Proxy == proxy {
			return st.node
		}
	}
	return nil
}

// Streams returns a copy of every stream's status, ordered by proxy.
func (s *Status) Streams() []StreamStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StreamStatus, 0, len(s.streams))
	for _, st := range s.streams {
		c := *st
		c.Types = make(map[string]*TypeStatus, len(st.Types))
		for k, v := range st.Types {
			tc := *v
			tc.sent = nil
			if v.LastNACK != nil {
				n := *v.LastNACK
				tc.LastNACK = &n
			}
			c.Types[k] = &tc
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b StreamStatus) int {
		return cmp.Or(cmp.Compare(a.Proxy, b.Proxy), cmp.Compare(a.Stream, b.Stream))
	})
	return out
}

// ServeHTTP serves /debug/syncz: every stream's status as JSON; ?proxy=<id>
// keeps one proxy's.
func (s *Status) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	streams := s.Streams()
	if p := r.URL.Query().Get("proxy"); p != "" {
		streams = slices.DeleteFunc(streams, func(st StreamStatus) bool { return st.Proxy != p })
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(streams)
}
