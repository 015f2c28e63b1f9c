package model

import (
	"errors"
	"strings"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestParseKey(t *testing.T) {
	tests := map[string]struct {
		key     string
		want    Key
		wantErr bool
	}{
		"service":            {key: "/mesh/v1/services/ns/a", want: Key{KindService, "ns", "a"}},
		"endpoints shard":    {key: "/mesh/v1/endpoints/ns/a/yaml", want: Key{KindEndpoints, "ns", "a/yaml"}},
		"no prefix":          {key: "/other/services/ns/a", wantErr: true},
		"unknown kind":       {key: "/mesh/v1/gadgets/ns/a", wantErr: true},
		"missing name":       {key: "/mesh/v1/services/ns/", wantErr: true},
		"endpoints no shard": {key: "/mesh/v1/endpoints/ns/a", wantErr: true},
		"slash in name":      {key: "/mesh/v1/services/ns/a/b", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseKey(tc.key)
			if tc.wantErr {
				if !errors.Is(err, ErrBadKey) {
					t.Fatalf("err = %v, want ErrBadKey", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
			if got.String() != tc.key {
				t.Errorf("round trip: %s", got.String())
			}
		})
	}
}

func TestSameContentIgnoresOrigin(t *testing.T) {
	a := &meshv1.Service{Origin: &meshv1.Origin{Source: "x", ObservedAt: timestamppb.Now()}, Hostnames: []string{"a"}}
	b := &meshv1.Service{Origin: &meshv1.Origin{Source: "y"}, Hostnames: []string{"a"}}
	c := &meshv1.Service{Hostnames: []string{"b"}}
	if !SameContent(a, b) {
		t.Error("objects differing only in origin compare different")
	}
	if SameContent(a, c) {
		t.Error("objects with different hosts compare equal")
	}
	if a.Origin.Source != "x" {
		t.Error("SameContent modified its argument")
	}
}

func TestValidate(t *testing.T) {
	port := func(name string, n uint32) *meshv1.Port {
		return &meshv1.Port{Name: name, Number: n, Protocol: meshv1.Protocol_PROTOCOL_HTTP}
	}
	route := func(dests ...*meshv1.RouteDestination) *meshv1.RouteRule {
		return &meshv1.RouteRule{Hosts: []string{"a.ns"}, Http: []*meshv1.HTTPRoute{{Route: dests}}}
	}
	dest := func(host string, w uint32) *meshv1.RouteDestination {
		return &meshv1.RouteDestination{Destination: &meshv1.Destination{Host: host}, Weight: w}
	}
	tests := map[string]struct {
		obj       Object
		wantField string // "" for valid
	}{
		"valid service":         {&meshv1.Service{Hostnames: []string{"a.ns.svc.cluster.local"}, Ports: []*meshv1.Port{port("http", 80)}}, ""},
		"wildcard host":         {&meshv1.Service{Hostnames: []string{"*.example.com"}, Ports: []*meshv1.Port{port("http", 80)}}, ""},
		"no hosts":              {&meshv1.Service{Ports: []*meshv1.Port{port("http", 80)}}, "spec.hosts"},
		"bad host":              {&meshv1.Service{Hostnames: []string{"Not_A_Host"}, Ports: []*meshv1.Port{port("http", 80)}}, "spec.hosts[0]"},
		"no ports":              {&meshv1.Service{Hostnames: []string{"a"}}, "spec.ports"},
		"port zero":             {&meshv1.Service{Hostnames: []string{"a"}, Ports: []*meshv1.Port{port("http", 0)}}, "spec.ports[0].number"},
		"port name twice":       {&meshv1.Service{Hostnames: []string{"a"}, Ports: []*meshv1.Port{port("http", 80), port("http", 81)}}, "spec.ports[1].name"},
		"no protocol":           {&meshv1.Service{Hostnames: []string{"a"}, Ports: []*meshv1.Port{{Name: "x", Number: 80}}}, "spec.ports[0].protocol"},
		"valid endpoints":       {&meshv1.Endpoints{Service: "a", Endpoints: []*meshv1.Endpoint{{Address: "10.0.0.1"}, {Address: "10.0.0.1", Ports: map[string]uint32{"http": 81}}}}, ""},
		"duplicate endpoint":    {&meshv1.Endpoints{Service: "a", Endpoints: []*meshv1.Endpoint{{Address: "10.0.0.1"}, {Address: "10.0.0.1"}}}, "endpoints[1].address"},
		"bad endpoint address":  {&meshv1.Endpoints{Service: "a", Endpoints: []*meshv1.Endpoint{{Address: "10.0.0.300:80"}}}, "endpoints[0].address"},
		"valid route":           {route(dest("a.ns", 80), dest("b.ns", 20)), ""},
		"route without weights": {route(dest("a.ns", 0), dest("b.ns", 0)), "spec.http[0].route"},
		"route without host":    {route(dest("", 0)), "spec.http[0].route[0].destination.host"},
		"bad regex": {&meshv1.RouteRule{Hosts: []string{"a"}, Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "(("}}}},
			Route: []*meshv1.RouteDestination{dest("a", 0)}}}}, "spec.http[0].match[0].uri.regex"},
		"regex Envoy refuses as too large": {&meshv1.RouteRule{Hosts: []string{"a"}, Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{Headers: map[string]*meshv1.StringMatch{"x-id": {Kind: &meshv1.StringMatch_Regex{Regex: "[0-9a-f]{120}"}}}}},
			Route: []*meshv1.RouteDestination{dest("a", 0)}}}}, "spec.http[0].match[0].headers.x-id.regex"},
		"regex within Envoy's limit": {&meshv1.RouteRule{Hosts: []string{"a"}, Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "^/api/v[0-9]+/users/.*$"}}}},
			Route: []*meshv1.RouteDestination{dest("a", 0)}}}}, ""},
		"empty string match": {&meshv1.RouteRule{Hosts: []string{"a"}, Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{Headers: map[string]*meshv1.StringMatch{"x-user": {}}}},
			Route: []*meshv1.RouteDestination{dest("a", 0)}}}}, "spec.http[0].match[0].headers.x-user"},
		"subset twice":     {&meshv1.TrafficPolicy{Host: "a", Subsets: []*meshv1.Subset{{Name: "v1"}, {Name: "v1"}}}, "spec.subsets[1].name"},
		"policy no host":   {&meshv1.TrafficPolicy{}, "spec.host"},
		"scope bad host":   {&meshv1.Scope{Egress: []*meshv1.EgressListener{{Hosts: []string{"nonamespace"}}}}, "spec.egress[0].hosts[0]"},
		"scope valid host": {&meshv1.Scope{Egress: []*meshv1.EgressListener{{Hosts: []string{"./*", "istio-system/*"}}}}, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := Validate(tc.obj)
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a FieldError on %s", err, tc.wantField)
			}
			if fe.Field != tc.wantField || fe.Reason == "" {
				t.Errorf("error on %q (%s), want on %q", fe.Field, fe.Reason, tc.wantField)
			}
		})
	}
}

