package patch

import (
	"cmp"
	"fmt"
	"hash/maphash"
	"slices"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
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
	// memo, if not nil, keeps merged clusters across sets.
	memo *Decoded
}

// Decoded keeps the decoded values of patches from one generation to the
// next, so that a patch is decoded once while it is unchanged (a changed
// EnvoyFilter is a new object), and the clusters merged with them, so
// that a cluster is merged once while it and its patches are unchanged.
// It is not for concurrent use: one goroutine owns it. Its zero value is
// ready; a nil one decodes and merges every time.
type Decoded struct {
	values kept[*meshv1.EnvoyPatch, decoded]
	// lists are the classes' lists of CLUSTER patches, by their hash;
	// merged the clusters merged, by the cluster given.
	lists  kept[uint64, []*patchList]
	merged kept[*cluster.Cluster, []mergedCluster]
}

type decoded struct {
	// located is the patch with its place in its EnvoyFilter.
	located *meshv1.EnvoyPatch
	value   proto.Message
	err     error
	// invalid says why a cluster MERGE's value is invalid in itself.
	invalid error
}

// patchList is a class's CLUSTER patches in order: one object while a
// Decoded sees the same list.
type patchList struct{ patches []*meshv1.EnvoyPatch }

// mergedCluster is a cluster merged with the patches of a list (and a
// kind of proxy), and the merges refused.
type mergedCluster struct {
	list     *patchList
	router   bool
	out      *cluster.Cluster
	refusals []Refusal
}

// kept is a map whose entries last while they are asked for: sweep
// forgets those not asked for since the sweep before last.
type kept[K comparable, V any] struct{ cur, next map[K]V }

func (k *kept[K, V]) get(key K) (V, bool) {
	if v, ok := k.next[key]; ok {
		return v, true
	}
	v, ok := k.cur[key]
	if ok {
		k.put(key, v)
	}
	return v, ok
}

func (k *kept[K, V]) put(key K, v V) {
	if k.next == nil {
		k.next = map[K]V{}
	}
	k.next[key] = v
}

func (k *kept[K, V]) sweep() { k.cur, k.next = k.next, nil }

func (k *kept[K, V]) len() int { return len(k.cur) + len(k.next) }

// decode returns a patch decoded, with its place (the i-th of its
// EnvoyFilter), once while it is asked for.
func (d *Decoded) decode(p *meshv1.EnvoyPatch, i int) decoded {
	if d == nil {
		return decodePatch(p, i)
	}
	e, ok := d.values.get(p)
	if !ok {
		e = decodePatch(p, i)
		d.values.put(p, e)
	}
	return e
}

func decodePatch(p *meshv1.EnvoyPatch, i int) decoded {
	e := decoded{located: withLocation(p, i)}
	e.value, e.err = envoypatch.Decode(p)
	if e.err == nil && p.ApplyTo == meshv1.EnvoyPatch_APPLY_TO_CLUSTER && p.Operation == meshv1.EnvoyPatch_OPERATION_MERGE {
		// A cluster's merges apply together (see Set.Clusters): one
		// whose value is invalid in itself is refused whole, as it
		// would be applied alone.
		e.invalid = envoypatch.ValidPart(e.value)
	}
	return e
}

// listOf returns the one object for a class's CLUSTER patches.
func (d *Decoded) listOf(patches []bound) *patchList {
	if d == nil {
		return nil
	}
	sum := hashPatches(patches)
	lists, _ := d.lists.get(sum)
	for _, l := range lists {
		if slices.EqualFunc(l.patches, patches, func(p *meshv1.EnvoyPatch, b bound) bool { return p == b.p }) {
			return l
		}
	}
	l := &patchList{}
	for _, b := range patches {
		l.patches = append(l.patches, b.p)
	}
	d.lists.put(sum, append(lists, l))
	return l
}

var seed = maphash.MakeSeed()

// hashPatches hashes a list of patches by their identity.
func hashPatches(patches []bound) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	for _, b := range patches {
		maphash.WriteComparable(&h, b.p)
	}
	return h.Sum64()
}

// mergedCluster returns what a cluster merged with a list's patches made
// before, if it was asked for since the sweep before last.
func (d *Decoded) mergedCluster(c *cluster.Cluster, list *patchList, router bool) (mergedCluster, bool) {
	if d == nil || list == nil {
		return mergedCluster{}, false
	}
	all, _ := d.merged.get(c)
	for _, m := range all {
		if m.list == list && m.router == router {
			return m, true
		}
	}
	return mergedCluster{}, false
}

func (d *Decoded) keepCluster(c *cluster.Cluster, m mergedCluster) {
	if d == nil || m.list == nil {
		return
	}
	all, _ := d.merged.get(c)
	d.merged.put(c, append(all, m))
}

// Sweep forgets the values and clusters not asked for since the Sweep
// before last. Call it after each generation.
func (d *Decoded) Sweep() {
	d.values.sweep()
	d.lists.sweep()
	d.merged.sweep()
}

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
	s := &Set{memo: d}
	for _, f := range sorted {
		name := f.Namespace + "/" + f.Name
		for i, p := range f.Spec.GetPatches() {
			if p.ProxyVersion != "" && !versions[p.ProxyVersion] {
				continue
			}
			e := d.decode(p, i)
			switch {
			case e.err != nil:
				s.refuse(bound{filter: name, p: e.located}, "any resource", e.err.Error())
			case e.invalid != nil:
				s.refuse(bound{filter: name, p: e.located}, "any cluster", "its value is invalid: "+e.invalid.Error())
			default:
				s.patches = append(s.patches, bound{filter: name, p: e.located, value: e.value})
			}
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
		_, s, _ = strings.Cut(name, "|")
		s, _, _ = strings.Cut(s, "|")
	case strings.HasPrefix(name, "http."), strings.HasPrefix(name, "https."):
		_, s, _ = strings.Cut(name, ".")
		s, _, _ = strings.Cut(s, ".")
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
