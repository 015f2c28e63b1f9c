package pusher

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// convergence numbers generations (epochs) and measures, when a proxy ACKs
// a response sent from an epoch, how long ago the changes of every epoch it
// newly confirms were observed at their source: the convergence time the
// dashboards and the load test report.
type convergence struct {
	hist prometheus.Histogram

	mu sync.Mutex
	// epoch is read on every push and every change notification, so
	// without the lock; it is written under it, with recent.
	epoch  atomic.Int64
	recent []epochRecord // the last maxEpochs epochs, oldest first
}

// maxEpochs bounds the epochs remembered; an ACK older than that is not measured.
const maxEpochs = 4096

type epochRecord struct {
	epoch    int64
	observed time.Time
}

func newConvergence(h prometheus.Histogram) *convergence {
	c := &convergence{hist: h}
	c.epoch.Store(1)
	return c
}

// begin starts the epoch of a generation, before it hands anything over:
// a response sent from then on may contain its changes.
func (c *convergence) begin(observed time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.epoch.Add(1)
	c.recent = append(c.recent, epochRecord{e, observed})
	if len(c.recent) > maxEpochs {
		c.recent = c.recent[len(c.recent)-maxEpochs:]
	}
}

// Epoch returns the current epoch: a response sent now contains every
// change up to it.
func (p *Pusher) Epoch() int64 { return p.conv.epoch.Load() }

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
