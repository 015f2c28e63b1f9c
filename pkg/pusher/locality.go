package pusher

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// fillLocality generates a locality's load assignments from mesh: the
// owner's work (owner.go), as every locality generation is.
func (p *Pusher) fillLocality(mesh *generate.Mesh, class cache.Class) {
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
func (p *Pusher) localityAssignments(mesh *generate.Mesh, s *generate.Service, class cache.Class) []*endpoint.ClusterLoadAssignment {
	shared := cached(p, "eds", "", mesh, s, generate.ServiceLoadAssignments)
	return cached(p, "eds@", string(class), mesh, s, func(_ *generate.Mesh, s *generate.Service) []*endpoint.ClusterLoadAssignment {
		return generate.LocalityLoadAssignments(s, shared, generate.ParseLocality(string(class)))
	})
}

// generateLocalities hands each locality its variants of the load assignments: of
// every service when changed is nil, else of the changed services, whose
// previous assignments were named remove.
func (p *Pusher) generateLocalities(mesh *generate.Mesh, changed []*generate.Service, remove []string) {
	if p.cfg.Localities == nil {
		return
	}
	for _, class := range p.cfg.Localities.Classes() {
		if changed == nil {
			p.fillLocality(mesh, class)
			continue
		}
		set := map[string]types.Resource{}
		for _, s := range changed {
			for _, la := range p.localityAssignments(mesh, s, class) {
				set[la.ClusterName] = la
			}
		}
		if _, _, _, err := p.cfg.Localities.Patch(class, resource.EndpointType, set, remove); err != nil {
			p.cfg.Log.Error("cache update failed", "locality", class, "type", resource.EndpointType, "err", err)
		}
	}
}
