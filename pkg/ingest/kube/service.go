package kube

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// The node labels that give an endpoint its locality.
const (
	labelRegion  = "topology.kubernetes.io/region"
	labelZone    = "topology.kubernetes.io/zone"
	labelSubzone = "topology.istio.io/subzone"
	// annotationExportTo is Istio's annotation restricting who sees a Service.
	annotationExportTo = "networking.istio.io/exportTo"
)

// Hostname returns the mesh host name of a Service.
func Hostname(name, namespace, suffix string) string {
	return name + "." + namespace + ".svc." + suffix
}

// Protocol reads a port's protocol as Istio does: appProtocol first, then
// the port name's prefix ("http-web", "grpc"), then TCP.
func Protocol(p corev1.ServicePort) meshv1.Protocol {
	if p.AppProtocol != nil {
		if proto, ok := protocolByName(*p.AppProtocol); ok {
			return proto
		}
	}
	prefix, _, _ := strings.Cut(p.Name, "-")
	if proto, ok := protocolByName(prefix); ok {
		return proto
	}
	if p.Protocol == corev1.ProtocolUDP || p.Protocol == corev1.ProtocolSCTP {
		return meshv1.Protocol_PROTOCOL_UNSPECIFIED
	}
	return meshv1.Protocol_PROTOCOL_TCP
}

func protocolByName(s string) (meshv1.Protocol, bool) {
	switch strings.ToLower(s) {
	case "http", "http1", "grpc-web", "kubernetes.io/h2c-web":
		return meshv1.Protocol_PROTOCOL_HTTP, true
	case "http2", "kubernetes.io/h2c":
		return meshv1.Protocol_PROTOCOL_HTTP2, true
	case "grpc":
		return meshv1.Protocol_PROTOCOL_GRPC, true
	case "https", "kubernetes.io/wss":
		return meshv1.Protocol_PROTOCOL_HTTPS, true
	case "tls":
		return meshv1.Protocol_PROTOCOL_TLS, true
	case "mongo":
		return meshv1.Protocol_PROTOCOL_MONGO, true
	case "tcp", "mysql", "redis":
		return meshv1.Protocol_PROTOCOL_TCP, true
	}
	return 0, false
}

// ConvertService turns a Service into a model service. UDP and SCTP ports
// are left out (the mesh carries TCP); a Service with no port left is an
// error naming the field.
func ConvertService(svc *corev1.Service, suffix string) (*meshv1.Service, error) {
	out := &meshv1.Service{
		Hostnames:  []string{Hostname(svc.Name, svc.Namespace, suffix)},
		Labels:     svc.Labels,
		Resolution: meshv1.Resolution_RESOLUTION_STATIC,
	}
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		// A name of another host (istiod's alias); DNS to it for a pusher
		// that does not know aliases.
		out.Resolution = meshv1.Resolution_RESOLUTION_DNS
		out.AliasOf = strings.TrimSuffix(strings.ToLower(svc.Spec.ExternalName), ".")
	}
	// Its cluster IPs are its virtual IPs (a headless Service has none).
	ips := svc.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{svc.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if ip != "" && ip != corev1.ClusterIPNone {
			out.Addresses = append(out.Addresses, ip)
		}
	}
	out.Headless = svc.Spec.ClusterIP == corev1.ClusterIPNone && svc.Spec.Type != corev1.ServiceTypeExternalName
	if v := svc.Annotations[annotationExportTo]; v != "" {
		for _, ns := range strings.Split(v, ",") {
			out.ExportTo = append(out.ExportTo, strings.TrimSpace(ns))
		}
	}
	for _, p := range svc.Spec.Ports {
		proto := Protocol(p)
		if proto == meshv1.Protocol_PROTOCOL_UNSPECIFIED {
			continue
		}
		name := p.Name
		if name == "" {
			// A single-port Service may leave its port unnamed.
			name = fmt.Sprintf("port-%d", p.Port)
		}
		mp := &meshv1.Port{Name: name, Number: uint32(p.Port), Protocol: proto}
		if p.TargetPort.IntVal > 0 {
			mp.TargetPort = uint32(p.TargetPort.IntVal)
		}
		out.Ports = append(out.Ports, mp)
	}
	if len(out.Ports) == 0 {
		return nil, &model.FieldError{Field: "spec.ports", Reason: "no TCP port: a Service needs one to be in the mesh"}
	}
	return out, nil
}

// Lookup finds the Pods and Nodes that enrich endpoints.
type Lookup interface {
	Pod(namespace, name string) *corev1.Pod
	Node(name string) *corev1.Node
}

// ConvertEndpoints merges a Service's EndpointSlices into the endpoints of
// one shard. A not-ready endpoint that is still serving while it
// terminates drains; any other not-ready one is unhealthy.
func ConvertEndpoints(svc *corev1.Service, endpointSlices []*discoveryv1.EndpointSlice, lookup Lookup) []*meshv1.Endpoint {
	// Service port names in endpoint terms: unnamed ports got a generated name.
	portName := map[string]string{}
	for _, p := range svc.Spec.Ports {
		if p.Name == "" {
			portName[""] = fmt.Sprintf("port-%d", p.Port)
		} else {
			portName[p.Name] = p.Name
		}
	}
	seen := map[string]bool{}
	var out []*meshv1.Endpoint
	for _, es := range endpointSlices {
		if es.AddressType == discoveryv1.AddressTypeFQDN {
			continue
		}
		ports := map[string]uint32{}
		for _, p := range es.Ports {
			if p.Port == nil {
				continue
			}
			name := ""
			if p.Name != nil {
				name = *p.Name
			}
			if n, ok := portName[name]; ok {
				ports[n] = uint32(*p.Port)
			}
		}
		for _, e := range es.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			ep := &meshv1.Endpoint{Address: e.Addresses[0], Ports: ports, Health: health(e.Conditions)}
			// A workload may appear in two slices while they are rebalanced.
			id := model.EndpointID(ep)
			if seen[id] {
				continue
			}
			seen[id] = true
			nodeName := ""
			if e.NodeName != nil {
				nodeName = *e.NodeName
			}
			if ref := e.TargetRef; ref != nil && ref.Kind == "Pod" {
				if pod := lookup.Pod(ref.Namespace, ref.Name); pod != nil {
					ep.Labels = pod.Labels
					ep.ServiceAccount = pod.Spec.ServiceAccountName
					if nodeName == "" {
						nodeName = pod.Spec.NodeName
					}
				}
			}
			if node := lookup.Node(nodeName); node != nil {
				ep.Locality = &meshv1.Locality{Region: node.Labels[labelRegion], Zone: node.Labels[labelZone], Subzone: node.Labels[labelSubzone]}
			} else if e.Zone != nil {
				ep.Locality = &meshv1.Locality{Zone: *e.Zone}
			}
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, func(a, b *meshv1.Endpoint) int { return cmp.Compare(a.Address, b.Address) })
	return out
}

func health(c discoveryv1.EndpointConditions) meshv1.Health {
	ready := c.Ready == nil || *c.Ready
	switch {
	case ready:
		return meshv1.Health_HEALTH_HEALTHY
	case c.Serving != nil && *c.Serving && c.Terminating != nil && *c.Terminating:
		return meshv1.Health_HEALTH_DRAINING
	}
	return meshv1.Health_HEALTH_UNHEALTHY
}
