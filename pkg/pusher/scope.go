package pusher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// ScopedLoader loads part of the store, every prefix at one revision (0:
// the current one); a pusher that serves some namespaces needs it.
type ScopedLoader interface {
	ListPrefixes(ctx context.Context, rev int64, prefixes ...string) (items []model.Stored, at int64, errs []error, err error)
}

// ScopedFeed follows the events of some namespaces alone (and those every
// namespace sees); a pusher that serves some namespaces needs it. How the
// feed carries them (the bus's subjects) is the feed's.
type ScopedFeed interface {
	ConsumeNamespaces(ctx context.Context, fromSeq uint64, namespaces []string, fn func(seq uint64, ev *meshv1.ChangeEvent) error) error
}

// scopeOf returns the namespaces whose objects the proxies of the
// namespaces served may see, as their Sidecars' egress hosts say ("./*" and
// "<ns>/<host>" name a namespace; the root namespace is always in), or nil
// when some of them may see every namespace: a workload without a Sidecar
// (neither its namespace's nor the root's default), a Sidecar without
// egress hosts, a "*/<host>" host.
func scopeOf(serve []string, root string, sidecars map[model.Key]*meshv1.Scope) []string {
	in := map[string]bool{root: true}
	for _, ns := range serve {
		in[ns] = true
		applies := sidecarsOf(ns, root, sidecars)
		if len(applies) == 0 {
			return nil
		}
		for _, sc := range applies {
			if len(sc.Egress) == 0 {
				return nil
			}
			for _, e := range sc.Egress {
				for _, h := range e.Hosts {
					hostNS, _, _ := strings.Cut(h, "/")
					switch hostNS {
					case "*":
						return nil
					case ".":
						in[ns] = true
					case "~":
					default:
						in[hostNS] = true
					}
				}
			}
		}
	}
	delete(in, "")
	return slices.Sorted(maps.Keys(in))
}

// sidecarsOf returns the Sidecars that may apply to a workload of a
// namespace: the namespace's, and the root namespace's default when the
// namespace has no default of its own; none when no workload has one.
func sidecarsOf(ns, root string, sidecars map[model.Key]*meshv1.Scope) []*meshv1.Scope {
	var out []*meshv1.Scope
	hasDefault := false
	var rootDefault *meshv1.Scope
	for _, k := range slices.SortedFunc(maps.Keys(sidecars), func(a, b model.Key) int { return strings.Compare(a.String(), b.String()) }) {
		sc := sidecars[k]
		switch {
		case k.Namespace == ns:
			out = append(out, sc)
			hasDefault = hasDefault || len(sc.WorkloadSelector) == 0
		case k.Namespace == root && len(sc.WorkloadSelector) == 0:
			rootDefault = sc
		}
	}
	if !hasDefault {
		if rootDefault == nil {
			return nil // some workloads may have no Sidecar at all
		}
		out = append(out, rootDefault)
	}
	return out
}

// scopePrefixes are the store prefixes of a scope: every kind but the
// mesh-wide ones (loaded whole) in each of its namespaces.
func scopePrefixes(namespaces []string) []string {
	var out []string
	for _, k := range model.Kinds {
		if model.MeshWide(k) {
			continue
		}
		for _, ns := range namespaces {
			out = append(out, model.Prefix+string(k)+"/"+ns+"/")
		}
	}
	return out
}

// load reads what the pusher follows: everything, or for a pusher serving
// some namespaces, every object of the mesh-wide kinds first and then, at the same
// revision, what their scope needs. It returns the scope (nil: the whole
// mesh) and the Sidecars that decide it.
func (p *Pusher) load(ctx context.Context) (items []model.Stored, rev int64, scope []string, sidecars map[model.Key]*meshv1.Scope, err error) {
	var errs []error
	defer func() {
		for _, e := range errs {
			p.cfg.Log.Warn("store holds an unreadable value; skipped", "err", e)
		}
	}()
	p.served.loading()
	serve, scoped := p.Placement()
	if p.cfg.ScopeByProxies {
		serve = p.served.wanted()
	}
	if !scoped {
		items, rev, errs, err = p.cfg.Loader.List(ctx)
		return items, rev, nil, nil, err
	}
	loader := p.cfg.Loader.(ScopedLoader)
	var whole []string
	for _, k := range model.Kinds {
		if model.MeshWide(k) {
			whole = append(whole, model.Prefix+string(k)+"/")
		}
	}
	items, rev, errs, err = loader.ListPrefixes(ctx, 0, whole...)
	if err != nil {
		return nil, 0, nil, nil, err
	}
	sidecars = map[model.Key]*meshv1.Scope{}
	for _, it := range items {
		if sc, ok := it.Object.(*meshv1.Scope); ok {
			sidecars[it.Key] = sc
		}
	}
	scope = scopeOf(serve, p.root, sidecars)
	p.served.loaded(serve, scope == nil)
	prefixes := []string{model.Prefix}
	if scope != nil {
		prefixes = scopePrefixes(scope)
	}
	rest, _, more, err := loader.ListPrefixes(ctx, rev, prefixes...)
	errs = append(errs, more...)
	if err != nil {
		return nil, 0, nil, nil, err
	}
	if scope == nil {
		return rest, rev, nil, sidecars, nil // the whole mesh: the first read is in it
	}
	return append(items, rest...), rev, scope, sidecars, nil
}

// Placement returns the namespaces placed on the pusher, and whether it
// serves some namespaces (of those, or of its proxies') rather than the
// whole mesh.
func (p *Pusher) Placement() (namespaces []string, scoped bool) {
	p.placement.mu.Lock()
	defer p.placement.mu.Unlock()
	return p.placement.namespaces, len(p.placement.namespaces) > 0 || p.cfg.Placed || p.cfg.ScopeByProxies
}

