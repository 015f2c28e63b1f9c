package generate

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// TestReroutedLocal: a change of route rules is local (changes virtual
// hosts alone) unless a rule it changes, or one routing a host it names
// before or after it, routes TCP or TLS, delegates or matches on its
// source; or a rule it changes binds a gateway or names no host; or a host
// it names is an alias service's name or has one.
func TestReroutedLocal(t *testing.T) {
	const a, b = "a.ns.svc.cluster.local", "b.ns.svc.cluster.local"
	svc := func(name, host string) *Service {
		return &Service{Namespace: "ns", Name: name, Spec: &meshv1.Service{Hostnames: []string{host}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}, {Name: "tcp", Number: 5432, Protocol: meshv1.Protocol_PROTOCOL_TCP}}}}
	}
	alias := &Service{Namespace: "ns", Name: "x", Spec: &meshv1.Service{Hostnames: []string{"x.ns.svc.cluster.local"}, AliasOf: b}}
	http := func(name string, hosts ...string) *Route {
		return &Route{Namespace: "ns", Name: name, Version: "1", Rule: &meshv1.RouteRule{Hosts: hosts,
			Http: []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: a}}}}}}}
	}
	with := func(r *Route, edit func(*meshv1.RouteRule)) *Route {
		edit(r.Rule)
		return r
	}
	tcp := func(rr *meshv1.RouteRule) {
		rr.Tcp = []*meshv1.L4Route{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: a}}}}}
	}
	services := []*Service{svc("a", a), svc("b", b), alias}
	for _, tc := range []struct {
		name          string
		others        []*Route // rules that do not change
		before, after *Route
		local         bool
	}{
		{"a rule added", nil, nil, http("r", a), true},
		{"a rule changed", nil, http("r", a), http("r", a), true},
		{"a rule removed", nil, http("r", a), nil, true},
		{"bound to the mesh by name", nil, nil, with(http("r", a), func(rr *meshv1.RouteRule) { rr.Gateways = []string{"mesh"} }), true},
		{"bound to a gateway", nil, nil, with(http("r", a), func(rr *meshv1.RouteRule) { rr.Gateways = []string{"mesh", "ns/gw"} }), false},
		{"with TCP routes", nil, nil, with(http("r", a), tcp), false},
		{"with TCP routes before", nil, with(http("r", a), tcp), http("r", a), false},
		{"with TLS routes", nil, nil, with(http("r", a), func(rr *meshv1.RouteRule) {
			rr.Tls = []*meshv1.L4Route{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: a}}}}}
		}), false},
		{"delegating", nil, nil, with(http("r", a), func(rr *meshv1.RouteRule) { rr.Http[0].Delegate = &meshv1.Delegate{Namespace: "ns", Name: "d"} }), false},
		{"a delegate (no hosts)", nil, nil, http("d"), false},
		{"matching on its source", nil, nil, with(http("r", a), func(rr *meshv1.RouteRule) {
			rr.Http[0].Match = []*meshv1.HTTPMatch{{SourceLabels: map[string]string{"app": "c"}}}
		}), false},
		{"a host another rule routes with TCP routes", []*Route{with(http("0-first", a), tcp)}, nil, http("r", a), false},
		{"a host another rule routes over HTTP", []*Route{http("0-first", a)}, nil, http("r", a), true},
		{"a host with an alias", nil, nil, http("r", b), false},
		{"an alias's name", nil, nil, http("r", "x.ns.svc.cluster.local"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, after := tc.others, tc.others
			c := &Rerouted{}
			if tc.before != nil {
				before, c.Before = append(before[:len(before):len(before)], tc.before), []*Route{tc.before}
			}
			if tc.after != nil {
				after, c.After = append(after[:len(after):len(after)], tc.after), []*Route{tc.after}
			}
			c.From = NewMesh(services, before)
			if got := c.Local(NewMesh(services, after)); got != tc.local {
				t.Errorf("Local: %v, want %v", got, tc.local)
			}
		})
	}
}
