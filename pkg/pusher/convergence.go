package pusher

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// convergence numbers generations (epochs) and measures, when a proxy ACKs
// a response sent from an epoch, how long ago the changes of every epoch it
// newly confirms were observed at their source: the convergence time the
// dashboards and the load test report.
type convergence struct {
	hist prometheus.Histogram
	// next begins the next epoch on the cache, which numbers what its
	// tables hold (the xDS server reads it there).
	next func() int64

	mu     sync.Mutex
	recent []epochRecord // the last maxEpochs epochs, oldest first
}

// maxEpochs bounds the epochs remembered; an ACK older than that is not measured.
const maxEpochs = 4096

type epochRecord struct {
	epoch    int64
	observed time.Time
}

func newConvergence(h prometheus.Histogram, next func() int64) *convergence {
	return &convergence{hist: h, next: next}
}

// begin starts the epoch of a generation, before it hands anything over:
// a response sent from then on may contain its changes.
func (c *convergence) begin(observed time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.next()
	c.recent = append(c.recent, epochRecord{e, observed})
	if len(c.recent) > maxEpochs {
		c.recent = c.recent[len(c.recent)-maxEpochs:]
	}
}

// Confirmed measures the epochs (from, to] that an ACK of a type confirms.
// A response goes out only when what the proxy watches changed, so an ACK
// of one sent from epoch "to" confirms the changes up to it.
func (p *Pusher) Confirmed(_ string, from, to int64) {
	c := p.conv
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	// Every proxy's every ACK comes here: find the first epoch after from
	// rather than scan them all (recent is in epoch order).
	i, _ := slices.BinarySearchFunc(c.recent, from+1, func(r epochRecord, e int64) int { return cmp.Compare(r.epoch, e) })
	for _, r := range c.recent[i:] {
		if r.epoch > to {
			break
		}
		if !r.observed.IsZero() {
			c.hist.Observe(now.Sub(r.observed).Seconds())
		}
	}
}
