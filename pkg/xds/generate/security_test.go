package generate_test

import (
	"slices"
	"strings"
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	jwt "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	rbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// testPolicies: a DENY policy with every kind of match, an ALLOW policy by
// principal (one rule needs a JWT: left out, failing closed), a namespace
// PERMISSIVE and a selected STRICT PeerAuthentication.
func testPolicies() []*generate.Policy {
	sel := map[string]string{"app": "greeter"}
	return []*generate.Policy{
		{Namespace: "demo", Name: "deny", Version: "1", Spec: &meshv1.AuthorizationPolicy{
			Selector: sel, Action: meshv1.AuthorizationPolicy_ACTION_DENY,
			Rules: []*meshv1.AuthorizationRule{
				{To: []*meshv1.AuthorizationOperation{{Paths: []string{"/admin/*", "*/Delete"}, Methods: []string{"POST"}, NotPorts: []uint32{8443}}}},
				{
					From: []*meshv1.AuthorizationSource{{NotNamespaces: []string{"demo"}, IpBlocks: []string{"10.0.0.0/8", "192.168.1.7"}}},
					When: []*meshv1.AuthorizationCondition{{Key: "request.headers[X-Debug]", Values: []string{"1"}}, {Key: "destination.port", Values: []string{"50051"}}},
				},
				{From: []*meshv1.AuthorizationSource{{RequestPrincipals: []string{"issuer/*"}}}, To: []*meshv1.AuthorizationOperation{{Hosts: []string{"*.example.com"}}}},
			},
		}},
		{Namespace: "demo", Name: "allow", Version: "2", Spec: &meshv1.AuthorizationPolicy{
			Rules: []*meshv1.AuthorizationRule{
				{From: []*meshv1.AuthorizationSource{{Principals: []string{"cluster.local/ns/demo/sa/client", "*/sa/admin"}}}},
				{From: []*meshv1.AuthorizationSource{{RequestPrincipals: []string{"issuer/alice"}}}},
				{When: []*meshv1.AuthorizationCondition{{Key: "source.namespace", Values: []string{"ops"}}, {Key: "source.ip", NotValues: []string{"10.9.0.0/16"}}}},
			},
		}},
		{Namespace: "demo", Name: "default", Version: "3", Spec: &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_PERMISSIVE}},
		{Namespace: "demo", Name: "greeter", Version: "4", Spec: &meshv1.PeerAuthentication{Selector: sel, Mode: meshv1.MTLSMode_MTLS_MODE_STRICT,
			PortModes: map[uint32]meshv1.MTLSMode{9090: meshv1.MTLSMode_MTLS_MODE_DISABLE}}},
		{Namespace: "other", Name: "deny-all", Version: "5", Spec: &meshv1.AuthorizationPolicy{}},
	}
}

// TestServerListeners: a proxyless server class's listeners, their RBAC
// filters and TLS contexts, golden and validated (the typed configurations
// inside too).
func TestServerListeners(t *testing.T) {
	m := testMesh()
	m.Policies = testPolicies()
	// greeter is selected: its class lists the selected policies' tags.
	sec := m.PoliciesFor("demo", []string{"a:deny", "p:greeter"})
	if len(sec) != 4 {
		t.Fatalf("policies for the class: %d, want demo's four", len(sec))
	}
	ls := generate.ServerListeners(m, "demo", sec)
	golden.CheckValid(t, "server-listeners-proxyless.json", ls)
	// By grpc-go's default name and by the one Istio's agent's bootstrap has.
	if got := strings.Join(names(ls), " "); got != "grpc/server?xds.resource.listening_address=0.0.0.0:50051 xds.istio.io/grpc/lds/inbound/0.0.0.0:50051 "+
		"grpc/server?xds.resource.listening_address=[::]:50051 xds.istio.io/grpc/lds/inbound/[::]:50051" {
		t.Fatalf("listeners %v", names(ls))
	}
	validateInside(t, ls)

	// Namespaces without policies share one class, with plain listeners.
	plain := generate.ServerListeners(m, "", nil)
	for _, l := range plain {
		if l.FilterChains[0].TransportSocket != nil {
			t.Errorf("%s: TLS without a PeerAuthentication", l.Name)
		}
	}
	if len(plain) == 0 {
		t.Error("no listeners for the namespaces without policies")
	}
	// An unselected workload gets the namespace's policies only.
	if got := m.PoliciesFor("demo", nil); len(got) != 2 {
		t.Errorf("an unselected workload gets %d policies, want the namespace's allow and default", len(got))
	}
}

