package generate

import (
	"cmp"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// LoadAssignments returns the ClusterLoadAssignment of every cluster that
// Clusters generates. They are the same for every proxy.
func LoadAssignments(m *Mesh) []*endpoint.ClusterLoadAssignment {
	var out []*endpoint.ClusterLoadAssignment
	for _, s := range m.Services {
		out = append(out, ServiceLoadAssignments(m, s)...)
	}
	return out
}

// ServiceLoadAssignments returns the assignments of one service's clusters;
// they depend on the service alone (and which of its hosts it owns).
func ServiceLoadAssignments(m *Mesh, s *Service) []*endpoint.ClusterLoadAssignment {
	if !s.routable() || ResolvesNames(s.Spec) {
		return nil // a DNS service's clusters hold their endpoints
	}
	var out []*endpoint.ClusterLoadAssignment
	for _, h := range m.Owned(s) {
		for _, p := range s.Spec.Ports {
			out = append(out, loadAssignment(ClusterName(p.Number, "", h), s, p, nil, effectivePolicy(s.Policy, nil, p.Number).GetTls().GetMode()))
			for _, sub := range s.Policy.GetSubsets() {
				out = append(out, loadAssignment(ClusterName(p.Number, sub.Name, h), s, p, sub.Labels,
					effectivePolicy(s.Policy, sub, p.Number).GetTls().GetMode()))
			}
		}
	}
	return out
}

// loadAssignment groups the service's endpoints that match the subset
// labels by locality. Every locality gets a positive weight: grpc-go drops a
// locality without one. Under a policy's TLS mode tls, the endpoints
// reached by Istio's mutual TLS that have a sidecar say so, for the
// clusters' transport socket matches (see takesMutualTLS).
func loadAssignment(name string, s *Service, p *meshv1.Port, subset map[string]string, tls meshv1.ClientTLS_Mode) *endpoint.ClusterLoadAssignment {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	byLocality := map[string]*endpoint.LocalityLbEndpoints{}
	for _, ep := range s.Endpoints {
		if !model.Selects(subset, ep.Labels) {
			continue
		}
		loc := ep.GetLocality()
		id := loc.GetRegion() + "/" + loc.GetZone() + "/" + loc.GetSubzone()
		group := byLocality[id]
		if group == nil {
			group = &endpoint.LocalityLbEndpoints{
				Locality:            &core.Locality{Region: loc.GetRegion(), Zone: loc.GetZone(), SubZone: loc.GetSubzone()},
				LoadBalancingWeight: wrapperspb.UInt32(0),
			}
			byLocality[id] = group
			cla.Endpoints = append(cla.Endpoints, group)
		}
		weight := max(ep.Weight, 1)
		group.LoadBalancingWeight.Value += weight
		group.LbEndpoints = append(group.LbEndpoints, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
				Address: socketAddress(ep.Address, endpointPort(ep, p)),
			}},
			HealthStatus:        healthStatus(ep.Health),
			LoadBalancingWeight: wrapperspb.UInt32(weight),
			Metadata:            endpointMetadata(ep, takesMutualTLS(tls, s, ep, endpointPort(ep, p))),
		})
	}
	slices.SortFunc(cla.Endpoints, func(a, b *endpoint.LocalityLbEndpoints) int {
		return cmp.Or(cmp.Compare(a.Locality.Region, b.Locality.Region), cmp.Compare(a.Locality.Zone, b.Locality.Zone),
			cmp.Compare(a.Locality.SubZone, b.Locality.SubZone))
	})
	return cla
}

// endpointPort is the port a workload listens on for a service port: its
// own mapping by port name, else the service's target port, else the port.
func endpointPort(ep *meshv1.Endpoint, p *meshv1.Port) uint32 {
	if n, ok := ep.Ports[p.Name]; ok && n != 0 {
		return n
	}
	if p.TargetPort != 0 {
		return p.TargetPort
	}
	return p.Number
}

func socketAddress(addr string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Address:       addr,
		PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}

func healthStatus(h meshv1.Health) core.HealthStatus {
	switch h {
	case meshv1.Health_HEALTH_HEALTHY:
		return core.HealthStatus_HEALTHY
	case meshv1.Health_HEALTH_UNHEALTHY:
		return core.HealthStatus_UNHEALTHY
	case meshv1.Health_HEALTH_DRAINING:
		return core.HealthStatus_DRAINING
	}
	return core.HealthStatus_UNKNOWN
}
