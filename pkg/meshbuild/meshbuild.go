package meshbuild

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/proto"
)

// Entry is a stored object and the store revision that last wrote it.
type Entry struct {
	Object model.Object
	ModRev int64
}

// Scope is one Sidecar, as classification reads it.
type Scope struct {
	Namespace, Name string
	Spec            *meshv1.Scope
}

// Built is the result of a build.
type Built struct {
	Mesh   *generate.Mesh
	Scopes []Scope
	// RootNamespace is the mesh's root namespace: its Sidecar without a
	// selector is the default of the namespaces without one.
	RootNamespace string
	// Restricted says some service limits who may see it (exportTo).
	Restricted bool
	// Settings is the mesh's MeshConfig as stored (nil: none), before the
	// builder's overrides.
	Settings *meshv1.MeshConfig
	// Changed lists the services rebuilt when only endpoints changed since
	// the previous build (empty, not nil, when nothing did); it is nil when
	// everything was joined again.
	Changed []*generate.Service
	// Rerouted is, when route rules changed since the previous build and
	// nothing else did but endpoints, the rules that changed, which change
	// nothing but virtual hosts (generate.Rerouted.Local); nil when none
	// did, or everything was joined again.
	Rerouted *generate.Rerouted
}

// Builder holds the mesh's objects and what changed since the last
// build. It is not safe for concurrent use; the views it returns are never
// modified, and may be read by any goroutine.
type Builder struct {
	// RootNamespace is the mesh's root namespace, whose security policies
	// apply to every namespace (generate.DefaultRootNamespace by default).
	RootNamespace string
	// NoAutoMTLS, TrustDomain and AgentCertificates are the mesh's (see
	// generate.Mesh); NoAutoMTLS turns automatic mutual TLS off whatever
	// the mesh's settings say.
	NoAutoMTLS        bool
	TrustDomain       string
	AgentCertificates bool
	// Overrides are settings that win over the mesh's (its MeshConfig
	// object): the fields they set (see proto.Merge).
	Overrides *meshv1.MeshConfig
	objs      map[model.Key]Entry
	// shards finds each service's endpoint objects.
	shards map[id]map[model.Key]bool
	// Since the last build: the services whose endpoints changed, and
	// whether anything else did.
	endpoints map[id]bool
	rejoin    bool
	// rerouted holds the route rules changed since the last build, when
	// nothing else but endpoints did (see Built.Rerouted).
	rerouted map[model.Key]bool
	// endpointsJoin is set when an endpoint change itself needs a join
	// (those of a service whose clusters hold its endpoints).
	endpointsJoin bool
	// From the last build.
	last    *Built
	joined  map[id]*joined
	sharing map[string][]id // host → the services that define it
	// peerModes are the modes of the PeerAuthentications without a
	// selector: by namespace, and the mesh's (the root namespace's).
	peerModes map[string]meshv1.MTLSMode
	meshPeers meshv1.MTLSMode
	// peerSelectors are the PeerAuthentications with a selector, by
	// namespace, ordered by name.
	peerSelectors map[string][]*generate.Policy
}

type id struct{ namespace, name string }

// joined is a service of the last build and the revisions of its inputs
// other than endpoints.
type joined struct {
	svc        *generate.Service
	serviceRev int64
	policyRev  int64 // 0: no policy
}

// New returns an empty Builder.
func New() *Builder {
	return &Builder{RootNamespace: generate.DefaultRootNamespace, objs: map[model.Key]Entry{}, shards: map[id]map[model.Key]bool{}, rejoin: true}
}

// Reset replaces every object.
func (b *Builder) Reset(items []model.Stored) {
	b.objs = make(map[model.Key]Entry, len(items))
	b.shards = map[id]map[model.Key]bool{}
	for _, it := range items {
		b.Set(it.Key, Entry{it.Object, it.ModRevision})
	}
	b.rejoin = true
}

// Get returns the object under k.
func (b *Builder) Get(k model.Key) (Entry, bool) {
	e, ok := b.objs[k]
	return e, ok
}

// Len returns how many objects the builder holds.
func (b *Builder) Len() int { return len(b.objs) }

