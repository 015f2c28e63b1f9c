package model

import (
	"cmp"
	"slices"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
)

// ByPrecedence orders a Gateway API route's HTTP rules as the API ranks
// their matches (and istiod sends them), each match a rule of its own:
// see ComparePrecedence. Equal ones keep their written order.
func ByPrecedence(in []*meshv1.HTTPRoute) []*meshv1.HTTPRoute {
	out := make([]*meshv1.HTTPRoute, 0, len(in))
	for _, h := range in {
		if len(h.Match) <= 1 {
			out = append(out, h)
			continue
		}
		for _, m := range h.Match {
			one := proto.CloneOf(h)
			one.Match = []*meshv1.HTTPMatch{m}
			out = append(out, one)
		}
	}
	SortByPrecedence(out, func(h *meshv1.HTTPRoute) *meshv1.HTTPRoute { return h })
	return out
}

// SortByPrecedence sorts things each holding one Gateway API HTTP rule
// (of one match or none) by ComparePrecedence, keeping equal ones in
// their order.
func SortByPrecedence[T any](s []T, rule func(T) *meshv1.HTTPRoute) {
	slices.SortStableFunc(s, func(a, b T) int { return ComparePrecedence(rule(a), rule(b)) })
}

// ComparePrecedence ranks two Gateway API HTTP rules of one match (or
// none) as the API does, the higher first: an exact path before a prefix
// before a regular expression, a longer path before a shorter, a method
// before none, more header matches, then more query matches, before
// fewer; a rule without matches after every other.
func ComparePrecedence(a, b *meshv1.HTTPRoute) int {
	if len(a.Match) == 0 || len(b.Match) == 0 {
		return cmp.Compare(len(b.Match), len(a.Match))
	}
	ma, mb := a.Match[0], b.Match[0]
	ka, la := pathRank(ma)
	kb, lb := pathRank(mb)
	return cmp.Or(cmp.Compare(kb, ka), cmp.Compare(lb, la),
		cmp.Compare(boolInt(mb.Method != nil), boolInt(ma.Method != nil)),
		cmp.Compare(len(mb.Headers), len(ma.Headers)), cmp.Compare(len(mb.QueryParams), len(ma.QueryParams)))
}

// pathRank is the kind of a match's path (exact 3, prefix 2, regular
// expression 1, none 0) and its length.
func pathRank(m *meshv1.HTTPMatch) (kind, length int) {
	switch u := m.GetUri().GetKind().(type) {
	case *meshv1.StringMatch_Exact:
		return 3, len(u.Exact)
	case *meshv1.StringMatch_Prefix:
		return 2, len(u.Prefix)
	case *meshv1.StringMatch_Regex:
		return 1, len(u.Regex)
	}
	return 0, 0
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
