package patch

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/envoypatch"
	"google.golang.org/protobuf/proto"
)

// Filter is one EnvoyFilter as the generators see it.
type Filter struct {
	Namespace, Name string
	Spec            *meshv1.EnvoyFilter
	// Root says it is in the mesh's root namespace: it applies before the
	// namespace's own.
	Root bool
}

// Refusal is a patch not applied to a resource, and why.
type Refusal struct {
	// Filter is the EnvoyFilter's "<namespace>/<name>", Patch the patch's
	// place in it (spec.configPatches[2]).
	Filter, Patch string
	// Resource names what it was to patch ("cluster outbound|80||a.b").
	Resource string
	Reason   string
}

func (r Refusal) String() string {
	return fmt.Sprintf("EnvoyFilter %s %s: not applied to %s: %s", r.Filter, r.Patch, r.Resource, r.Reason)
}

// bound is one patch with its decoded value.
type bound struct {
	filter string
	p      *meshv1.EnvoyPatch
	value  proto.Message
}

// Set is the patches that apply to one class of Envoys, in the order
// they apply. Apply its methods to the class's generated resources; it
// gathers the refusals.
type Set struct {
	patches  []bound
	refusals []Refusal
}

// Decoded keeps the decoded values of patches from one generation to the
// next, so that a patch is decoded once while it is unchanged (a changed
// EnvoyFilter is a new object). It is not for concurrent use: one
// goroutine owns it. Its zero value is ready; a nil one decodes every
// time.
type Decoded struct {
	cur, next map[*meshv1.EnvoyPatch]decoded
}

type decoded struct {
	value proto.Message
	err   error
}

// decode returns a patch's value, decoded once while it is asked for.
func (d *Decoded) decode(p *meshv1.EnvoyPatch) (proto.Message, error) {
	if d == nil {
		return envoypatch.Decode(p)
	}
	e, ok := d.next[p]
	if !ok {
		if e, ok = d.cur[p]; !ok {
			e.value, e.err = envoypatch.Decode(p)
		}
		if d.next == nil {
			d.next = map[*meshv1.EnvoyPatch]decoded{}
		}
		d.next[p] = e
	}
	return e.value, e.err
}

// Sweep forgets the patches not asked for since the Sweep before last.
func (d *Decoded) Sweep() { d.cur, d.next = d.next, nil }

// NewSet orders the EnvoyFilters that apply to a class as Istio does (the
// root namespace's first, then by priority, then by name) and keeps the
// patches whose proxy version pattern, if any, the class's proxies match
// (versions says which patterns they match). A patch whose value cannot
// be decoded is refused here.
func NewSet(filters []*Filter, versions map[string]bool) *Set {
	var d *Decoded
	return d.NewSet(filters, versions)
}

