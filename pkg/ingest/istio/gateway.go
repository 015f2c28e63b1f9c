package istio

import (
	"fmt"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

func (n *normalizer) gateway(in Input, spec *gateway) {
	gw := &meshv1.Gateway{Origin: n.origin(in), Selector: spec.Selector}
	for i, s := range spec.Servers {
		f := fmt.Sprintf("spec.servers[%d]", i)
		proto, ok := n.listenerPort(in, f, s.Port)
		if !ok {
			return
		}
		srv := &meshv1.GatewayServer{Name: s.Name, Port: s.Port.Number, Protocol: proto, PortName: s.Port.Name, Hosts: s.Hosts}
		if t := s.TLS; t != nil {
			mode := strings.ToUpper(t.Mode)
			srv.Tls = &meshv1.GatewayTLS{Mode: mode, CredentialName: t.CredentialName, HttpsRedirect: t.HTTPSRedirect}
			if why := gatewayModeGap(proto, mode); why != "" {
				n.warn(in, f+".tls.mode", "%s", why)
			} else if !slices.Contains([]string{"", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL", "PASSTHROUGH", "AUTO_PASSTHROUGH", "OPTIONAL_MUTUAL"}, mode) {
				n.problem(in, f+".tls.mode", "unknown TLS mode %q: want SIMPLE, MUTUAL, ISTIO_MUTUAL, OPTIONAL_MUTUAL, PASSTHROUGH or AUTO_PASSTHROUGH", t.Mode)
				return
			}
		}
		gw.Servers = append(gw.Servers, srv)
	}
	n.emit(in, gw)
}

// gatewayModeGap says why a gateway server's TLS mode has no effect yet
// for its protocol ("" when it has one).
func gatewayModeGap(proto meshv1.Protocol, mode string) string {
	switch {
	case mode == "OPTIONAL_MUTUAL":
		return "OPTIONAL_MUTUAL has no effect yet: the server is not generated"
	case proto == meshv1.Protocol_PROTOCOL_TLS && (mode == "SIMPLE" || mode == "MUTUAL" || mode == "ISTIO_MUTUAL"):
		return "terminating TLS on a TLS server has no effect yet: the server is not generated (HTTPS servers terminate, TLS servers pass through)"
	case mode == "AUTO_PASSTHROUGH" && proto != meshv1.Protocol_PROTOCOL_TLS:
		return "AUTO_PASSTHROUGH applies to TLS servers: the server is not generated"
	case mode == "PASSTHROUGH" && proto != meshv1.Protocol_PROTOCOL_TLS && proto != meshv1.Protocol_PROTOCOL_HTTPS:
		return "PASSTHROUGH applies to TLS and HTTPS servers: the server is not generated"
	}
	return ""
}
