package pusher

import (
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// localities generates the load assignments of the localities the sink
// holds (with those being filled), the owner's work (owner.go).
type localities struct{}

// fill generates a new locality's load assignments from mesh.
func (localities) fill(p *Pusher, mesh *generate.Mesh, class string) {
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
func (localities) generate(p *Pusher, mesh *generate.Mesh, changed []*generate.Service, remove []string) {
	if p.cfg.Localities == nil {
		return
	}
	for _, class := range p.cfg.Localities.Classes() {
		if changed == nil {
			localities{}.fill(p, mesh, class)
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