// NewSet is the package's NewSet, with the values d holds (the values are
// shared: the patches never modify them).
func (d *Decoded) NewSet(filters []*Filter, versions map[string]bool) *Set {
	sorted := slices.Clone(filters)
	slices.SortStableFunc(sorted, func(a, b *Filter) int {
		if a.Root != b.Root {
			if a.Root {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(a.Spec.GetPriority(), b.Spec.GetPriority()), cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	s := &Set{}
	for _, f := range sorted {
		name := f.Namespace + "/" + f.Name
		for i, p := range f.Spec.GetPatches() {
			if p.ProxyVersion != "" && !versions[p.ProxyVersion] {
				continue
			}
			v, err := d.decode(p)
			if err != nil {
				s.refuse(bound{filter: name, p: withLocation(p, i)}, "any resource", err.Error())
				continue
			}
			s.patches = append(s.patches, bound{filter: name, p: withLocation(p, i), value: v})
		}
	}
	return s
}

func withLocation(p *meshv1.EnvoyPatch, i int) *meshv1.EnvoyPatch {
	if p.Location != "" {
		return p
	}
	out := proto.CloneOf(p)
	out.Location = "spec.configPatches[" + strconv.Itoa(i) + "]"
	return out
}

// Empty reports whether no patch applies.
func (s *Set) Empty() bool { return s == nil || len(s.patches) == 0 }

// Refusals are the patches not applied so far, and why.
func (s *Set) Refusals() []Refusal {
	if s == nil {
		return nil
	}
	return s.refusals
}

func (s *Set) refuse(b bound, resource, reason string) {
	s.refusals = append(s.refusals, Refusal{Filter: b.filter, Patch: b.p.Location, Resource: resource, Reason: reason})
}

// of returns the patches of the kinds given.
func (s *Set) of(kinds ...meshv1.EnvoyPatch_ApplyTo) []bound {
	if s == nil {
		return nil
	}
	var out []bound
	for _, b := range s.patches {
		if slices.Contains(kinds, b.p.ApplyTo) {
			out = append(out, b)
		}
	}
	return out
}

// contextMatches reports whether a patch's context takes a resource of a
// gateway (router) or of a sidecar's inbound or outbound side.
func contextMatches(c meshv1.EnvoyPatch_Context, router, inbound bool) bool {
	switch c {
	case meshv1.EnvoyPatch_CONTEXT_GATEWAY:
		return router
	case meshv1.EnvoyPatch_CONTEXT_SIDECAR_INBOUND:
		return !router && inbound
	case meshv1.EnvoyPatch_CONTEXT_SIDECAR_OUTBOUND:
		return !router && !inbound
	}
	return true
}

// addContext reports whether an ADD of a whole resource applies to a
// kind of proxy: a gateway's context to routers, a sidecar's to sidecars.
func addContext(c meshv1.EnvoyPatch_Context, router bool) bool {
	switch c {
	case meshv1.EnvoyPatch_CONTEXT_GATEWAY:
		return router
	case meshv1.EnvoyPatch_CONTEXT_SIDECAR_INBOUND, meshv1.EnvoyPatch_CONTEXT_SIDECAR_OUTBOUND:
		return !router
	}
	return true
}

// added returns a class's resources with the one an ADD patch brings (a
// clone: the patch's value is shared, and was checked at ingest), unless
// the patch's context is not the proxy's, or a resource of its name is
// there already (refused: Envoy would reject the pair).
func added[R interface {
	proto.Message
	GetName() string
}](s *Set, b bound, kind string, out []R, router bool) []R {
	if !addContext(b.p.Context, router) {
		return out
	}
	add := b.value.(R)
	if slices.ContainsFunc(out, func(r R) bool { return r.GetName() == add.GetName() }) {
		s.refuse(b, kind+" "+add.GetName(), "a "+kind+" of this name is generated already")
		return out
	}
	return append(out, proto.CloneOf(add))
}

// inserted puts v before the element at i (after it, with after), as
// Istio's INSERT_BEFORE and INSERT_AFTER do: where the patch names
// nothing (named false), first (last); where what it names is absent
// (i < 0), nowhere.
func inserted[F any](list []F, v F, i int, named, after bool) []F {
	switch {
	case !named && after:
		return append(list, v)
	case !named:
		return slices.Insert(list, 0, v)
	case i < 0:
		return list
	case after:
		return slices.Insert(list, i+1, v)
	}
	return slices.Insert(list, i, v)
}

// patched applies one patch to a clone of a resource and returns the clone
// if it is valid; else the resource itself, with the patch refused.
func patched[M proto.Message](s *Set, b bound, resource string, in M, apply func(M) error) M {
	out := proto.CloneOf(in)
	if err := apply(out); err != nil {
		s.refuse(b, resource, err.Error())
		return in
	}
	if err := envoypatch.Valid(out); err != nil {
		s.refuse(b, resource, "the result would be invalid: "+err.Error())
		return in
	}
	return out
}

// portOf reads the port of a name of Istio's forms: "<port>",
// "http.<port>", "https.<port>.<...>", "inbound|<port>|...",
// "outbound|<port>|...", "<host>:<port>".
func portOf(name string) uint32 {
	var s string
	switch {
	case strings.HasPrefix(name, "inbound|"), strings.HasPrefix(name, "outbound|"):
		s = strings.Split(name, "|")[1]
	case strings.HasPrefix(name, "http."), strings.HasPrefix(name, "https."):
		s = strings.Split(name, ".")[1]
	case strings.Contains(name, ":"):
		s = name[strings.LastIndex(name, ":")+1:]
	default:
		s = name
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0
	}
	return uint32(n)
}
