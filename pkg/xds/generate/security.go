package generate

import (
	"cmp"
	"slices"
	"strconv"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbacconfig "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Policy is one policy of a namespace as the generators see it; Spec is a
// *meshv1.AuthorizationPolicy, *meshv1.PeerAuthentication or
// *meshv1.RequestAuthentication (security), or a *meshv1.Telemetry or
// *meshv1.EnvoyFilter (what an Envoy's listeners log and trace, and the
// patches to its resources).
type Policy struct {
	Namespace, Name string
	Spec            PolicySpec
	Version         string
	// Root says the policy is in the mesh's root namespace: it applies to
	// every namespace (a PeerAuthentication there only without selector,
	// as the mesh's default).
	Root bool
}

// DefaultRootNamespace is Istio's root namespace.
const DefaultRootNamespace = "istio-system"

// PolicySpec is one of the security policy messages.
type PolicySpec interface {
	GetSelector() map[string]string
}

// Tag names a policy by kind ("a:", "p:", "r:", "t:" or "e:") and name
// ("~<name>" in the root namespace), as class names list the policies that
// select a workload.
func (p *Policy) Tag() string {
	name := p.Name
	if p.Root {
		name = "~" + name
	}
	switch p.Spec.(type) {
	case *meshv1.AuthorizationPolicy:
		return "a:" + name
	case *meshv1.PeerAuthentication:
		return "p:" + name
	case *meshv1.Telemetry:
		return "t:" + name
	case *meshv1.EnvoyFilter:
		return "e:" + name
	}
	return "r:" + name
}

// EnvoyOnly reports whether a policy shapes Envoys alone (a Telemetry or
// an EnvoyFilter): proxyless clients are not sent what they configure.
func (p *Policy) EnvoyOnly() bool {
	switch p.Spec.(type) {
	case *meshv1.Telemetry, *meshv1.EnvoyFilter:
		return true
	}
	return false
}

// AppliesTo reports whether a policy may apply to workloads of a
// namespace: its own, or any for a root namespace policy (but a
// PeerAuthentication or a Telemetry with a selector there only selects
// the root's own, as in Istio).
func (p *Policy) AppliesTo(namespace string) bool {
	if p.Namespace == namespace {
		return true
	}
	if !p.Root {
		return false
	}
	switch p.Spec.(type) {
	case *meshv1.PeerAuthentication, *meshv1.Telemetry:
		return len(p.Spec.GetSelector()) == 0
	}
	return true
}

// Security is the policies that apply to one class of proxies, in
// namespace and name order.
type Security []*Policy

// PoliciesFor returns the policies that apply to a class of a namespace:
// those of the namespace and the root namespace without a selector, and
// those whose tags the class lists.
func (m *Mesh) PoliciesFor(namespace string, tags []string) Security {
	if namespace == "" {
		return nil
	}
	var out Security
	for _, p := range m.Policies {
		if !p.AppliesTo(namespace) {
			continue
		}
		if len(p.Spec.GetSelector()) == 0 || slices.Contains(tags, p.Tag()) {
			out = append(out, p)
		}
	}
	return out
}

// MTLSMode is the mode of a port: a selecting PeerAuthentication's port
// mode, then its mode, then the namespace's (no selector), then the root
// namespace's (the mesh's default); the first by name where several
// select.
func (s Security) MTLSMode(port uint32) meshv1.MTLSMode {
	var mesh, ns, selected, selectedPort meshv1.MTLSMode
	for _, p := range s {
		pa, ok := p.Spec.(*meshv1.PeerAuthentication)
		if !ok {
			continue
		}
		switch {
		case len(pa.Selector) > 0:
			selectedPort = cmp.Or(selectedPort, pa.PortModes[port])
			selected = cmp.Or(selected, pa.Mode)
		case p.Root:
			mesh = cmp.Or(mesh, pa.Mode)
		default:
			ns = cmp.Or(ns, pa.Mode)
		}
	}
	return cmp.Or(selectedPort, selected, ns, mesh)
}

// inboundMode is the mutual TLS mode of an Envoy's inbound port: its
// PeerAuthentication's (see Security.MTLSMode), or, where none sets one,
// Istio's default, PERMISSIVE, when the Envoys have certificates.
func (m *Mesh) inboundMode(sec Security, port uint32) meshv1.MTLSMode {
	mode := sec.MTLSMode(port)
	if mode == meshv1.MTLSMode_MTLS_MODE_UNSET && !m.NoCertificates {
		return meshv1.MTLSMode_MTLS_MODE_PERMISSIVE
	}
	return mode
}

// inboundHTTPFilters are an Envoy's inbound HTTP filters before the
// router: the JWT filter, then the RBAC filters (which read its metadata):
// AUDIT's, DENY's, ALLOW's, as istiod orders them.
func inboundHTTPFilters(sec Security) []*hcm.HttpFilter {
	var out []*hcm.HttpFilter
	jwtFilter := JWTFilter(sec)
	if jwtFilter != nil {
		out = append(out, jwtFilter)
	}
	audit, deny, allow, anyAllow := rbacPolicies(sec, rbacOptions{jwt: jwtFilter != nil})
	if len(audit) > 0 {
		out = append(out, rbacFilter(rbacconfig.RBAC_LOG, audit))
	}
	if len(deny) > 0 {
		out = append(out, rbacFilter(rbacconfig.RBAC_DENY, deny))
	}
	if anyAllow {
		out = append(out, rbacFilter(rbacconfig.RBAC_ALLOW, allow))
	}
	return out
}

// inboundTCPFilters are an Envoy's network RBAC filters for a TCP port.
func inboundTCPFilters(sec Security, port uint32) []*listener.Filter {
	audit, deny, allow, anyAllow := rbacPolicies(sec, rbacOptions{tcp: true})
	var out []*listener.Filter
	add := func(action rbacconfig.RBAC_Action, policies map[string]*rbacconfig.Policy, what string) {
		out = append(out, &listener.Filter{Name: "envoy.filters.network.rbac", ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&netrbac.RBAC{
			StatPrefix: "tcp." + what + "." + strconv.FormatUint(uint64(port), 10) + ".",
			Rules:      &rbacconfig.RBAC{Action: action, Policies: policies},
		})}})
	}
	if len(audit) > 0 {
		add(rbacconfig.RBAC_LOG, audit, "audit")
	}
	if len(deny) > 0 {
		add(rbacconfig.RBAC_DENY, deny, "deny")
	}
	if anyAllow {
		add(rbacconfig.RBAC_ALLOW, allow, "allow")
	}
	return out
}