func names(ls []*listener.Listener) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.Name)
	}
	return out
}

// validateInside validates what the listeners hold in typed configurations.
func validateInside(t *testing.T, ls []*listener.Listener) {
	t.Helper()
	for _, l := range ls {
		for _, fc := range l.FilterChains {
			if ts := fc.TransportSocket; ts != nil {
				var ctx tlsv3.DownstreamTlsContext
				if err := ts.GetTypedConfig().UnmarshalTo(&ctx); err != nil {
					t.Fatal(err)
				}
				if err := ctx.ValidateAll(); err != nil {
					t.Errorf("%s: TLS context: %v", l.Name, err)
				}
			}
			for _, f := range fc.Filters {
				var nr netrbac.RBAC
				if f.GetTypedConfig().MessageIs(&nr) {
					if err := f.GetTypedConfig().UnmarshalTo(&nr); err != nil {
						t.Fatal(err)
					}
					if err := nr.ValidateAll(); err != nil {
						t.Errorf("%s: network RBAC: %v", l.Name, err)
					}
					continue
				}
				var m hcm.HttpConnectionManager
				if !f.GetTypedConfig().MessageIs(&m) {
					continue
				}
				if err := f.GetTypedConfig().UnmarshalTo(&m); err != nil {
					t.Fatal(err)
				}
				if err := m.ValidateAll(); err != nil {
					t.Errorf("%s: connection manager: %v", l.Name, err)
				}
				for _, hf := range m.HttpFilters {
					var j jwt.JwtAuthentication
					if hf.GetTypedConfig().MessageIs(&j) {
						if err := hf.GetTypedConfig().UnmarshalTo(&j); err != nil {
							t.Fatal(err)
						}
						if err := j.ValidateAll(); err != nil {
							t.Errorf("%s: JWT: %v", l.Name, err)
						}
					}
					var r rbac.RBAC
					if hf.GetTypedConfig().MessageIs(&r) {
						if err := hf.GetTypedConfig().UnmarshalTo(&r); err != nil {
							t.Fatal(err)
						}
						if err := r.ValidateAll(); err != nil {
							t.Errorf("%s: RBAC: %v", l.Name, err)
						}
					}
				}
			}
		}
	}
}

// TestUpstreamTLSValidates: the TLS contexts of ISTIO_MUTUAL clusters,
// for Envoy (SDS) and proxyless clients (certificate providers), pass
// their schema's validation.
func TestUpstreamTLSValidates(t *testing.T) {
	m := testMesh()
	n := 0
	for _, proxy := range []generate.Proxy{generate.Envoy, generate.Proxyless} {
		for _, c := range generate.Clusters(m, proxy) {
			ts := c.GetTransportSocket()
			if ts == nil {
				continue
			}
			var ctx tlsv3.UpstreamTlsContext
			if err := ts.GetTypedConfig().UnmarshalTo(&ctx); err != nil {
				t.Fatal(err)
			}
			if err := ctx.ValidateAll(); err != nil {
				t.Errorf("%s %s: %v", proxy, c.Name, err)
			}
			n++
		}
	}
	if n == 0 {
		t.Error("no cluster with TLS in the test mesh")
	}
}

