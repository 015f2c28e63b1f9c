package pusher

import (
	"context"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// One goroutine, the owner, keeps the mesh and generates. It runs one loop
// over typed messages: what the follow goroutine read (a load of the
// store, a change event, decoded: arrival), the fills and questions of the
// proxies' streams (inbox), and its own timer (the debounce, the lingering
// clusters). The mesh state, the debouncer, the last mesh, the memos, the
// lingering clusters and the generation cache are its alone and carry no
// lock; no generation asks for another through another goroutine. A fill
// that read the mesh before a change could otherwise finish after the
// change's generation, which did not see the class yet, and serve the
// class the old mesh until the next change.
//
// A change crosses one hand-off on its way to the tables: the follow
// goroutine reads and decodes it beside a generation, the owner applies it
// and generates.

// arrival is what the follow goroutine hands the owner: a load of the
// store, a change event (key, event, and a PUT's object decoded), or an
// event read with nothing to apply (key zero), which moves the stream
// position alone.
type arrival struct {
	// pass numbers the follow pass that read it: the owner takes a
	// pass's events after its load, and none of a pass it ended.
	pass uint64
	// at is when it was read; seq is the stream sequence of the event (of
	// the stream position before the load).
	at  time.Time
	seq uint64

	load  *loaded
	key   model.Key
	event *meshv1.ChangeEvent
	obj   model.Object
}

// loaded is a load of the store: its objects at rev, and for a pusher
// serving some namespaces, the namespaces in scope (nil: the whole mesh)
// and the Sidecars that decide them.
type loaded struct {
	items    []model.Stored
	rev      int64
	scope    []string
	sidecars map[model.Key]*meshv1.Scope
	// end ends the pass: a change the owner takes asks for a load again.
	end context.CancelCauseFunc
}

// own runs the owner's loop until ctx ends.
func (p *Pusher) own(ctx context.Context) {
	defer close(p.stopped)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// What the follow goroutine read while the owner was busy is
		// applied before the debouncer is asked: a generation takes
		// every change read before it, as it did when follow applied
		// them itself.
		p.takeArrived()
		now := time.Now()
		if !p.lingerAt.IsZero() && !now.Before(p.lingerAt) {
			// A lingering cluster may go: a generation lets it.
			p.lingerAt = time.Time{}
			p.debouncer.Add(fullChange(now), now)
		}
		c, ready, wait := p.debouncer.Poll(now)
		if ready {
			p.generate(c)
			continue
		}
		switch {
		case !p.lingerAt.IsZero() && (wait == 0 || p.lingerAt.Sub(now) < wait):
			wait = p.lingerAt.Sub(now)
		case wait == 0:
			wait = time.Hour // nothing pending
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case a := <-p.arrivals:
			p.take(a)
		case fn := <-p.inbox:
			fn()
		case <-timer.C:
		}
	}
}

// takeArrived takes what the follow goroutine read meanwhile (between the
// classes of a long generation): those waiting now, not those that keep
// coming.
func (p *Pusher) takeArrived() {
	for range len(p.arrivals) {
		p.take(<-p.arrivals)
	}
}

// take applies what the follow goroutine read.
func (p *Pusher) take(a arrival) {
	if a.load != nil {
		p.pass, p.passEnd = a.pass, a.load.end
		p.scope, p.sidecars = a.load.scope, a.load.sidecars
		if p.sidecars == nil {
			p.sidecars = map[model.Key]*meshv1.Scope{}
		}
		p.state.reset(a.load.items, a.load.rev)
		p.applied.Store(a.load.rev)
		p.consumed.Store(a.seq)
		p.debouncer.Add(fullChange(a.at), a.at)
		return
	}
	if a.pass != p.pass || p.passEnd == nil {
		return // a pass ended: a load follows
	}
	p.consumed.Store(a.seq)
	if a.event == nil {
		return
	}
	changed := p.state.apply(a.key, a.event, a.obj)
	p.applied.Store(p.state.rev)
	if !changed {
		p.m.events.WithLabelValues("skipped").Inc()
		return
	}
	p.m.events.WithLabelValues("applied").Inc()
	if err := p.rescope(a.key, a.obj); err != nil {
		p.passEnd(err)
		p.passEnd = nil
		return
	}
	observed := a.at // a delete: observed when it arrives
	if a.obj != nil && a.obj.GetOrigin().GetObservedAt() != nil {
		at := a.obj.GetOrigin().GetObservedAt().AsTime()
		if lag := a.at.Sub(at); lag < -clockSkew || lag > maxApplyLag {
			// Its source's clock is off: measured from its arrival, so
			// that the convergence time is not skewed for as long as
			// its object lives.
			p.m.impossibleClock.Inc()
		} else {
			observed = at
			p.m.applyLag.Observe(lag.Seconds())
		}
	}
	if a.key.Kind == model.KindEndpoints {
		p.debouncer.Add(change{n: 1, since: a.at, endpoints: 1, endpointsObserved: observed}, a.at)
		return
	}
	p.debouncer.Add(change{n: 1, since: a.at, full: true, observed: observed}, a.at)
}

// onOwner runs fn on the owner and waits for it; it does not run fn once
// the owner has stopped.
func (p *Pusher) onOwner(fn func()) {
	done := make(chan struct{})
	select {
	case p.inbox <- func() { defer close(done); fn() }:
		<-done
	case <-p.stopped:
	}
}

// FillClass generates the resources of a class seen for the first time,
// from the last generation's mesh, before its first proxy is served. The
// tables list the class from when its tables exist, so a generation after
// the fill generates it too; before the first generation there is nothing
// to fill from, and the first generation fills it. A fill asked before Run
// waits for it.
func (p *Pusher) FillClass(class cache.Class) {
	p.onOwner(func() {
		p.prints.forget(class) // its tables are new, whatever it had before
		if p.last != nil {
			p.generateClass(p.last, class)
		}
	})
}

// FillLocality generates the load assignments of a locality seen for the
// first time, from the last generation's mesh, before its first proxy is
// served.
func (p *Pusher) FillLocality(class cache.Class) {
	p.onOwner(func() {
		if p.last != nil && p.cfg.Localities != nil {
			p.fillLocality(p.last, class)
		}
	})
}

// Provenance names, in the last mesh generated, the DestinationRule that
// shapes each host's clusters and the VirtualService that routes it
// (namespace/name), for the hosts asked that have one (shardctl's
// provenance columns). It runs on the owner, after the generation under
// way.
func (p *Pusher) Provenance(hosts []string) (destinationRules, virtualServices map[string]string) {
	destinationRules, virtualServices = map[string]string{}, map[string]string{}
	p.onOwner(func() {
		if p.last == nil {
			return
		}
		for _, h := range hosts {
			if s := p.last.Service(h); s != nil && s.PolicyName != "" {
				destinationRules[h] = s.PolicyName
			}
			if r := p.last.RouteFor(h); r != nil {
				virtualServices[h] = r.Namespace + "/" + r.Name
			}
		}
	})
	return destinationRules, virtualServices
}