// inboundTLS returns the chains of one inbound port for its mTLS mode, as
// istiod matches them: plaintext alone (no PeerAuthentication, or
// DISABLE); one chain requiring mutual TLS (STRICT: a plaintext
// connection fails its handshake, never reaching the passthrough); under
// PERMISSIVE, Istio's mutual TLS (told by its ALPNs) and plaintext, and
// for a TCP port TLS the workload terminates itself, passed on as it is.
func inboundTLS(m *Mesh, chain *listener.FilterChain, mode meshv1.MTLSMode, http bool) []*listener.FilterChain {
	mutual := func(c *listener.FilterChain, alpn []string) *listener.FilterChain {
		c.FilterChainMatch.TransportProtocol, c.FilterChainMatch.ApplicationProtocols = "tls", alpn
		c.TransportSocket = inboundMutualTLS(m, http)
		return c
	}
	switch mode {
	case meshv1.MTLSMode_MTLS_MODE_STRICT:
		return []*listener.FilterChain{mutual(chain, nil)}
	case meshv1.MTLSMode_MTLS_MODE_PERMISSIVE:
		out := []*listener.FilterChain{mutual(proto.Clone(chain).(*listener.FilterChain), istioMutualALPNs)}
		if !http {
			own := proto.Clone(chain).(*listener.FilterChain)
			own.FilterChainMatch.TransportProtocol = "tls"
			out = append(out, own)
		}
		chain.FilterChainMatch.TransportProtocol = "raw_buffer"
		return append(out, chain)
	}
	chain.FilterChainMatch.TransportProtocol = "raw_buffer"
	return []*listener.FilterChain{chain}
}

// istioMutualALPNs are the ALPNs Istio's clients send over its mutual TLS,
// for HTTP and TCP alike.
var istioMutualALPNs = []string{"istio-peer-exchange", "istio", "istio-http/1.0", "istio-http/1.1", "istio-h2"}

// inboundMutualTLS is an Envoy sidecar's side of Istio's mutual TLS on its
// inbound ports, as istiod's: the client's certificate required, issued by
// the mesh's root to an identity of its trust domain; TLS 1.2 or 1.3 with
// Istio's server ciphers; HTTP/2 or HTTP/1.1 offered, and for TCP Istio's
// peer exchange first.
func inboundMutualTLS(m *Mesh, http bool) *core.TransportSocket {
	ctx := meshCertificates(Envoy, m.AgentCertificates)
	trusted := &tlsv3.CertificateValidationContext{}
	//lint:ignore SA1019 the field istiod sets
	trusted.MatchSubjectAltNames = []*matcherv3.StringMatcher{
		{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "spiffe://" + cmp.Or(m.TrustDomain, DefaultTrustDomain) + "/"}}}
	ctx.ValidationContextType = &tlsv3.CommonTlsContext_CombinedValidationContext{CombinedValidationContext: &tlsv3.CommonTlsContext_CombinedCertificateValidationContext{
		DefaultValidationContext: trusted, ValidationContextSdsSecretConfig: workloadSecret("ROOTCA", m.AgentCertificates)}}
	ctx.TlsParams = &tlsv3.TlsParameters{CipherSuites: inboundCiphers,
		TlsMinimumProtocolVersion: tlsv3.TlsParameters_TLSv1_2, TlsMaximumProtocolVersion: tlsv3.TlsParameters_TLSv1_3}
	ctx.AlpnProtocols = []string{"h2", "http/1.1"}
	if !http {
		ctx.AlpnProtocols = []string{"istio-peer-exchange", "h2", "http/1.1"}
	}
	return tlsSocket(&tlsv3.DownstreamTlsContext{CommonTlsContext: ctx, RequireClientCertificate: wrapperspb.Bool(true)})
}

// inboundCiphers are the cipher suites of Istio's mutual TLS servers, in
// order of preference.
var inboundCiphers = []string{"ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256",
	"ECDHE-RSA-AES128-GCM-SHA256", "AES256-GCM-SHA384", "AES128-GCM-SHA256"}