// TestEnvoyInbound: an Envoy class's virtual inbound listener with the
// class's policies: the JWT filter of its RequestAuthentication (request
// principals then checked from its metadata), RBAC filters on HTTP ports,
// network RBAC on TCP ports, mutual TLS as PeerAuthentication says (a TLS
// and a plaintext chain, told apart by the TLS inspector, for PERMISSIVE),
// and the cluster its remote JWKS is fetched through; golden and validated.
func TestEnvoyInbound(t *testing.T) {
	m := testMesh()
	policies := append(testPolicies(), &generate.Policy{Namespace: "demo", Name: "jwt", Version: "6", Spec: &meshv1.RequestAuthentication{
		JwtRules: []*meshv1.JWTRule{
			{Issuer: "https://issuer.example.com", JwksUri: "https://issuer.example.com/keys.json", Audiences: []string{"demo"},
				FromHeaders: []*meshv1.JWTHeader{{Name: "x-jwt", Prefix: "Bearer "}}, ForwardOriginalToken: true},
			{Issuer: "local", Jwks: `{"keys":[]}`},
		}}})
	m.Policies = policies
	sec := m.PoliciesFor("demo", []string{"a:deny"}) // not the STRICT one: demo's PERMISSIVE applies
	var inbound []*listener.Listener
	for _, l := range generate.Listeners(m, generate.Envoy, sec) {
		if l.Name == generate.VirtualInboundListener {
			inbound = append(inbound, l)
		}
	}
	golden.CheckValid(t, "inbound-envoy.json", inbound)
	validateInside(t, inbound)
	golden.CheckValid(t, "jwks-clusters.json", generate.JWKSClusters(sec))

	l := inbound[0]
	if len(l.ListenerFilters) < 2 || l.ListenerFilters[1].Name != "envoy.filters.listener.tls_inspector" {
		t.Errorf("listener filters %v: PERMISSIVE needs the TLS inspector", l.ListenerFilters)
	}
	// A port's mutual TLS (told by Istio's ALPNs) and plaintext chains,
	// then the passthrough's (see TestStrictPassthrough).
	var mutual, plain int
	for _, fc := range l.FilterChains {
		match := fc.GetFilterChainMatch()
		if match.GetDestinationPort() == nil {
			continue
		}
		switch {
		case match.GetTransportProtocol() == "tls" && fc.TransportSocket != nil:
			mutual++
			if !slices.Contains(match.ApplicationProtocols, "istio-http/1.1") {
				t.Errorf("%s: mutual TLS chain matches ALPNs %v, want Istio's", fc.Name, match.ApplicationProtocols)
			}
		case match.GetTransportProtocol() == "raw_buffer":
			plain++
		}
	}
	if mutual == 0 || mutual != plain {
		t.Errorf("%d mutual TLS and %d plaintext chains, want one of each per port", mutual, plain)
	}
	// Without policies, Istio's default, PERMISSIVE; without
	// certificates, plaintext alone.
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		if l.Name == generate.VirtualInboundListener && (len(l.ListenerFilters) < 2 || l.ListenerFilters[1].Name != "envoy.filters.listener.tls_inspector") {
			t.Errorf("listener filters %v without PeerAuthentication: want the TLS inspector (PERMISSIVE)", l.ListenerFilters)
		}
	}
	m.NoCertificates = true
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		if l.Name == generate.VirtualInboundListener && len(l.ListenerFilters) != 1 {
			t.Error("a TLS inspector without PeerAuthentication and without certificates")
		}
	}
}

// TestRootNamespace: the root namespace's policies apply to every
// namespace; its PeerAuthentication without selector is the mesh's
// default, below a namespace's own; one with a selector selects only the
// root namespace's workloads.
func TestRootNamespace(t *testing.T) {
	m := testMesh()
	root := func(name string, spec generate.PolicySpec) *generate.Policy {
		return &generate.Policy{Namespace: "istio-system", Name: name, Version: "1", Spec: spec, Root: true}
	}
	m.Policies = []*generate.Policy{
		root("mesh-strict", &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_STRICT}),
		root("gateway-only", &meshv1.PeerAuthentication{Selector: map[string]string{"istio": "ingressgateway"}, Mode: meshv1.MTLSMode_MTLS_MODE_DISABLE}),
		root("deny-debug", &meshv1.AuthorizationPolicy{Selector: map[string]string{"app": "greeter"}, Action: meshv1.AuthorizationPolicy_ACTION_DENY,
			Rules: []*meshv1.AuthorizationRule{{To: []*meshv1.AuthorizationOperation{{Paths: []string{"/debug/*"}}}}}}),
		{Namespace: "shop", Name: "default", Version: "2", Spec: &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_PERMISSIVE}},
	}
	demo := m.PoliciesFor("demo", []string{"a:~deny-debug"})
	if len(demo) != 2 || demo.MTLSMode(50051) != meshv1.MTLSMode_MTLS_MODE_STRICT {
		t.Errorf("demo: %d policies, mode %s; want the mesh's STRICT and the selected DENY", len(demo), demo.MTLSMode(50051))
	}
	if shop := m.PoliciesFor("shop", nil); shop.MTLSMode(80) != meshv1.MTLSMode_MTLS_MODE_PERMISSIVE {
		t.Errorf("shop: mode %s, want its own PERMISSIVE over the mesh's STRICT", shop.MTLSMode(80))
	}
	if m.Policies[1].AppliesTo("demo") || !m.Policies[1].AppliesTo("istio-system") || !m.Policies[2].AppliesTo("demo") {
		t.Error("a root PeerAuthentication with a selector selects the root namespace's workloads only; a root AuthorizationPolicy every namespace's")
	}
}

