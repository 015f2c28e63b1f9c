package generate_test

import (
	"slices"
	"testing"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	rbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrbac "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// connection is what Envoy knows of an accepted connection when it picks a
// filter chain: the original destination port, the transport protocol the
// TLS inspector found ("raw_buffer" without one, or for plaintext) and the
// ALPNs the client offered (or the HTTP inspector found).
type connection struct {
	port      uint32
	transport string
	alpn      []string
}

// selectChain picks the filter chain Envoy would, by its documented order
// of narrowing: destination port, then transport protocol, then
// application protocols; at each step a chain naming the value beats one
// naming none, and a chain naming another value is out. nil: no chain
// matches and Envoy closes the connection.
func selectChain(l *listener.Listener, c connection) *listener.FilterChain {
	tlsInspector := slices.ContainsFunc(l.ListenerFilters, func(f *listener.ListenerFilter) bool {
		return f.Name == "envoy.filters.listener.tls_inspector"
	})
	if !tlsInspector {
		c.transport = "raw_buffer" // nothing told Envoy otherwise
	}
	narrow := func(chains []*listener.FilterChain, named func(*listener.FilterChainMatch) (set, match bool)) []*listener.FilterChain {
		var exact, wild []*listener.FilterChain
		for _, fc := range chains {
			set, match := named(fc.GetFilterChainMatch())
			switch {
			case set && match:
				exact = append(exact, fc)
			case !set:
				wild = append(wild, fc)
			}
		}
		if len(exact) > 0 {
			return exact
		}
		return wild
	}
	chains := narrow(l.FilterChains, func(m *listener.FilterChainMatch) (bool, bool) {
		return m.GetDestinationPort() != nil, m.GetDestinationPort().GetValue() == c.port
	})
	chains = narrow(chains, func(m *listener.FilterChainMatch) (bool, bool) {
		return m.GetTransportProtocol() != "", m.GetTransportProtocol() == c.transport
	})
	chains = narrow(chains, func(m *listener.FilterChainMatch) (bool, bool) {
		return len(m.GetApplicationProtocols()) > 0, slices.ContainsFunc(m.GetApplicationProtocols(), func(p string) bool { return slices.Contains(c.alpn, p) })
	})
	if len(chains) != 1 {
		return nil // none, or a configuration Envoy would refuse
	}
	return chains[0]
}

// requiresClientCertificate reports whether a chain terminates TLS and
// requires the client's certificate.
func requiresClientCertificate(t *testing.T, fc *listener.FilterChain) bool {
	t.Helper()
	if fc.GetTransportSocket() == nil {
		return false
	}
	var ctx tlsv3.DownstreamTlsContext
	if err := fc.TransportSocket.GetTypedConfig().UnmarshalTo(&ctx); err != nil {
		t.Fatal(err)
	}
	return ctx.GetRequireClientCertificate().GetValue()
}

// rbacDenies reports whether a chain holds an RBAC filter (network, or
// HTTP in its connection manager) that allows no request: an ALLOW filter
// without policies.
func rbacDenies(t *testing.T, fc *listener.FilterChain) bool {
	t.Helper()
	for _, f := range fc.Filters {
		var nr netrbac.RBAC
		if f.GetTypedConfig().MessageIs(&nr) {
			if err := f.GetTypedConfig().UnmarshalTo(&nr); err != nil {
				t.Fatal(err)
			}
			if nr.GetRules().GetAction() == 0 && len(nr.GetRules().GetPolicies()) == 0 {
				return true
			}
		}
		var m hcm.HttpConnectionManager
		if f.GetTypedConfig().MessageIs(&m) {
			if err := f.GetTypedConfig().UnmarshalTo(&m); err != nil {
				t.Fatal(err)
			}
			for _, hf := range m.HttpFilters {
				var hr rbac.RBAC
				if !hf.GetTypedConfig().MessageIs(&hr) {
					continue
				}
				if err := hf.GetTypedConfig().UnmarshalTo(&hr); err != nil {
					t.Fatal(err)
				}
				if hr.GetRules().GetAction() == 0 && len(hr.GetRules().GetPolicies()) == 0 {
					return true
				}
			}
		}
	}
	return false
}

// TestStrictPassthrough: a port no Service declares is held to the
// workload's PeerAuthentication and AuthorizationPolicy as istiod holds
// it. Under STRICT a plaintext connection to it matches no chain (Envoy
// closes it); mutual TLS, HTTP or TCP, reaches a chain that requires the
// client's certificate and whose RBAC (an ALLOW policy without rules:
// deny everything) applies. PERMISSIVE takes plaintext too, under the
// same RBAC; a port-level DISABLE on an undeclared port takes plaintext
// there alone.
func TestStrictPassthrough(t *testing.T) {
	m := testMesh()
	sel := map[string]string{"app": "greeter"}
	m.Policies = []*generate.Policy{
		{Namespace: "demo", Name: "deny-all", Version: "1", Spec: &meshv1.AuthorizationPolicy{}},
		{Namespace: "demo", Name: "strict", Version: "2", Spec: &meshv1.PeerAuthentication{Selector: sel, Mode: meshv1.MTLSMode_MTLS_MODE_STRICT,
			PortModes: map[uint32]meshv1.MTLSMode{7070: meshv1.MTLSMode_MTLS_MODE_DISABLE}}},
	}
	inbound := func(sec generate.Security) *listener.Listener {
		for _, l := range generate.Listeners(m, generate.Envoy, sec) {
			if l.Name == generate.VirtualInboundListener {
				validateInside(t, []*listener.Listener{l})
				return l
			}
		}
		t.Fatal("no virtual inbound listener")
		return nil
	}
	const undeclared = 7777
	plaintext := connection{port: undeclared, transport: "raw_buffer"}
	plainHTTP := connection{port: undeclared, transport: "raw_buffer", alpn: []string{"http/1.1"}}
	mutualTCP := connection{port: undeclared, transport: "tls", alpn: []string{"istio-peer-exchange", "istio"}}
	mutualHTTP := connection{port: undeclared, transport: "tls", alpn: []string{"istio-http/1.1"}}

	strict := inbound(m.PoliciesFor("demo", []string{"p:strict"}))
	for name, c := range map[string]connection{"plaintext TCP": plaintext, "plaintext HTTP": plainHTTP} {
		if fc := selectChain(strict, c); fc != nil {
			t.Errorf("STRICT: %s to undeclared port %d reaches chain %q (TLS required: %v)", name, undeclared, fc.Name, requiresClientCertificate(t, fc))
		}
	}
	for name, c := range map[string]connection{"mutual TLS TCP": mutualTCP, "mutual TLS HTTP": mutualHTTP} {
		fc := selectChain(strict, c)
		switch {
		case fc == nil:
			t.Errorf("STRICT: %s to undeclared port %d matches no chain", name, undeclared)
		case !requiresClientCertificate(t, fc):
			t.Errorf("STRICT: %s reaches chain %q without requiring a client certificate", name, fc.Name)
		case !rbacDenies(t, fc):
			t.Errorf("STRICT: %s reaches chain %q without the AuthorizationPolicy's RBAC", name, fc.Name)
		}
	}
	if fc := selectChain(strict, mutualHTTP); fc != nil && fc.Name != "virtualInbound-catchall-http" {
		t.Errorf("STRICT: HTTP over mutual TLS reaches %q, want the catch-all HTTP chain", fc.Name)
	}
	// The port-level DISABLE: plaintext there, under the RBAC.
	if fc := selectChain(strict, connection{port: 7070, transport: "raw_buffer"}); fc == nil || requiresClientCertificate(t, fc) || !rbacDenies(t, fc) {
		t.Errorf("STRICT with port 7070 DISABLE: plaintext to 7070 gets %v, want a plaintext chain under the RBAC", fc.GetName())
	}

	// PERMISSIVE (the namespace's, the workload unselected): plaintext
	// passes the TLS requirement, not the RBAC.
	m.Policies = append(m.Policies, &generate.Policy{Namespace: "demo", Name: "default", Version: "3", Spec: &meshv1.PeerAuthentication{Mode: meshv1.MTLSMode_MTLS_MODE_PERMISSIVE}})
	permissive := inbound(m.PoliciesFor("demo", nil))
	for name, c := range map[string]connection{"plaintext TCP": plaintext, "plaintext HTTP": plainHTTP, "mutual TLS TCP": mutualTCP, "mutual TLS HTTP": mutualHTTP} {
		fc := selectChain(permissive, c)
		if fc == nil || !rbacDenies(t, fc) {
			t.Errorf("PERMISSIVE: %s to undeclared port reaches %v, want a chain under the RBAC", name, fc.GetName())
		}
		if wantTLS := c.transport == "tls"; fc != nil && requiresClientCertificate(t, fc) != wantTLS {
			t.Errorf("PERMISSIVE: %s reaches %q, client certificate required: %v", name, fc.Name, !wantTLS)
		}
	}

	// No policy at all: Istio's default, PERMISSIVE, without RBAC.
	none := inbound(nil)
	for name, c := range map[string]connection{"plaintext TCP": plaintext, "mutual TLS TCP": mutualTCP} {
		fc := selectChain(none, c)
		if fc == nil || requiresClientCertificate(t, fc) != (c.transport == "tls") || rbacDenies(t, fc) {
			t.Errorf("without policies: %s to an undeclared port reaches %v, want it passed as PERMISSIVE passes it", name, fc.GetName())
		}
	}
	// Without certificates: the one plaintext passthrough chain.
	m.NoCertificates = true
	if fc := selectChain(inbound(nil), plaintext); fc == nil || fc.Name != generate.InboundPassthroughCluster {
		t.Errorf("without policies and certificates: plaintext to an undeclared port reaches %v, want the passthrough", fc.GetName())
	}
}
