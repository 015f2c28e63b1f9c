package cache

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	// The types the golden route configurations hold in Anys.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func host(name string, domains ...string) *route.VirtualHost {
	return &route.VirtualHost{Name: name, Domains: domains, Routes: []*route.Route{{
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: name}}}}}}
}

// TestValidatorChecksEachHostOnce: a route configuration is valid or not
// as its own Validate says; a virtual host found valid is not checked
// again while it lives, a new one is, and a freed one is forgotten.
func TestValidatorChecksEachHostOnce(t *testing.T) {
	v := newValidator()
	a, b := host("a", "a.example.com"), host("b", "b.example.com")
	rc := &route.RouteConfiguration{Name: "80", ValidateClusters: wrapperspb.Bool(false), VirtualHosts: []*route.VirtualHost{a, b}}
	if _, err := v.check(rc); err != nil || rc.Validate() != nil {
		t.Fatalf("a valid configuration: %v (its own Validate: %v)", err, rc.Validate())
	}
	if !v.valid(a) || !v.valid(b) {
		t.Fatal("the hosts found valid are not remembered")
	}
	bad := host("c") // no domain: Envoy's schema wants one
	next := &route.RouteConfiguration{Name: "80", VirtualHosts: []*route.VirtualHost{a, b, bad}}
	_, err := v.check(next)
	if err == nil || next.Validate() == nil || !strings.Contains(err.Error(), "VirtualHosts[2]") {
		t.Fatalf("a configuration with an invalid host: %v, want the third host named (its own Validate: %v)", err, next.Validate())
	}
	if v.valid(bad) {
		t.Error("an invalid host was remembered")
	}
	// The configuration's own fields are still checked.
	if _, err := v.check(&route.RouteConfiguration{Name: "80", VirtualHosts: []*route.VirtualHost{a},
		RequestHeadersToRemove: []string{"bad\nheader"}}); err == nil {
		t.Error("a configuration whose own field is invalid passed")
	}
	// A host nothing holds any more is forgotten.
	for range 100 {
		v.remember(host("gone", "gone.example.com"), nil)
	}
	deadline := time.Now().Add(10 * time.Second)
	for v.size() > 2 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if n := v.size(); n != 2 {
		t.Errorf("%d hosts remembered after the others were freed, want 2", n)
	}
	runtime.KeepAlive(a)
	runtime.KeepAlive(b)
}

// TestValidatorEncodesAsProto: a route configuration encoded from its
// hosts' kept encodings is byte for byte its deterministic encoding, with
// or without a name, with fields after the hosts, hosts found valid
// before or not, and none.
func TestValidatorEncodesAsProto(t *testing.T) {
	v := newValidator()
	a, b := host("a", "a.example.com", "a"), host("b", "b.example.com")
	b.RequestHeadersToAdd = []*core.HeaderValueOption{{Header: &core.HeaderValue{Key: "x-b", Value: "1"}}}
	for _, rc := range []*route.RouteConfiguration{
		{Name: "80", VirtualHosts: []*route.VirtualHost{a, b}},
		{VirtualHosts: []*route.VirtualHost{b, a, host("c", "c.example.com")}},
		{Name: "http.8080", ValidateClusters: wrapperspb.Bool(false), IgnorePortInHostMatching: true,
			InternalOnlyHeaders: []string{"x-internal"}, VirtualHosts: []*route.VirtualHost{a},
			ResponseHeadersToRemove: []string{"server"}, MaxDirectResponseBodySizeBytes: wrapperspb.UInt32(1024)},
		{Name: "empty", ValidateClusters: wrapperspb.Bool(true)},
		{},
	} {
		if _, err := v.check(rc); err != nil {
			t.Fatal(err)
		}
		got, err := v.encode(rc, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(rc)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%q: encoded as %x, want %x", rc.Name, got, want)
		}
	}
}

// TestValidatorEncodesGeneratedRoutes: the route configurations the
// generators' golden files hold encode byte for byte as proto does.
func TestValidatorEncodesGeneratedRoutes(t *testing.T) {
	files, _ := filepath.Glob("../generate/testdata/*routes*.json")
	if len(files) == 0 {
		t.Fatal("no golden route configurations")
	}
	v := newValidator()
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var raw []json.RawMessage
		if err := json.Unmarshal(b, &raw); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, r := range raw {
			rc := &route.RouteConfiguration{}
			if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(r, rc); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if _, err := v.check(rc); err != nil {
				t.Fatalf("%s %s: %v", f, rc.Name, err)
			}
			got, err := v.encode(rc, nil)
			if err != nil {
				t.Fatal(err)
			}
			want, _ := proto.MarshalOptions{Deterministic: true}.Marshal(rc)
			if !bytes.Equal(got, want) {
				t.Errorf("%s %s: encoded differently from proto", f, rc.Name)
			}
			n++
		}
	}
	t.Logf("%d route configurations from %d files", n, len(files))
}
