package pusher

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// localities keeps the localities whose load assignments are generated:
// those filled for a proxy, as long as the sink holds them.
type localities struct {
	// mu orders fills and generations: a locality filled from a mesh is
	// patched by every generation after it, its table held or still being
	// filled.
	mu sync.Mutex
	// filled holds when each locality was filled.
	filled map[string]time.Time
}

// FillLocality generates the load assignments of a locality seen for the
// first time, from the last generation's mesh, before its first proxy is
// served.
func (p *Pusher) FillLocality(class string) {
	l := &p.localities
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.filled == nil {
		l.filled = map[string]time.Time{}
	}
	l.filled[class] = time.Now()
	mesh := p.last.Load()
	if mesh == nil || p.cfg.Localities == nil {
		return
	}
	out := map[string]types.Resource{}
	for _, s := range mesh.Services {
		for _, la := range p.localityAssignments(mesh, s, class) {
			out[la.ClusterName] = la
		}
	}
	if _, _, _, err := p.cfg.Localities.Update(class, resource.EndpointType, out); err != nil {
		p.cfg.Log.Error("cache update failed", "locality", class, "type", resource.EndpointType, "err", err)
	}
}

// localityAssignments are a service's load assignments as the proxies of
// a locality see them: mostly the shared objects themselves.
func (p *Pusher) localityAssignments(mesh *generate.Mesh, s *generate.Service, class string) []*endpoint.ClusterLoadAssignment {
	shared := cached(p, "eds", "", mesh, s, generate.ServiceLoadAssignments)
	return cached(p, "eds@", class, mesh, s, func(_ *generate.Mesh, s *generate.Service) []*endpoint.ClusterLoadAssignment {
		return generate.LocalityLoadAssignments(s, shared, generate.ParseLocality(class))
	})
}

// generate hands each locality its variants of the load assignments: of
// every service when changed is nil, else of the changed services, whose
// previous assignments were named remove.
func (l *localities) generate(p *Pusher, mesh *generate.Mesh, changed []*generate.Service, remove []string) {
	if p.cfg.Localities == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	held := p.cfg.Localities.Classes()
	for _, class := range slices.Sorted(maps.Keys(l.filled)) {
		if !slices.Contains(held, class) && time.Since(l.filled[class]) > time.Minute {
			delete(l.filled, class) // dropped (a fill becomes held at once)
			continue
		}
		services := changed
		if services == nil {
			services = mesh.Services
		}
		set := map[string]types.Resource{}
		for _, s := range services {
			for _, la := range p.localityAssignments(mesh, s, class) {
				set[la.ClusterName] = la
			}
		}
		var err error
		if changed == nil {
			_, _, _, err = p.cfg.Localities.Update(class, resource.EndpointType, set)
		} else {
			_, _, _, err = p.cfg.Localities.Patch(class, resource.EndpointType, set, remove)
		}
		if err != nil {
			p.cfg.Log.Error("cache update failed", "locality", class, "type", resource.EndpointType, "err", err)
		}
	}
}
