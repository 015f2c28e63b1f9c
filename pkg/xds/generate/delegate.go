package generate

import (
	"maps"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
)

// delegateOf returns the VirtualService a route delegates to, if it
// exists and is a delegate (it has no hosts).
func (m *Mesh) delegateOf(h *meshv1.HTTPRoute) *Route {
	d := h.GetDelegate()
	if d == nil {
		return nil
	}
	i, found := slices.BinarySearchFunc(m.Routes, d, func(r *Route, d *meshv1.Delegate) int {
		if c := strings.Compare(r.Namespace, d.Namespace); c != 0 {
			return c
		}
		return strings.Compare(r.Name, d.Name)
	})
	if !found || len(m.Routes[i].Rule.Hosts) > 0 {
		return nil
	}
	return m.Routes[i]
}

// expand returns a rule's HTTP routes with each delegating route replaced
// by its delegate's routes, merged with it as Istio merges them: the
// delegate's matches within the root's (a match that conflicts with the
// root's is left out), and the root's timeout, retries, fault, mirror,
// rewrite, headers and CORS policy where the delegate's route sets none.
func (m *Mesh) expand(rule *meshv1.RouteRule) []*meshv1.HTTPRoute {
	if !slices.ContainsFunc(rule.Http, func(h *meshv1.HTTPRoute) bool { return h.Delegate != nil }) {
		return rule.Http
	}
	var out []*meshv1.HTTPRoute
	for _, root := range rule.Http {
		if root.Delegate == nil {
			out = append(out, root)
			continue
		}
		d := m.delegateOf(root)
		if d == nil {
			continue // no such delegate: nothing to route
		}
		for _, dh := range d.Rule.Http {
			matches, ok := mergeMatches(root.Match, dh.Match)
			if !ok {
				continue
			}
			merged := proto.CloneOf(dh)
			merged.Match = matches
			inherit(&merged.Timeout, root.Timeout)
			inherit(&merged.Retries, root.Retries)
			inherit(&merged.Fault, root.Fault)
			inherit(&merged.Mirror, root.Mirror)
			inherit(&merged.Rewrite, root.Rewrite)
			inherit(&merged.Headers, root.Headers)
			inherit(&merged.Cors, root.Cors)
			out = append(out, merged)
		}
	}
	return out
}

// inherit sets an unset setting of a delegate's route to the root's.
func inherit[T comparable](setting *T, root T) {
	var unset T
	if *setting == unset {
		*setting = root
	}
}

// mergeMatches combines a root route's matches with its delegate's: every
// pair that does not conflict; either list alone when the other is empty.
func mergeMatches(root, delegate []*meshv1.HTTPMatch) ([]*meshv1.HTTPMatch, bool) {
	switch {
	case len(root) == 0:
		return delegate, true
	case len(delegate) == 0:
		return root, true
	}
	var out []*meshv1.HTTPMatch
	for _, r := range root {
		for _, d := range delegate {
			if m, ok := mergeMatch(r, d); ok {
				out = append(out, m)
			}
		}
	}
	return out, len(out) > 0
}

// mergeMatch is the match of both r and d, or false when nothing can
// satisfy both: a delegate's path outside the root's, different methods,
// ports, source namespaces, or values of one header, query parameter or
// source label.
func mergeMatch(r, d *meshv1.HTTPMatch) (*meshv1.HTTPMatch, bool) {
	out := proto.CloneOf(d)
	switch {
	case r.Uri == nil:
	case d.Uri == nil:
		out.Uri = r.Uri
	case !uriWithin(d.Uri, r.Uri):
		return nil, false
	}
	if r.Method != nil {
		if d.Method != nil && !proto.Equal(r.Method, d.Method) {
			return nil, false
		}
		out.Method = r.Method
	}
	if r.Port != 0 {
		if d.Port != 0 && d.Port != r.Port {
			return nil, false
		}
		out.Port = r.Port
	}
	if r.SourceNamespace != "" {
		if d.SourceNamespace != "" && d.SourceNamespace != r.SourceNamespace {
			return nil, false
		}
		out.SourceNamespace = r.SourceNamespace
	}
	var ok bool
	if out.Headers, ok = unionMatches(r.Headers, d.Headers); !ok {
		return nil, false
	}
	if out.QueryParams, ok = unionMatches(r.QueryParams, d.QueryParams); !ok {
		return nil, false
	}
	if out.WithoutHeaders, ok = unionMatches(r.WithoutHeaders, d.WithoutHeaders); !ok {
		return nil, false
	}
	for k, v := range r.SourceLabels {
		if dv, set := d.SourceLabels[k]; set && dv != v {
			return nil, false
		}
		if out.SourceLabels == nil {
			out.SourceLabels = map[string]string{}
		}
		out.SourceLabels[k] = v
	}
	if len(r.Gateways) > 0 {
		out.Gateways = r.Gateways
	}
	out.IgnoreUriCase = r.IgnoreUriCase || d.IgnoreUriCase
	return out, true
}

// uriWithin reports whether every path d matches is one root matches: a
// delegate's exact path or prefix under the root's prefix, the root's
// exact path itself, or the same regex.
func uriWithin(d, root *meshv1.StringMatch) bool {
	switch r := root.Kind.(type) {
	case *meshv1.StringMatch_Prefix:
		switch v := d.Kind.(type) {
		case *meshv1.StringMatch_Prefix:
			return strings.HasPrefix(v.Prefix, r.Prefix)
		case *meshv1.StringMatch_Exact:
			return strings.HasPrefix(v.Exact, r.Prefix)
		}
	case *meshv1.StringMatch_Exact:
		v, ok := d.Kind.(*meshv1.StringMatch_Exact)
		return ok && v.Exact == r.Exact
	}
	return proto.Equal(d, root)
}

// unionMatches is both sets of named string matches, or false when they
// name one key differently.
func unionMatches(a, b map[string]*meshv1.StringMatch) (map[string]*meshv1.StringMatch, bool) {
	if len(a) == 0 {
		return b, true
	}
	out := maps.Clone(b)
	if out == nil {
		out = map[string]*meshv1.StringMatch{}
	}
	for k, v := range a {
		if w, set := out[k]; set && !proto.Equal(v, w) {
			return nil, false
		}
		out[k] = v
	}
	return out, true
}
