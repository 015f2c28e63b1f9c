package server

import (
	"slices"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// A stream's subscriptions to a shared type are held to its class's view
// (see Visibility). What a request asked for beyond the view is kept in
// the watch's asked, and subscribed to again when the view changes: a
// proxy may know a cluster before this replica's view of its class does
// (it moved from a replica ahead of this one, or asked for load
// assignments before the request that made its class here), and an Envoy
// does not ask again for what it asked for once.

// asked is a request the class's view left part of out.
type asked struct {
	// names are the names asked for, wildcard whether everything was.
	names    []string
	wildcard bool
	// view is the view they were held to.
	view *cache.View
	// bytes is what the names hold (see NameBudget).
	bytes int
}

// visibleLocked returns the class's view of w's type, nil when the type is
// not limited (or the cache does not tell).
func (st *stream) visibleLocked(w *watch) *cache.View {
	v, ok := st.srv.cfg.Cache.(Visibility)
	if !ok || w.typeURL != resource.EndpointType {
		return nil
	}
	class := st.class
	if class == "" {
		class = st.srv.cfg.Hooks.OnClassify(st.node)
	}
	return v.Visible(class, w.typeURL)
}

// allVisible reports whether the view holds every name a request names.
func allVisible(each func(yield func([]byte) bool), view *cache.View) bool {
	all := true
	each(func(name []byte) bool {
		all = view.Has(string(name))
		return all
	})
	return all
}

// keepVisibleLocked returns the names the view holds and records the
// request in w.asked when the view leaves part of it out (the wildcard
// always: the view may grow). count says the request is the proxy's own,
// whose left-out names are counted and logged.
func (st *stream) keepVisibleLocked(w *watch, view *cache.View, names []string, wildcard, count bool) []string {
	kept := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return !view.Has(n) })
	if dropped := len(names) - len(kept); dropped > 0 && count {
		st.srv.m.limited.WithLabelValues(limitVisible).Add(float64(dropped))
		st.srv.cfg.Log.Warn("a proxy asked for resources its class may not see; left out", "proxy", st.node.GetId(), "names", dropped)
	}
	w.asked = nil
	if wildcard || len(kept) < len(names) {
		w.asked = &asked{names: names, wildcard: wildcard, view: view, bytes: askedBytes(names)}
	}
	return kept
}

// explicitLocked returns the names a Delta watch subscribed to by name,
// those its class's view left out included.
func (w *watch) explicitLocked() []string {
	switch {
	case w.asked != nil:
		return slices.Clone(w.asked.names)
	case w.named != nil:
		return w.named.Names()
	}
	return nil
}

// subscribeDeltaLocked subscribes a Delta watch to the names it named and,
// with wildcard, to everything, as far as the view holds them.
func (st *stream) subscribeDeltaLocked(w *watch, view *cache.View, names []string, wildcard, count bool) {
	named := w.table.Subscribe(w, st.keepVisibleLocked(w, view, names, wildcard, count), false)
	if w.named != nil {
		w.table.Unsubscribe(w, w.named)
	}
	w.named, w.wildcard = named, wildcard
	if wildcard {
		st.subscribeLocked(w, w.table.Subscribe(w, view.Names(), false))
	} else {
		st.subscribeLocked(w, w.table.Ref(w, w.named))
	}
}

// reviewAskedLocked subscribes each watch whose request its class's view
// left part of out again, once the view changed: after every request (one
// may have made the class) and as clusters are about to be sent. A watch
// whose view did not change costs a comparison.
func (st *stream) reviewAskedLocked() {
	for _, w := range st.watches {
		if w.asked == nil || w.set == nil {
			continue
		}
		view := st.visibleLocked(w)
		if view == nil || view == w.asked.view {
			continue
		}
		a := w.asked
		if st.delta {
			st.subscribeDeltaLocked(w, view, a.names, a.wildcard, false)
		} else {
			names := st.keepVisibleLocked(w, view, a.names, a.wildcard, false)
			if a.wildcard {
				names = view.Names()
			}
			st.subscribeLocked(w, w.table.Subscribe(w, names, false))
		}
		w.Notify()
	}
}
