package generate

import (
	"cmp"
	"slices"
	"strconv"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rawbuffer "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/structpb"
)

// TLSModeLabel is the label an endpoint with a sidecar carries ("istio"),
// which the injector sets on its pod: it speaks Istio's mutual TLS.
const TLSModeLabel = "security.istio.io/tlsMode"

// transportSocketMatch is the endpoint metadata Envoy matches a cluster's
// transport sockets against.
const transportSocketMatch = "envoy.transport_socket_match"

// DefaultTrustDomain is the SPIFFE trust domain of the workload identities
// a client expects, unless the mesh names another.
const DefaultTrustDomain = "cluster.local"

// mutualTLS gives an Envoy's cluster Istio's mutual TLS: as its policy asks
// (ISTIO_MUTUAL), or, when the policy says nothing of TLS, the service is
// in the mesh and its PeerAuthentication does not DISABLE mutual TLS,
// toward the endpoints that have a sidecar (labelled
// tlsMode: istio) and in plaintext to the rest, as istiod's automatic
// mutual TLS does. The client expects the service's workload identities
// and names the cluster in its SNI (outbound_.<port>_.<subset>_.<host>).
func mutualTLS(c *cluster.Cluster, m *Mesh, s *Service, host string, p *meshv1.Port, subset string, policy *meshv1.TrafficPolicy, proxy Proxy) {
	if proxy != Envoy {
		return
	}
	sni := "outbound_." + strconv.FormatUint(uint64(p.Number), 10) + "_." + subset + "_." + host
	h2 := speaksH2(p, policy.GetConnectionPool(), m.Config.GetH2Upgrade())
	switch t := policy.GetTls(); t.GetMode() {
	case meshv1.ClientTLS_MODE_ISTIO_MUTUAL:
		if t.Sni != "" {
			sni = t.Sni
		}
		sans := t.SubjectAltNames
		if len(sans) == 0 {
			sans = m.identities(s)
		}
		c.TransportSocket = tlsSocket(istioMutual(sni, sans, m.AgentCertificates, h2))
	case meshv1.ClientTLS_MODE_UNSPECIFIED:
		if s.Spec.GetMeshExternal() || s.PlaintextPeers || m.NoAutoMTLS {
			return
		}
		c.TransportSocketMatches = []*cluster.Cluster_TransportSocketMatch{
			{Name: "tlsMode-istio", Match: tlsModeIstio(), TransportSocket: tlsSocket(istioMutual(sni, m.identities(s), m.AgentCertificates, h2))},
			{Name: "tlsMode-disabled", Match: &structpb.Struct{}, TransportSocket: &core.TransportSocket{Name: "envoy.transport_sockets.raw_buffer",
				ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(&rawbuffer.RawBuffer{})}}},
		}
	}
}

func tlsModeIstio() *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{"tlsMode": structpb.NewStringValue("istio")}}
}

// istioMutual is an Envoy's side of Istio's mutual TLS: its workload
// certificate ("default") and the mesh's root ("ROOTCA") over SDS (from
// Istio's agent, agent), TLS 1.2
// to 1.3, Istio's ALPN (with h2 for a cluster that speaks HTTP/2), and
// the server's identity checked.
func istioMutual(sni string, sans []string, agent, h2 bool) *tlsv3.UpstreamTlsContext {
	alpn := []string{"istio-peer-exchange", "istio"}
	if h2 {
		alpn = append(alpn, "h2")
	}
	names := &tlsv3.CertificateValidationContext{}
	for _, san := range sans {
		//lint:ignore SA1019 the field istiod sets
		names.MatchSubjectAltNames = append(names.MatchSubjectAltNames,
			&matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: san}})
	}
	return &tlsv3.UpstreamTlsContext{Sni: sni, CommonTlsContext: &tlsv3.CommonTlsContext{
		TlsParams: &tlsv3.TlsParameters{TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2,
			TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3},
		AlpnProtocols:                  alpn,
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{workloadSecret("default", agent)},
		ValidationContextType: &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
			DefaultValidationContext: names, ValidationContextSdsSecretConfig: workloadSecret("ROOTCA", agent)}},
	}}
}

