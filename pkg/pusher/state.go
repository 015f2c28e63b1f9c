package pusher

import (
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/classify"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// state is the pusher's copy of the mesh, the owner's alone (owner.go).
// Objects are never modified once stored: a view built from it stays true
// while later changes are applied (between the classes of a long
// generation).
type state struct {
	// floor is the revision of the last full load: events at or below it
	// are already held.
	floor int64
	// rev is the highest revision applied.
	rev int64
	b   *meshbuild.Builder
	// tombstones remember the revision that deleted a key, so a replayed
	// older put does not bring it back.
	tombstones map[model.Key]int64
	// index is the classes' index of the last build that joined everything.
	index *classify.Index
	// indexOpts tune every index.
	indexOpts []classify.Option
}

// meshSettings are the mesh-wide settings every build carries (see
// generate.Mesh).
type meshSettings struct {
	noAutoMTLS, agentCertificates bool
	trustDomain                   string
	overrides                     *meshv1.MeshConfig
}

// newState returns an empty state; root, when set, is the mesh's root
// namespace.
func newState(root string, ms meshSettings, opts ...classify.Option) *state {
	b := meshbuild.New()
	if root != "" {
		b.RootNamespace = root
	}
	b.NoAutoMTLS, b.TrustDomain, b.AgentCertificates, b.Overrides = ms.noAutoMTLS, ms.trustDomain, ms.agentCertificates, ms.overrides
	return &state{b: b, tombstones: map[model.Key]int64{}, indexOpts: opts}
}

// reset replaces the content with a full load at rev.
func (s *state) reset(items []model.Stored, rev int64) {
	s.b.Reset(items)
	s.tombstones, s.floor, s.rev = map[model.Key]int64{}, rev, rev
}

// apply applies a PUT or DELETE event, a PUT's value decoded to obj. It
// reports whether the mesh changed (an event the state already reflects
// changes nothing).
func (s *state) apply(k model.Key, ev *meshv1.ChangeEvent, obj model.Object) bool {
	if ev.Revision <= s.floor {
		return false
	}
	if e, ok := s.b.Get(k); ok && e.ModRev >= ev.Revision {
		return false
	}
	if t, ok := s.tombstones[k]; ok && t >= ev.Revision {
		return false
	}
	s.rev = max(s.rev, ev.Revision)
	switch ev.Type {
	case meshv1.ChangeEvent_TYPE_PUT:
		s.b.Set(k, meshbuild.Entry{Object: obj, ModRev: ev.Revision})
		delete(s.tombstones, k)
	case meshv1.ChangeEvent_TYPE_DELETE:
		s.tombstones[k] = ev.Revision
		if _, ok := s.b.Get(k); !ok {
			return false
		}
		s.b.Delete(k)
	}
	return true
}

// mesh returns the generators' view of the current content (see
// meshbuild.Builder.Build), the classes' index, and the revision it
// reflects.
func (s *state) mesh() (*meshbuild.Built, *classify.Index, int64) {
	built := s.b.Build()
	if built.Changed == nil || s.index == nil {
		s.index = classify.NewIndex(built, s.indexOpts...)
	}
	return built, s.index, s.rev
}

// meshRoutes returns the last view with the route rules changed since put
// in place, ahead of the join the other changes wait for (see
// meshbuild.Builder.BuildRoutes); false when there is none to make.
func (s *state) meshRoutes() (*meshbuild.Built, bool) { return s.b.BuildRoutes() }

// meshEndpoints returns the last view with the endpoint changes applied
// since (see meshbuild.Builder.BuildEndpoints), and the revision it
// reflects: the highest applied when nothing else waits, else 0 (the
// revision of the last full view stands). It reports false when the
// endpoint changes need a full view.
func (s *state) meshEndpoints() (*meshbuild.Built, int64, bool) {
	built, ok := s.b.BuildEndpoints()
	if !ok {
		return nil, 0, false
	}
	if s.b.Pending() {
		return built, 0, true
	}
	return built, s.rev, true
}
