package istio

import (
	"fmt"
	"net/netip"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

func (n *normalizer) sidecar(in Input, spec *sidecar) {
	sc := &meshv1.Scope{Origin: n.origin(in)}
	if p := spec.OutboundTrafficPolicy; p != nil {
		switch strings.ToUpper(p.Mode) {
		case "":
		case "ALLOW_ANY":
			sc.OutboundPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_ALLOW_ANY
		case "REGISTRY_ONLY":
			sc.OutboundPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY
		default:
			n.problem(in, "spec.outboundTrafficPolicy.mode", "%q is not ALLOW_ANY or REGISTRY_ONLY", p.Mode)
			return
		}
	}
	if spec.WorkloadSelector != nil {
		sc.WorkloadSelector = spec.WorkloadSelector.Labels
	}
	for i, il := range spec.Ingress {
		f := fmt.Sprintf("spec.ingress[%d]", i)
		proto, ok := n.listenerPort(in, f, il.Port)
		if !ok {
			return
		}
		if !validDefaultEndpoint(il.DefaultEndpoint) {
			n.problem(in, f+".defaultEndpoint", "%q is not 127.0.0.1:<port>, [::1]:<port>, 0.0.0.0:<port>, [::]:<port> or unix://<path>", il.DefaultEndpoint)
			return
		}
		sc.Ingress = append(sc.Ingress, &meshv1.IngressListener{Port: il.Port.Number, Protocol: proto, Name: il.Port.Name, DefaultEndpoint: il.DefaultEndpoint})
	}
	for _, e := range spec.Egress {
		el := &meshv1.EgressListener{Hosts: e.Hosts}
		if e.Port != nil {
			el.Port = e.Port.Number
		}
		sc.Egress = append(sc.Egress, el)
	}
	n.emit(in, sc)
}

// listenerPort checks the port of a gateway server or a Sidecar ingress
// listener and returns its protocol.
func (n *normalizer) listenerPort(in Input, f string, p *servicePort) (meshv1.Protocol, bool) {
	if p == nil || p.Number == 0 || p.Number > 65535 {
		n.problem(in, f+".port.number", "a port number (1 to 65535) is required")
		return 0, false
	}
	proto, ok := protocols[strings.ToUpper(p.Protocol)]
	if !ok {
		n.problem(in, f+".port.protocol", "unknown protocol %q", p.Protocol)
	}
	if proto == meshv1.Protocol_PROTOCOL_MONGO {
		proto = meshv1.Protocol_PROTOCOL_TCP // a listener's MongoDB is plain TCP here
	}
	return proto, ok
}

// validDefaultEndpoint reports whether a Sidecar ingress listener's
// defaultEndpoint is one Istio accepts (empty: the port itself).
func validDefaultEndpoint(e string) bool {
	if e == "" {
		return true
	}
	if path, ok := strings.CutPrefix(e, "unix://"); ok {
		return path != ""
	}
	ap, err := netip.ParseAddrPort(e)
	if err != nil || ap.Port() == 0 {
		return false
	}
	return ap.Addr().IsLoopback() || ap.Addr().IsUnspecified()
}