// Set stores an object under k.
func (b *Builder) Set(k model.Key, e Entry) {
	b.forget(k)
	b.objs[k] = e
	if eps, ok := e.Object.(*meshv1.Endpoints); ok {
		svc := id{k.Namespace, eps.Service}
		if b.shards[svc] == nil {
			b.shards[svc] = map[model.Key]bool{}
		}
		b.shards[svc][k] = true
		b.touch(svc)
		return
	}
	b.changed(k)
}

// changed notes a change of the object under k other than an endpoint
// change: a route rule's is noted apart, any other's asks for a join.
func (b *Builder) changed(k model.Key) {
	if k.Kind != model.KindRouteRule {
		b.rejoin = true
		return
	}
	if b.rerouted == nil {
		b.rerouted = map[model.Key]bool{}
	}
	b.rerouted[k] = true
}

// Delete removes the object under k.
func (b *Builder) Delete(k model.Key) {
	if _, ok := b.objs[k]; !ok {
		return
	}
	b.forget(k)
	delete(b.objs, k)
}

// forget takes the object under k out of the indexes, noting the change.
func (b *Builder) forget(k model.Key) {
	old, ok := b.objs[k]
	if !ok {
		return
	}
	eps, ok := old.Object.(*meshv1.Endpoints)
	if !ok {
		b.changed(k)
		return
	}
	svc := id{k.Namespace, eps.Service}
	delete(b.shards[svc], k)
	if len(b.shards[svc]) == 0 {
		delete(b.shards, svc)
	}
	b.touch(svc)
}

func (b *Builder) touch(svc id) {
	// A DNS service's clusters hold its endpoints: a change of them is a
	// change of the service, for a join.
	if e, ok := b.objs[model.Key{Kind: model.KindService, Namespace: svc.namespace, Name: svc.name}]; ok {
		if s, ok := e.Object.(*meshv1.Service); ok && generate.ResolvesNames(s) {
			b.rejoin, b.endpointsJoin = true, true
		}
	}
	if b.endpoints == nil {
		b.endpoints = map[id]bool{}
	}
	b.endpoints[svc] = true
}

// Build returns the view of the objects held now: the previous view with
// the services whose endpoints changed rebuilt (none when nothing changed)
// when only endpoints changed, else a new join.
func (b *Builder) Build() *Built {
	switch {
	case b.rejoin || b.last == nil:
		b.join()
	default:
		b.update()
		if len(b.rerouted) > 0 {
			if next, ok := b.reroute(); ok {
				b.last = next
			} else {
				b.join()
			}
		}
	}
	b.endpoints, b.rejoin, b.endpointsJoin, b.rerouted = nil, false, false, nil
	return b.last
}

// Pending reports whether changes other than endpoint changes wait for
// the next Build.
func (b *Builder) Pending() bool { return b.rejoin || b.last == nil || len(b.rerouted) > 0 }

// BuildRoutes returns the last view with the route rules changed since
// put in its place (noted in Built.Rerouted), leaving every other change
// for the next Build: route changes can go out while a join waits. It
// reports false, and changes nothing, when there is no last view, no
// route rule changed, nothing else waits (Build puts them in place then),
// or they change more than virtual hosts (they wait for the join).
func (b *Builder) BuildRoutes() (*Built, bool) {
	if b.last == nil || len(b.rerouted) == 0 || !b.rejoin {
		return nil, false
	}
	next, ok := b.reroute()
	if !ok {
		return nil, false
	}
	next.Changed = []*generate.Service{}
	b.last, b.rerouted = next, nil
	return b.last, true
}

