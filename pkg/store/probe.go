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
	// alarmed holds the store's active alarms at the last probe ("": none).
	alarmed atomic.Value
}

// Reachable reports whether the store answered the last probe (false
// before the first).
func (p *Probe) Reachable() bool { return p.ok.Load() }

// Writable reports whether the store raised no alarm at the last probe
// that refuses writes (NOSPACE: its quota is full; CORRUPT).
func (p *Probe) Writable() bool { return p.Alarms() == "" }

// Alarms returns the store's active alarms at the last probe, as etcd
// names them ("" when none, or when the probe may not read them).
func (p *Probe) Alarms() string {
	a, _ := p.alarmed.Load().(string)
	return a
}

// Run probes s every interval until ctx is done.
func (p *Probe) Run(ctx context.Context, s *Store, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, every)
		_, err := s.Revision(pctx)
		var alarms string
		if err == nil {
			alarms = s.alarms(pctx)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		p.ok.Store(err == nil)
		p.alarmed.Store(alarms)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
