package classify

import (
	"reflect"
	"testing"

	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// TestClassKeys: every kind of class reads back from its key as it was.
func TestClassKeys(t *testing.T) {
	for key, want := range map[string]Class{
		"envoy":                          {Kind: "envoy"},
		"proxyless":                      {Kind: "proxyless"},
		"envoy/shop/":                    {Kind: "envoy", Namespace: "shop"},
		"envoy/~/default":                {Kind: "envoy", Namespace: Elsewhere, Sidecar: "default"},
		"proxyless/shop/narrow/p1,l:ab":  {Kind: "proxyless", Namespace: "shop", Sidecar: "narrow", Tags: []string{"p1", "l:ab"}},
		"envoy/shop//p1":                 {Kind: "envoy", Namespace: "shop", Tags: []string{"p1"}},
		"router/istio-system/gw,shop/gw": {Kind: Router, Gateways: []string{"istio-system/gw", "shop/gw"}},
		"router/":                        {Kind: Router, Gateways: []string{""}},
		"router/istio-system/gw;istio-system;e:~lua,t:logs": {Kind: Router, Gateways: []string{"istio-system/gw"}, Namespace: "istio-system",
			Tags: []string{"e:~lua", "t:logs"}},
		"router/;ingress;": {Kind: Router, Gateways: []string{""}, Namespace: "ingress"},
	} {
		got := ParseClass(cache.Class(key))
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ParseClass(%q) = %+v, want %+v", key, got, want)
		}
		if got.String() != key {
			t.Errorf("%+v.String() = %q, want %q", got, got.String(), key)
		}
	}
}