// reroute returns the last view with the route rules changed since the
// last build in its place, noted in Built.Rerouted; false when they
// change more than virtual hosts (generate.Rerouted.Local), which a join
// must bring.
func (b *Builder) reroute() (*Built, bool) {
	from := b.last.Mesh
	c := &generate.Rerouted{From: from}
	routes := slices.DeleteFunc(slices.Clone(from.Routes), func(r *generate.Route) bool {
		if b.rerouted[model.Key{Kind: model.KindRouteRule, Namespace: r.Namespace, Name: r.Name}] {
			c.Before = append(c.Before, r)
			return true
		}
		return false
	})
	for _, k := range slices.SortedFunc(maps.Keys(b.rerouted), func(a, b model.Key) int { return cmp.Compare(a.String(), b.String()) }) {
		if e, ok := b.objs[k]; ok {
			if r, ok := routeOf(k, e); ok {
				c.After = append(c.After, r)
				routes = append(routes, r)
			}
		}
	}
	next := *b.last
	next.Mesh = from.WithRoutes(routes)
	next.Rerouted = c
	return &next, c.Local(next.Mesh)
}

// BuildEndpoints returns the previous view with the services whose
// endpoints changed rebuilt, leaving every other change for the next
// Build: load assignments can go out while a join waits. It reports false,
// and changes nothing, when there is no previous view or an endpoint
// change needs a join itself.
func (b *Builder) BuildEndpoints() (*Built, bool) {
	if b.last == nil || b.endpointsJoin {
		return nil, false
	}
	b.update()
	b.endpoints = nil
	return b.last, true
}

// settings are the mesh's settings in effect: those stored, with the
// overrides, and automatic mutual TLS on unless either says otherwise.
func (b *Builder) settings(stored *meshv1.MeshConfig) *meshv1.MeshConfig {
	out := &meshv1.MeshConfig{}
	if stored != nil {
		out = proto.CloneOf(stored)
	}
	if b.Overrides != nil {
		proto.Merge(out, b.Overrides)
	}
	if out.EnableAutoMtls == nil {
		out.EnableAutoMtls = proto.Bool(true)
	}
	return out
}

// update rebuilds the services whose endpoints changed, and those sharing
// a host with them.
func (b *Builder) update() {
	affected := map[id]bool{}
	for svc := range b.endpoints {
		j := b.joined[svc]
		if j == nil {
			continue // endpoints of no service: nothing sees them
		}
		for _, h := range j.svc.Spec.Hostnames {
			for _, other := range b.sharing[h] {
				affected[other] = true
			}
		}
	}
	changed := make([]*generate.Service, 0, len(affected))
	for _, svc := range slices.SortedFunc(maps.Keys(affected), func(a, b id) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name))
	}) {
		j := b.joined[svc]
		j.svc = b.withEndpoints(svc, j)
		changed = append(changed, j.svc)
	}
	next := *b.last
	if len(changed) > 0 {
		next.Mesh = b.last.Mesh.WithServices(changed)
	}
	next.Changed, next.Rerouted = changed, nil
	b.last = &next
}

