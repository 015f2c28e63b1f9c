package pusher

import (
	"context"

	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// One goroutine, the owner, generates: every generation, and the fill of
// a class or a locality seen for the first time, runs on it in turn, as a
// message from the goroutine that asks (the debouncer, a proxy's stream).
// What generations keep between them (the last mesh, the memos, the
// lingering clusters, the endpoint names) is its alone and carries no
// lock. A fill that read the mesh before a change could otherwise finish
// after the change's generation, which did not see the class yet, and
// serve the class the old mesh until the next change.

// own runs the messages until ctx ends.
func (p *Pusher) own(ctx context.Context) {
	defer close(p.stopped)
	for {
		select {
		case <-ctx.Done():
			return
		case fn := <-p.inbox:
			fn()
		}
	}
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