type refs struct {
	hosts     map[string]bool
	endpoints map[string][]*meshv1.Endpoint
}

func (r refs) KnownHost(h string) bool               { return r.hosts[h] }
func (r refs) Endpoints(h string) []*meshv1.Endpoint { return r.endpoints[h] }

func TestValidateRefs(t *testing.T) {
	known := refs{
		hosts: map[string]bool{"a.ns.svc.cluster.local": true, "*.example.com": true},
		endpoints: map[string][]*meshv1.Endpoint{"a.ns.svc.cluster.local": {
			{Address: "10.0.0.1", Labels: map[string]string{"version": "v1"}},
		}},
	}
	rr := func(host string) *meshv1.RouteRule {
		return &meshv1.RouteRule{Hosts: []string{"x"}, Http: []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: host}}}}}}
	}
	for host, ok := range map[string]bool{"a.ns.svc.cluster.local": true, "api.example.com": true, "deep.api.example.com": true, "b.ns.svc.cluster.local": false, "example.com": false} {
		err := ValidateRefs(rr(host), known)
		if (err == nil) != ok {
			t.Errorf("%s: err = %v, want known=%v", host, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "spec.http[0].route[0].destination.host") {
			t.Errorf("%s: error %q does not name the field", host, err)
		}
	}
	policy := func(host string, version string) *meshv1.TrafficPolicy {
		return &meshv1.TrafficPolicy{Host: host, Subsets: []*meshv1.Subset{{Name: "s", Labels: map[string]string{"version": version}}}}
	}
	if err := ValidateRefs(policy("a.ns.svc.cluster.local", "v1"), known); err != nil {
		t.Errorf("a subset selecting an endpoint: %v", err)
	}
	if err := ValidateRefs(policy("a.ns.svc.cluster.local", "v2"), known); err == nil || !strings.Contains(err.Error(), "spec.subsets[0].labels") {
		t.Errorf("a subset selecting nothing: %v, want an error on spec.subsets[0].labels", err)
	}
	if err := ValidateRefs(policy("elsewhere.example.org", "v2"), known); err != nil {
		t.Errorf("a policy for a service without endpoints here: %v", err)
	}
}

// TestDelegateRules: a VirtualService without hosts is a delegate: http
// routes only, no gateways, no further delegation; a route delegates or
// routes, not both.
func TestDelegateRules(t *testing.T) {
	to := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "a.example.com"}}}
	for name, tc := range map[string]struct {
		rule *meshv1.RouteRule
		want string
	}{
		"delegate":           {&meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to}}}, ""},
		"empty":              {&meshv1.RouteRule{}, "spec.hosts"},
		"delegate with tcp":  {&meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Route: to}}, Tcp: []*meshv1.L4Route{{Route: to}}}, "spec.hosts"},
		"delegate, gateways": {&meshv1.RouteRule{Gateways: []string{"gw"}, Http: []*meshv1.HTTPRoute{{Route: to}}}, "spec.gateways"},
		"two levels":         {&meshv1.RouteRule{Http: []*meshv1.HTTPRoute{{Delegate: &meshv1.Delegate{Name: "x"}}}}, "spec.http[0].delegate"},
		"delegates and routes": {&meshv1.RouteRule{Hosts: []string{"a.example.com"}, Http: []*meshv1.HTTPRoute{
			{Route: to, Delegate: &meshv1.Delegate{Name: "x"}}}}, "spec.http[0]"},
	} {
		err := Validate(tc.rule)
		var fe *FieldError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", name, err)
		case tc.want != "" && (!errors.As(err, &fe) || fe.Field != tc.want):
			t.Errorf("%s: %v, want an error on %s", name, err, tc.want)
		}
	}
}