// TestAuditPolicies: an AUDIT policy's rules (the model's audit) become an
// RBAC filter of Envoy's LOG action before the DENY and ALLOW filters, on
// HTTP and TCP ports, as istiod sends them, widened where it cannot check
// a field as a DENY rule is; the policy's own action and rules (DENY,
// none: what a pusher that does not know audit applies) are not applied
// beside them; a proxyless server, whose grpc-go ignores the LOG action,
// gets none.
func TestAuditPolicies(t *testing.T) {
	svc := func(name string, p *meshv1.Port) *generate.Service {
		return &generate.Service{Namespace: "demo", Name: name, Spec: &meshv1.Service{Hostnames: []string{name + ".demo.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{p}}, Endpoints: []*meshv1.Endpoint{{Address: "10.1.0.1"}}}
	}
	m := generate.NewMesh([]*generate.Service{
		svc("web", &meshv1.Port{Name: "http", Number: 8080, Protocol: meshv1.Protocol_PROTOCOL_HTTP}),
		svc("db", &meshv1.Port{Name: "tcp", Number: 5432, Protocol: meshv1.Protocol_PROTOCOL_TCP}),
	}, nil)
	m.Policies = []*generate.Policy{
		{Namespace: "demo", Name: "audit", Version: "1", Spec: &meshv1.AuthorizationPolicy{Action: meshv1.AuthorizationPolicy_ACTION_DENY,
			Audit: []*meshv1.AuthorizationRule{{To: []*meshv1.AuthorizationOperation{{Methods: []string{"GET"}}}}}}},
		{Namespace: "demo", Name: "deny", Version: "2", Spec: &meshv1.AuthorizationPolicy{Action: meshv1.AuthorizationPolicy_ACTION_DENY,
			Rules: []*meshv1.AuthorizationRule{{To: []*meshv1.AuthorizationOperation{{Paths: []string{"/admin"}}}}}}},
	}
	sec := m.PoliciesFor("demo", nil)
	var ls []*listener.Listener
	for _, l := range generate.Listeners(m, generate.Envoy, sec) {
		if l.Name == generate.VirtualInboundListener {
			ls = append(ls, l)
		}
	}
	if len(ls) != 1 {
		t.Fatalf("%d virtual inbound listeners", len(ls))
	}
	validateInside(t, ls)
	var httpActions, tcpActions []string
	for _, fc := range ls[0].FilterChains {
		if fc.GetFilterChainMatch().GetTransportProtocol() != "raw_buffer" {
			continue
		}
		switch fc.GetFilterChainMatch().GetDestinationPort().GetValue() {
		case 8080:
			var m hcm.HttpConnectionManager
			if err := fc.Filters[len(fc.Filters)-1].GetTypedConfig().UnmarshalTo(&m); err != nil {
				t.Fatal(err)
			}
			for _, hf := range m.HttpFilters {
				var r rbac.RBAC
				if hf.GetTypedConfig().UnmarshalTo(&r) == nil {
					httpActions = append(httpActions, r.GetRules().GetAction().String())
					if r.GetRules().GetAction().String() == "LOG" && len(r.GetRules().GetPolicies()) != 1 {
						t.Errorf("audit filter policies %v, want the audit policy's rule", r.GetRules().GetPolicies())
					}
				}
			}
		case 5432:
			for _, f := range fc.Filters {
				var r netrbac.RBAC
				if f.GetTypedConfig().UnmarshalTo(&r) == nil {
					tcpActions = append(tcpActions, r.GetRules().GetAction().String())
				}
			}
		}
	}
	if want := []string{"LOG", "DENY"}; !slices.Equal(httpActions, want) {
		t.Errorf("HTTP port's RBAC filters %v, want %v", httpActions, want)
	}
	// On TCP, the audit rule's method cannot be checked: it audits every
	// connection; the DENY rule's path likewise denies every one.
	if want := []string{"LOG", "DENY"}; !slices.Equal(tcpActions, want) {
		t.Errorf("TCP port's RBAC filters %v, want %v", tcpActions, want)
	}
	for _, f := range generate.RBACFilters(sec) {
		var r rbac.RBAC
		if f.GetTypedConfig().UnmarshalTo(&r) == nil && r.GetRules().GetAction().String() == "LOG" {
			t.Error("a proxyless server gets the audit filter")
		}
	}
}
