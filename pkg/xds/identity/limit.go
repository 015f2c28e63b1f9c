package identity

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// StreamLimit bounds the streams one identity holds at once, so that one
// workload's credentials cannot take a pusher's memory for themselves. A
// stream counts from its admission until its context ends.
type StreamLimit struct {
	max     int
	refused prometheus.Counter

	mu      sync.Mutex
	streams map[ID]int
}

// NewStreamLimit returns a limit of max streams per identity; reg, when
// set, receives its refusal counter.
func NewStreamLimit(max int, reg prometheus.Registerer) (*StreamLimit, error) {
	if max < 1 {
		return nil, fmt.Errorf("identity: a limit of %d streams per identity: want at least 1", max)
	}
	l := &StreamLimit{max: max, streams: map[ID]int{},
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_identity_streams_refused_total",
			Help: "xDS streams refused because their identity held the most streams it may."})}
	if reg != nil {
		if err := reg.Register(l.refused); err != nil {
			return nil, fmt.Errorf("identity: register metrics: %w", err)
		}
	}
	return l, nil
}

// admit counts a stream of id until ctx ends, or refuses it with
// ResourceExhausted when id holds the most streams it may.
func (l *StreamLimit) admit(ctx context.Context, id ID) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.streams[id] >= l.max {
		l.refused.Inc()
		return status.Errorf(codes.ResourceExhausted, "shardpilot: %s holds %d streams, the most one identity may", id, l.max)
	}
	l.streams[id]++
	context.AfterFunc(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.streams[id]--; l.streams[id] <= 0 {
			delete(l.streams, id)
		}
	})
	return nil
}

// Held returns how many streams id holds.
func (l *StreamLimit) Held(id ID) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.streams[id]
}