// withEndpoints returns a copy of a joined service with the endpoints of
// every service sharing one of its hosts, merged, and its versions.
func (b *Builder) withEndpoints(svc id, j *joined) *generate.Service {
	type shard struct {
		name   string
		eps    []*meshv1.Endpoint
		modRev int64
	}
	ids := map[id]bool{svc: true}
	for _, h := range j.svc.Spec.Hostnames {
		for _, other := range b.sharing[h] {
			ids[other] = true
		}
	}
	var shards []shard
	for other := range ids {
		for k := range b.shards[other] {
			e := b.objs[k]
			eps := e.Object.(*meshv1.Endpoints)
			shards = append(shards, shard{eps.Shard, eps.Endpoints, e.ModRev})
		}
	}
	slices.SortFunc(shards, func(a, b shard) int { return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.modRev, b.modRev)) })
	out := &generate.Service{Namespace: j.svc.Namespace, Name: j.svc.Name, Spec: j.svc.Spec, Policy: j.svc.Policy, PolicyName: j.svc.PolicyName}
	// The versions name every input by its store revision.
	var config strings.Builder
	config.WriteString("s" + strconv.FormatInt(j.serviceRev, 10))
	if j.policyRev != 0 {
		config.WriteString("p" + strconv.FormatInt(j.policyRev, 10))
	}
	out.ConfigVersion = config.String()
	var version strings.Builder
	version.WriteString("s" + strconv.FormatInt(j.serviceRev, 10))
	for _, sh := range shards {
		version.WriteString("e" + strconv.FormatInt(sh.modRev, 10))
	}
	if j.policyRev != 0 {
		version.WriteString("p" + strconv.FormatInt(j.policyRev, 10))
	}
	out.Version = version.String()
	if generate.ResolvesNames(out.Spec) {
		// Its clusters hold its endpoints.
		out.ConfigVersion = out.Version
	}
	seen := map[string]bool{}
	for _, sh := range shards {
		for _, ep := range sh.eps {
			// One workload seen by two shards is one endpoint; grpc-go
			// rejects an assignment that lists it twice.
			if key := model.EndpointID(ep); !seen[key] {
				seen[key] = true
				out.Endpoints = append(out.Endpoints, ep)
			}
		}
	}
	// Its clusters name its workloads' identities, and whether they take
	// mutual TLS.
	if out.ServiceAccounts = generate.ServiceAccounts(out.Endpoints); len(out.ServiceAccounts) > 0 {
		out.ConfigVersion += "a" + strings.Join(out.ServiceAccounts, ",")
	}
	if out.Spec.GetHeadless() && generate.AllSidecars(out.Endpoints) {
		// A headless service's clusters speak mutual TLS when every one
		// of its workloads has a sidecar.
		out.ConfigVersion += "m"
	}
	// The namespace's (or the mesh's) mode decides its clusters, as
	// istiod has it; each workload's policy, its endpoints.
	out.PlaintextPeers = cmp.Or(b.peerModes[out.Namespace], b.meshPeers) == meshv1.MTLSMode_MTLS_MODE_DISABLE
	out.PlaintextDefault = out.PlaintextPeers
	if out.PlaintextPeers {
		// Its clusters and its load assignments change.
		out.ConfigVersion += "d"
		out.Version += "d"
	}
	for _, p := range b.peerSelectors[out.Namespace] {
		pa := p.Spec.(*meshv1.PeerAuthentication)
		if slices.ContainsFunc(out.Endpoints, func(ep *meshv1.Endpoint) bool { return model.Selects(pa.Selector, ep.Labels) }) {
			// Its load assignments follow the policy.
			out.PeerPolicies = append(out.PeerPolicies, pa)
			out.Version += "q" + p.Version
		}
	}
	return out
}

// peerSelectors returns the PeerAuthentications with a selector, by
// namespace and ordered by name: each workload's first decides whether
// its clients' automatic mutual TLS reaches it, as istiod has it.
func peerSelectors(security []*generate.Policy) map[string][]*generate.Policy {
	out := map[string][]*generate.Policy{}
	for _, p := range security {
		if pa, ok := p.Spec.(*meshv1.PeerAuthentication); ok && len(pa.Selector) > 0 {
			out[p.Namespace] = append(out[p.Namespace], p)
		}
	}
	for _, list := range out {
		slices.SortFunc(list, func(a, b *generate.Policy) int { return cmp.Compare(a.Name, b.Name) })
	}
	return out
}

// peerModes returns the modes of the PeerAuthentications without a
// selector, by namespace, and the mesh's: a namespace's services take
// plaintext alone when its own, or without one the mesh's, is DISABLE
// (policies with a selector decide for their workloads' endpoints, see
// peerSelectors).
func peerModes(security []*generate.Policy) (map[string]meshv1.MTLSMode, meshv1.MTLSMode) {
	var mesh meshv1.MTLSMode
	ns := map[string]meshv1.MTLSMode{}
	for _, p := range security {
		pa, ok := p.Spec.(*meshv1.PeerAuthentication)
		if !ok || len(pa.Selector) > 0 || pa.Mode == meshv1.MTLSMode_MTLS_MODE_UNSET {
			continue
		}
		if p.Root {
			mesh = pa.Mode
		} else {
			ns[p.Namespace] = pa.Mode
		}
	}
	return ns, mesh
}

// MeshOf builds the view of a set of stored objects at once: for tools
// that serve a mesh without following the store (the load test's
// snapshot-cache baseline).
func MeshOf(items []model.Stored) *generate.Mesh {
	b := New()
	b.Reset(items)
	return b.Build().Mesh
}
