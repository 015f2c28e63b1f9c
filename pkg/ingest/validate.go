package ingest

import (
	"slices"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// validate de-duplicates the part's objects by key, checks the ones that
// changed on their own and against the hosts the mesh knows, stamps the
// source into the valid ones, and returns them, how many did not change,
// and the source's problems with every one found.
func (s *Syncer) validate(part []string, objs []Object, problems []Problem) (valid []Object, unchanged int, _ []Problem) {
	objs, problems = s.split(objs, problems)
	objs, problems = s.dedupe(part, objs, problems)
	// Services and endpoints first, so that what refers to them is checked
	// against the valid ones.
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(a, b Object) int {
		return slices.Index(model.Kinds, a.Key.Kind) - slices.Index(model.Kinds, b.Key.Kind)
	})
	for _, o := range ordered {
		if o.Object.GetOrigin() == nil {
			problems = append(problems, Problem{Location: o.Key.String(), Reason: "internal: object has no origin"})
			continue
		}
		o.Object.GetOrigin().Source = s.cfg.Source
		if h, ok := s.mine[o.Key]; ok && model.SameContent(h.obj, o.Object) {
			// Stored and checked when it was written: no round trip.
			s.ix.add(o.Key, h.obj)
			unchanged++
			continue
		}
		if err := model.ValidateKey(o.Key); err != nil {
			problems = append(problems, s.reject(o, err))
			continue
		}
		if err := model.Validate(o.Object); err != nil {
			problems = append(problems, s.reject(o, err))
			continue
		}
		if err := model.ValidateRefs(o.Object, s.ix); err != nil {
			problems = append(problems, s.reject(o, err))
			s.pending[o.Key] = o
			continue
		}
		s.ix.add(o.Key, o.Object)
		valid = append(valid, o)
	}
	return valid, unchanged, problems
}

// retry checks again the pending objects outside part, which a host or
// endpoint added since may have made valid, and returns those that are
// now, and their keys.
func (s *Syncer) retry(part []string) ([]Object, map[model.Key]bool) {
	var valid []Object
	fixed := map[model.Key]bool{}
	for k, o := range s.pending {
		if Covers(part, o.Object.GetOrigin().GetLocation()) || model.ValidateRefs(o.Object, s.ix) != nil {
			continue
		}
		delete(s.pending, k)
		if h, ok := s.mine[k]; ok {
			s.ix.remove(k, h.obj)
		}
		s.ix.add(k, o.Object)
		valid = append(valid, o)
		fixed[k] = true
	}
	return valid, fixed
}

// index is the part of the mesh cross-object validation looks at: which
// services define each host, and each service's endpoints by the key of
// the object that holds them.
type index struct {
	hosts     map[string]map[nsName]bool
	endpoints map[nsName]map[model.Key][]*meshv1.Endpoint
}

type nsName struct{ namespace, name string }

func newIndex() *index {
	return &index{hosts: map[string]map[nsName]bool{}, endpoints: map[nsName]map[model.Key][]*meshv1.Endpoint{}}
}

// add enters o under k; adding the same object twice is harmless.
func (ix *index) add(k model.Key, o model.Object) {
	switch o := o.(type) {
	case *meshv1.Service:
		for _, h := range o.Hostnames {
			if ix.hosts[h] == nil {
				ix.hosts[h] = map[nsName]bool{}
			}
			ix.hosts[h][nsName{k.Namespace, k.Name}] = true
		}
	case *meshv1.Endpoints:
		id := nsName{k.Namespace, o.Service}
		if ix.endpoints[id] == nil {
			ix.endpoints[id] = map[model.Key][]*meshv1.Endpoint{}
		}
		ix.endpoints[id][k] = o.Endpoints
	}
}

// remove takes o, entered under k, out.
func (ix *index) remove(k model.Key, o model.Object) {
	switch o := o.(type) {
	case *meshv1.Service:
		for _, h := range o.Hostnames {
			delete(ix.hosts[h], nsName{k.Namespace, k.Name})
			if len(ix.hosts[h]) == 0 {
				delete(ix.hosts, h)
			}
		}
	case *meshv1.Endpoints:
		id := nsName{k.Namespace, o.Service}
		delete(ix.endpoints[id], k)
		if len(ix.endpoints[id]) == 0 {
			delete(ix.endpoints, id)
		}
	}
}

func (ix *index) KnownHost(h string) bool {
	_, ok := ix.hosts[h]
	return ok
}

// Endpoints returns the endpoints of every service that defines h: the
// pusher merges them the same way.
func (ix *index) Endpoints(h string) []*meshv1.Endpoint {
	var out []*meshv1.Endpoint
	for id := range ix.hosts[h] {
		for _, eps := range ix.endpoints[id] {
			out = append(out, eps...)
		}
	}
	return out
}

// dedupe keeps one object per key: the one already in effect (same
// location as the stored object, or any stored object outside part),
// else the first. The others are reported; endpoints, which derive from a
// service, follow their service quietly.
func (s *Syncer) dedupe(part []string, objs []Object, problems []Problem) ([]Object, []Problem) {
	byKey := make(map[model.Key][]int, len(objs))
	for i, o := range objs {
		byKey[o.Key] = append(byKey[o.Key], i)
	}
	drop := map[int]bool{}
	for k, idx := range byKey {
		h, stored := s.mine[k]
		outside := stored && !Covers(part, h.location())
		if len(idx) < 2 && !outside {
			continue
		}
		winner, winnerAt := idx[0], objs[idx[0]].Object.GetOrigin().GetLocation()
		if stored {
			for _, i := range idx {
				if objs[i].Object.GetOrigin().GetLocation() == h.location() {
					winner, winnerAt = i, h.location()
					break
				}
			}
			if outside {
				winner, winnerAt = -1, h.location()
			}
		}
		for _, i := range idx {
			if i == winner {
				continue
			}
			drop[i] = true
			if k.Kind == model.KindEndpoints {
				continue
			}
			problems = append(problems, Problem{
				Location: objs[i].Object.GetOrigin().GetLocation(),
				Resource: objs[i].resource(),
				Field:    "metadata.name",
				Reason:   "another object with this kind, namespace and name is defined at " + winnerAt + "; this one is ignored",
			})
		}
	}
	if len(drop) == 0 {
		return objs, problems
	}
	out := make([]Object, 0, len(objs)-len(drop))
	for i, o := range objs {
		if !drop[i] {
			out = append(out, o)
		}
	}
	return out, problems
}

// Check returns the problems a source's sync would find in objs, beside
// the source's own problems, without a store: each object checked as Sync
// checks it, its references against the other objects given alone (a
// reference to what only the store holds is a problem here). It is what
// shardctl analyze -f reports before anything is applied.
func Check(source string, objs []Object, problems []Problem) []Problem {
	s := &Syncer{cfg: Config{Source: source, MaxObjectSize: MaxObjectSize}, mine: map[model.Key]held{},
		ix: newIndex(), pending: map[model.Key]Object{}, reported: map[string]bool{}}
	_, _, problems = s.validate(nil, objs, problems)
	return problems
}
