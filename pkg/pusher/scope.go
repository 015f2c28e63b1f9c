package pusher

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// ScopedLoader loads part of the store, every prefix at one revision (0:
// the current one); a pusher that serves some namespaces needs it.
type ScopedLoader interface {
	ListPrefixes(ctx context.Context, rev int64, prefixes ...string) (items []model.Stored, at int64, errs []error, err error)
}

// ScopedFeed follows the events of some subjects alone; a pusher that
// serves some namespaces needs it.
type ScopedFeed interface {
	ConsumeSubjects(ctx context.Context, fromSeq uint64, subjects []string, fn func(seq uint64, ev *meshv1.ChangeEvent) error) error
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

// scopePrefixes are the store prefixes of a scope: every kind but Sidecars
// and Gateways (loaded whole) in each of its namespaces.
func scopePrefixes(namespaces []string) []string {
	var out []string
	for _, k := range model.Kinds {
		if k == model.KindScope || k == model.KindGateway {
			continue
		}
		for _, ns := range namespaces {
			out = append(out, model.Prefix+string(k)+"/"+ns+"/")
		}
	}
	return out
}

// load reads what the pusher follows: everything, or for a pusher serving
// some namespaces, every Sidecar and Gateway first and then, at the same
// revision, what their scope needs. It returns the scope (nil: the whole
// mesh).
func (p *Pusher) load(ctx context.Context) (items []model.Stored, rev int64, scope []string, err error) {
	var errs []error
	defer func() {
		for _, e := range errs {
			p.cfg.Log.Warn("store holds an unreadable value; skipped", "err", e)
		}
	}()
	if len(p.cfg.Namespaces) == 0 {
		items, rev, errs, err = p.cfg.Loader.List(ctx)
		return items, rev, nil, err
	}
	loader := p.cfg.Loader.(ScopedLoader)
	items, rev, errs, err = loader.ListPrefixes(ctx, 0, model.Prefix+string(model.KindScope)+"/", model.Prefix+string(model.KindGateway)+"/")
	if err != nil {
		return nil, 0, nil, err
	}
	p.sidecars = map[model.Key]*meshv1.Scope{}
	for _, it := range items {
		if sc, ok := it.Object.(*meshv1.Scope); ok {
			p.sidecars[it.Key] = sc
		}
	}
	scope = scopeOf(p.cfg.Namespaces, p.state.b.RootNamespace, p.sidecars)
	prefixes := []string{model.Prefix}
	if scope != nil {
		prefixes = scopePrefixes(scope)
	}
	rest, _, more, err := loader.ListPrefixes(ctx, rev, prefixes...)
	errs = append(errs, more...)
	if err != nil {
		return nil, 0, nil, err
	}
	if scope == nil {
		return rest, rev, nil, nil // the whole mesh: the first read is in it
	}
	return append(items, rest...), rev, scope, nil
}

// rescope keeps the Sidecars current for a pusher serving some
// namespaces, and asks for a load when a Sidecar's change changes what
// its scope needs.
func (p *Pusher) rescope(k model.Key, ev *meshv1.ChangeEvent) error {
	if len(p.cfg.Namespaces) == 0 || k.Kind != model.KindScope {
		return nil
	}
	if ev.Type == meshv1.ChangeEvent_TYPE_DELETE {
		delete(p.sidecars, k)
	} else if o, err := model.Decode(k, ev.Value); err == nil {
		p.sidecars[k] = o.(*meshv1.Scope)
	}
	if next := scopeOf(p.cfg.Namespaces, p.state.b.RootNamespace, p.sidecars); !slices.Equal(next, p.scope) {
		return fmt.Errorf("%w: the namespaces in scope change from %v to %v (nil: all)", errReload, p.scope, next)
	}
	return nil
}
