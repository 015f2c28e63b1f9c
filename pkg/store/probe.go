package store

import (
	"context"
	"sync/atomic"
	"time"
)

// Probe says whether the store answers: it reads the mesh's revision (a
// read every part's user may make) every so often, each read bounded by
// the same interval. A process that writes the store is ready only while
// it can reach it.
type Probe struct {
	ok atomic.Bool
}

// Reachable reports whether the store answered the last probe (false
// before the first).
func (p *Probe) Reachable() bool { return p.ok.Load() }

// Run probes s every interval until ctx is done.
func (p *Probe) Run(ctx context.Context, s *Store, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		_, err := s.Revision(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.ok.Store(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
