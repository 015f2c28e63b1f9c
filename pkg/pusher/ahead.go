package pusher

import "time"

// Endpoint changes ahead of the full generations: once a full generation
// takes long (a large mesh every proxy sees), a batch's load assignments
// go out before its join, and those that arrive meanwhile between its
// classes (see generate).

// endpointsAheadAfter is how long a full generation must take for the
// endpoint changes to go ahead of it: before it, and between its classes
// after each such stretch. Below it they are generated with the rest.
const endpointsAheadAfter = 250 * time.Millisecond

// endpointsMeanwhile takes what the follow goroutine read meanwhile, and
// hands over the endpoint changes waiting in the debouncer, ahead of the
// other changes waiting there.
func (p *Pusher) endpointsMeanwhile() {
	p.takeArrived()
	c, ok := p.debouncer.Take(func(pending change) (taken, rest change, took, left bool) {
		if pending.endpoints == 0 {
			return change{}, pending, false, true
		}
		taken = change{n: pending.endpoints, since: pending.since, endpoints: pending.endpoints, endpointsObserved: pending.endpointsObserved}
		rest = pending
		rest.n, rest.endpoints, rest.endpointsObserved = rest.n-rest.endpoints, 0, time.Time{}
		return taken, rest, true, rest.n > 0 || rest.full
	})
	if ok && !p.endpointsAhead(c, false) {
		p.debouncer.Add(c, c.since) // they need a full generation: with the rest
	}
}

// endpointsAhead hands over the load assignments of the endpoint changes
// applied so far, while the other changes wait for the next full view (see
// meshbuild.Builder.BuildEndpoints); a full generation follows, or, when
// fullFollows is false, is asked for if endpoints moved what the classes
// serve. It reports false, having done nothing, when the endpoint changes
// need a full view themselves.
func (p *Pusher) endpointsAhead(c change, fullFollows bool) bool {
	start := time.Now()
	built, rev, ok := p.state.meshEndpoints()
	if !ok {
		return false
	}
	p.conv.begin(c.endpointsObserved)
	p.last = built.Mesh
	p.generateEndpoints(built)
	if !fullFollows && p.serverPorts.changed(built.Changed) {
		// The ports proxyless servers serve or gateways listen on moved.
		now := time.Now()
		p.debouncer.Add(fullChange(now), now)
	}
	if rev > p.generated.Load() {
		p.generated.Store(rev)
	}
	p.m.generations.WithLabelValues("eds").Inc()
	p.m.genTime.Observe(time.Since(start).Seconds())
	p.cfg.Log.Debug("generated ahead", "changes", c.endpoints, "kind", "eds", "took", time.Since(start))
	return true
}

// routesAhead reroutes the classes for the route rules changed so far (see
// Pusher.rerouteClass), ahead of the join the batch's other changes wait
// for (meshbuild.Builder.BuildRoutes), once full generations take long: a
// route change no longer waits for a generation of every class, seconds
// long with tens of thousands of services, when a service change came in
// the same batch. The full generation follows and generates every class
// whole; a class that cannot be rerouted waits for it, and so do rules
// that change more than virtual hosts (BuildRoutes leaves them).
func (p *Pusher) routesAhead(c change) {
	built, ok := p.state.meshRoutes()
	if !ok || p.reroutes >= maxReroutes {
		return
	}
	start := time.Now()
	p.reroutes++
	p.conv.begin(c.observed)
	p.last = built.Mesh
	p.routes.generation()
	for _, class := range p.cfg.Tables.Classes() {
		p.rerouteClass(built.Mesh, class, built.Rerouted)
	}
	p.m.generations.WithLabelValues("routes").Inc()
	p.m.genTime.Observe(time.Since(start).Seconds())
	p.cfg.Log.Debug("generated ahead", "kind", "routes", "took", time.Since(start))
}