// identities are the SPIFFE identities of a service's workloads: what a
// client accepts from its server.
func (m *Mesh) identities(s *Service) []string {
	td := m.TrustDomain
	if td == "" {
		td = DefaultTrustDomain
	}
	out := make([]string, 0, len(s.ServiceAccounts))
	for _, sa := range s.ServiceAccounts {
		out = append(out, "spiffe://"+td+"/ns/"+s.Namespace+"/sa/"+sa)
	}
	return out
}

// ServiceAccounts returns the distinct service accounts of endpoints, in
// order: what a service's clusters name as its identities.
func ServiceAccounts(eps []*meshv1.Endpoint) []string {
	var out []string
	for _, ep := range eps {
		if ep.ServiceAccount != "" {
			out = append(out, ep.ServiceAccount)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// takesMutualTLS reports whether an endpoint of a service is reached by
// Istio's mutual TLS on a port, as istiod decides it for each endpoint:
// its effective policy's TLS mode asks for it, or leaves TLS to the mesh
// and the workload's PeerAuthentication does not turn it off. Its load
// assignment then marks it when it has a sidecar.
func takesMutualTLS(tls meshv1.ClientTLS_Mode, s *Service, ep *meshv1.Endpoint, port uint32) bool {
	switch tls {
	case meshv1.ClientTLS_MODE_ISTIO_MUTUAL:
		return true
	case meshv1.ClientTLS_MODE_UNSPECIFIED:
		return !plaintextWorkload(s, ep, port)
	}
	return false
}

// plaintextWorkload reports whether an endpoint's workload takes
// plaintext alone on a port (see Service.PeerPolicies), as istiod checks
// each endpoint.
func plaintextWorkload(s *Service, ep *meshv1.Endpoint, port uint32) bool {
	for _, pa := range s.PeerPolicies {
		if !model.Selects(pa.Selector, ep.Labels) {
			continue
		}
		mode := cmp.Or(pa.PortModes[port], pa.Mode)
		if mode != meshv1.MTLSMode_MTLS_MODE_UNSET {
			return mode == meshv1.MTLSMode_MTLS_MODE_DISABLE
		}
	}
	return s.PlaintextDefault
}

// AllSidecars reports whether a service has endpoints and every one has a
// sidecar (labelled tlsMode: istio).
func AllSidecars(eps []*meshv1.Endpoint) bool {
	for _, ep := range eps {
		if ep.Labels[TLSModeLabel] != "istio" {
			return false
		}
	}
	return len(eps) > 0
}

// originalDestination makes an Envoy's cluster of a headless service send
// each connection to the address its client dialled (a pod's own, from
// DNS), as istiod's: no load assignment, and, where automatic mutual TLS
// would have chosen by endpoint, mutual TLS when every workload has a
// sidecar and takes it on the port, else plaintext (the connection's
// endpoint is not known before it is made).
func originalDestination(c *cluster.Cluster, s *Service, p *meshv1.Port) {
	c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST}
	c.LbPolicy, c.EdsClusterConfig, c.LbConfig, c.CommonLbConfig = cluster.Cluster_CLUSTER_PROVIDED, nil, nil, nil
	if len(c.TransportSocketMatches) == 0 {
		return
	}
	mutual := AllSidecars(s.Endpoints) && !slices.ContainsFunc(s.Endpoints, func(ep *meshv1.Endpoint) bool { return plaintextWorkload(s, ep, endpointPort(ep, p)) })
	if mutual {
		c.TransportSocket = c.TransportSocketMatches[0].TransportSocket
	}
	c.TransportSocketMatches = nil
}

// endpointMetadata says, for Envoy's transport socket match, that an
// endpoint has a sidecar (when its service takes mutual TLS, mtls).
func endpointMetadata(ep *meshv1.Endpoint, mtls bool) *core.Metadata {
	if !mtls || ep.Labels[TLSModeLabel] != "istio" {
		return nil
	}
	return &core.Metadata{FilterMetadata: map[string]*structpb.Struct{transportSocketMatch: tlsModeIstio()}}
}
