package istio

import (
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
)

var protocols = map[string]meshv1.Protocol{
	"HTTP": meshv1.Protocol_PROTOCOL_HTTP, "HTTP2": meshv1.Protocol_PROTOCOL_HTTP2,
	"GRPC": meshv1.Protocol_PROTOCOL_GRPC, "GRPC-WEB": meshv1.Protocol_PROTOCOL_HTTP,
	"HTTPS": meshv1.Protocol_PROTOCOL_HTTPS, "TLS": meshv1.Protocol_PROTOCOL_TLS,
	"TCP": meshv1.Protocol_PROTOCOL_TCP, "MONGO": meshv1.Protocol_PROTOCOL_MONGO,
	"MYSQL": meshv1.Protocol_PROTOCOL_TCP, "REDIS": meshv1.Protocol_PROTOCOL_TCP,
}

var resolutions = map[string]meshv1.Resolution{
	"": meshv1.Resolution_RESOLUTION_NONE, "NONE": meshv1.Resolution_RESOLUTION_NONE,
	"STATIC": meshv1.Resolution_RESOLUTION_STATIC, "DNS": meshv1.Resolution_RESOLUTION_DNS,
	"DNS_ROUND_ROBIN": meshv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN,
}

func (n *normalizer) serviceEntry(in Input, spec *serviceEntry) *decodedService {
	svc := &meshv1.Service{
		Origin:    n.origin(in),
		Hostnames: spec.Hosts,
		Labels:    in.Resource.Metadata.Labels,
		ExportTo:  spec.ExportTo,
	}
	res, ok := resolutions[strings.ToUpper(spec.Resolution)]
	if !ok {
		n.problem(in, "spec.resolution", "unknown resolution %q: want NONE, STATIC, DNS or DNS_ROUND_ROBIN", spec.Resolution)
		return nil
	}
	svc.Resolution = res
	switch strings.ToUpper(spec.Location) {
	case "", "MESH_EXTERNAL":
		svc.MeshExternal = true
	case "MESH_INTERNAL":
	default:
		n.problem(in, "spec.location", "unknown location %q: want MESH_EXTERNAL or MESH_INTERNAL", spec.Location)
		return nil
	}
	for i, a := range spec.Addresses {
		if _, err := netip.ParseAddr(a); err != nil {
			if _, cidr := netip.ParsePrefix(a); cidr == nil {
				n.warn(in, fmt.Sprintf("spec.addresses[%d]", i), "a range (%s) is not a virtual IP; only single addresses have an effect yet", a)
				continue
			}
			n.problem(in, fmt.Sprintf("spec.addresses[%d]", i), "%q is not an IP address", a)
			return nil
		}
		svc.Addresses = append(svc.Addresses, a)
	}
	for i, p := range spec.Ports {
		proto, ok := protocols[strings.ToUpper(p.Protocol)]
		if !ok {
			n.problem(in, fmt.Sprintf("spec.ports[%d].protocol", i), "unknown protocol %q", p.Protocol)
			return nil
		}
		svc.Ports = append(svc.Ports, &meshv1.Port{Name: p.Name, Number: p.Number, Protocol: proto, TargetPort: p.TargetPort})
	}
	d := &decodedService{in: in, svc: svc}
	for i := range spec.Endpoints {
		ep, ok := n.endpoint(in, fmt.Sprintf("spec.endpoints[%d]", i), &spec.Endpoints[i])
		if !ok {
			return nil
		}
		d.inline = append(d.inline, ep)
	}
	if spec.WorkloadSelector != nil {
		d.selector = spec.WorkloadSelector.Labels
		svc.WorkloadSelector = d.selector
	}
	n.emit(in, svc)
	return d
}

func (n *normalizer) endpoint(in Input, field string, we *workloadEntry) (*meshv1.Endpoint, bool) {
	ep := &meshv1.Endpoint{
		Address:        we.Address,
		Ports:          we.Ports,
		Labels:         we.Labels,
		Weight:         we.Weight,
		ServiceAccount: we.ServiceAccount,
		Health:         meshv1.Health_HEALTH_HEALTHY,
	}
	if we.Address == "" {
		n.problem(in, field+".address", "an address is required")
		return nil, false
	}
	if we.Locality != "" {
		parts := strings.Split(we.Locality, "/")
		if len(parts) > 3 {
			n.problem(in, field+".locality", "%q is not region/zone/subzone", we.Locality)
			return nil, false
		}
		parts = append(parts, "", "")
		ep.Locality = &meshv1.Locality{Region: parts[0], Zone: parts[1], Subzone: parts[2]}
	}
	return ep, true
}

// endpoints emits the endpoints of one service entry: its inline endpoints
// and the workload entries of its namespace that its selector selects.
func (n *normalizer) endpoints(s *decodedService, entries []*decodedEntry) {
	eps := s.inline
	if s.selector != nil {
		for _, e := range entries {
			if e.ns == s.in.Resource.Metadata.Namespace && model.Selects(s.selector, e.ep.Labels) {
				eps = append(eps, e.ep)
			}
		}
	}
	if len(eps) == 0 {
		return
	}
	name := s.in.Resource.Metadata.Name
	n.objs = append(n.objs, ingest.Object{
		Key: model.Key{Kind: model.KindEndpoints, Namespace: s.in.Resource.Metadata.Namespace, Name: model.EndpointsName(name, n.opts.Shard)},
		Object: &meshv1.Endpoints{
			Origin:    n.origin(s.in),
			Service:   name,
			Shard:     n.opts.Shard,
			Endpoints: eps,
		},
	})
}

// workloadGroup checks a WorkloadGroup. Its workloads' entries are made
// by the source's registrar when an agent connects naming it; a source
// without one warns that none will be.
func (n *normalizer) workloadGroup(in Input, g *workloadGroup) {
	if !n.opts.Registration {
		n.warn(in, "spec", "workloads are not registered from this source: auto-registration needs the Kubernetes source and the bus; write a WorkloadEntry per VM (its template's labels and service account)")
		return
	}
	if g.Template == nil {
		n.problem(in, "spec.template", "a template is required")
		return
	}
	if g.Template.Address != "" {
		n.warn(in, "spec.template.address", "ignored: each registered workload's entry takes its own address")
	}
	for k, v := range g.Metadata.Labels {
		if err := validLabel(k, v); err != nil {
			n.problem(in, "spec.metadata.labels", "%v", err)
			return
		}
	}
	if len(g.Probe) > 0 && string(g.Probe) != "null" {
		n.warn(in, "spec.probe", "not supported: registered workloads are served healthy, their readiness not probed")
	}
}

// validLabel checks a label as Kubernetes does.
func validLabel(k, v string) error {
	if errs := validation.IsQualifiedName(k); len(errs) > 0 {
		return fmt.Errorf("label key %q: %s", k, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
		return fmt.Errorf("label %s value %q: %s", k, v, strings.Join(errs, "; "))
	}
	return nil
}