// Serves says whether the proxies of a namespace are served: every one's
// unless the pusher has a placement (Namespaces or Placed).
func (p *Pusher) Serves(namespace string) bool {
	p.placement.mu.Lock()
	defer p.placement.mu.Unlock()
	return (len(p.placement.namespaces) == 0 && !p.cfg.Placed) || slices.Contains(p.placement.namespaces, namespace)
}

// noteDrained says whether a placed pusher's placement names no namespace.
func (p *Pusher) noteDrained() {
	namespaces, _ := p.Placement()
	drained := 0.0
	if p.cfg.Placed && len(namespaces) == 0 {
		drained = 1
	}
	p.m.drained.Set(drained)
}

// Place changes the namespaces served by a pusher whose Config says Placed
// (a shard given namespaces or relieved of some): what their scope needs
// is loaded again when they differ. The server's streams of proxies of
// namespaces no longer served are the caller's to end.
func (p *Pusher) Place(namespaces []string) error {
	if !p.cfg.Placed {
		return errors.New("pusher: a placement changes only on a pusher configured as placed")
	}
	next := slices.Compact(slices.Sorted(slices.Values(namespaces)))
	p.placement.mu.Lock()
	same := slices.Equal(next, p.placement.namespaces)
	p.placement.namespaces = next
	p.placement.mu.Unlock()
	p.noteDrained()
	if same {
		return nil
	}
	p.cfg.Log.Info("the namespaces served change", "namespaces", next)
	if !p.cfg.ScopeByProxies {
		p.served.askReload()
	}
	return nil
}

// rescope keeps the Sidecars current for a pusher serving some
// namespaces, and asks for a load when a Sidecar's change changes what
// its scope needs.
func (p *Pusher) rescope(k model.Key, obj model.Object) error {
	if k.Kind != model.KindScope {
		return nil
	}
	serve, scoped := p.Placement()
	if !scoped {
		return nil
	}
	if sc, ok := obj.(*meshv1.Scope); ok {
		p.sidecars[k] = sc
	} else {
		delete(p.sidecars, k) // deleted
	}
	if p.cfg.ScopeByProxies {
		serve = p.served.loadedNamespaces()
	}
	if next := scopeOf(serve, p.root, p.sidecars); !slices.Equal(next, p.scope) {
		return fmt.Errorf("%w: the namespaces in scope change from %v to %v (nil: all)", errReload, p.scope, next)
	}
	return nil
}

// served tracks, for a pusher that serves the namespaces of the proxies
// connected, the proxies of each namespace, what the last load served, and
// how to ask for another.
type served struct {
	mu sync.Mutex
	// proxies counts the streams of each namespace wanted; idle says
	// since when a namespace has had none.
	proxies map[string]int
	idle    map[string]time.Time
	// done are the namespaces the last load served; whole says it loaded
	// the whole mesh (every namespace is served).
	done  map[string]bool
	whole bool
	// reloads asks the follow goroutine for a load (one asked at most):
	// what the last load served is no longer what is wanted. A load takes
	// the asks made before it read what is wanted.
	reloads chan struct{}
}

// askReload asks for a load: it ends the pass of follow under way, if any.
func (s *served) askReload() {
	select {
	case s.reloads <- struct{}{}:
	default:
	}
}

// loading takes the asks for a load made so far: the load about to read
// what is wanted answers them.
func (s *served) loading() {
	select {
	case <-s.reloads:
	default:
	}
}

// wanted returns the namespaces to serve, in order.
func (s *served) wanted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.proxies))
}

// loaded records what a load served.
func (s *served) loaded(namespaces []string, whole bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.done, s.whole = map[string]bool{}, whole
	for _, ns := range namespaces {
		s.done[ns] = true
	}
}

func (s *served) loadedNamespaces() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.done))
}

// ErrLoadingScope is returned by Admit for a proxy whose namespace's scope
// is being loaded: it is to retry.
var ErrLoadingScope = errors.New("pusher: loading what the proxy's namespace sees")

// Admit counts a proxy of a namespace in, for a pusher serving the
// namespaces of its proxies: nil when what the namespace sees is loaded,
// else ErrLoadingScope, having asked for a load with it. Every Admit is
// matched by a Left when the proxy goes.
func (p *Pusher) Admit(namespace string) error {
	if !p.cfg.ScopeByProxies {
		return nil
	}
	s := &p.served
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proxies == nil {
		s.proxies, s.idle = map[string]int{}, map[string]time.Time{}
	}
	_, known := s.proxies[namespace]
	s.proxies[namespace]++
	delete(s.idle, namespace)
	if s.done[namespace] || (s.whole && s.done != nil) {
		return nil
	}
	if !known {
		p.cfg.Log.Info("a proxy of a namespace not served yet: loading what it sees", "namespace", namespace)
		s.askReload()
	}
	return ErrLoadingScope
}

// Left counts a proxy Admit counted in out.
func (p *Pusher) Left(namespace string) {
	if !p.cfg.ScopeByProxies {
		return
	}
	s := &p.served
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proxies[namespace]--; s.proxies[namespace] <= 0 {
		s.proxies[namespace] = 0
		s.idle[namespace] = time.Now()
	}
}

// expire stops serving the namespaces without a proxy for grace, loading
// again without them.
func (s *served) expire(ctx context.Context, grace time.Duration) {
	tick := time.NewTicker(max(grace/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s.mu.Lock()
			dropped := false
			for ns, since := range s.idle {
				if now.Sub(since) >= grace {
					delete(s.idle, ns)
					delete(s.proxies, ns)
					dropped = dropped || s.done[ns]
				}
			}
			if dropped {
				s.askReload()
			}
			s.mu.Unlock()
		}
	}
}
