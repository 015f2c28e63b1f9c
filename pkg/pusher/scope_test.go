package pusher

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// TestScopeOf: the namespaces a shard's proxies may see are theirs, the
// root's and those their Sidecars' egress hosts name; without a Sidecar
// for every workload, or with a "*/" host, the whole mesh (nil).
func TestScopeOf(t *testing.T) {
	type sc struct {
		key   model.Key
		scope *meshv1.Scope
	}
	sidecar := func(ns, name string, selector map[string]string, hosts ...string) sc {
		return sc{model.Key{Kind: model.KindScope, Namespace: ns, Name: name},
			&meshv1.Scope{WorkloadSelector: selector, Egress: []*meshv1.EgressListener{{Hosts: hosts}}}}
	}
	set := func(list ...sc) map[model.Key]*meshv1.Scope {
		out := map[model.Key]*meshv1.Scope{}
		for _, s := range list {
			out[s.key] = s.scope
		}
		return out
	}
	for name, tc := range map[string]struct {
		serve    []string
		sidecars map[model.Key]*meshv1.Scope
		want     []string
	}{
		"no Sidecar":            {[]string{"a"}, nil, nil},
		"own and shared":        {[]string{"a"}, set(sidecar("a", "default", nil, "./*", "shared/*")), []string{"a", "istio-system", "shared"}},
		"a wildcard namespace":  {[]string{"a"}, set(sidecar("a", "default", nil, "./*", "*/api.example.com")), nil},
		"only for some":         {[]string{"a"}, set(sidecar("a", "web", map[string]string{"app": "web"}, "./*")), nil},
		"the root's default":    {[]string{"a", "b"}, set(sidecar("istio-system", "default", nil, "./*", "shared/*")), []string{"a", "b", "istio-system", "shared"}},
		"a selector beside it":  {[]string{"a"}, set(sidecar("a", "web", map[string]string{"app": "web"}, "pay/*"), sidecar("istio-system", "default", nil, "./*")), []string{"a", "istio-system", "pay"}},
		"another shard's names": {[]string{"a"}, set(sidecar("a", "default", nil, "./*"), sidecar("b", "default", nil, "c/*")), []string{"a", "istio-system"}},
	} {
		if got := scopeOf(tc.serve, "istio-system", tc.sidecars); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

// TestServedNamespaces: the first proxy of a namespace is told to retry and
// asks for a load once; once loaded, its proxies are admitted; a
// namespace without proxies for the grace period asks for a load without it.
func TestServedNamespaces(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &Pusher{cfg: Config{ScopeByProxies: true, Log: slog.New(slog.DiscardHandler)}}
		p.served.reloads = make(chan struct{}, 1)
		asked := func() bool { return len(p.served.reloads) == 1 }
		if err := p.Admit("a"); !errors.Is(err, ErrLoadingScope) || !asked() {
			t.Fatalf("first proxy: %v, load asked %v; want ErrLoadingScope and a load", err, asked())
		}
		p.served.loading() // the load begins
		if err := p.Admit("a"); !errors.Is(err, ErrLoadingScope) || asked() {
			t.Fatalf("second proxy while loading: %v, load asked %v; want ErrLoadingScope, no other load", err, asked())
		}
		p.Left("a")
		p.Left("a")
		p.served.loaded(p.served.wanted(), false)
		if err := p.Admit("a"); err != nil {
			t.Fatalf("after the load: %v", err)
		}
		p.Left("a")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go p.served.expire(ctx, time.Minute)
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if !asked() || len(p.served.wanted()) != 0 {
			t.Errorf("after the grace period: load asked %v, wanted %v; want a second load, none wanted", asked(), p.served.wanted())
		}
	})
}
