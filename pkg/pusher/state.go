package pusher

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// state is the pusher's copy of the mesh. Objects are never modified once
// stored, so a generation may read them without the lock.
type state struct {
	mu sync.Mutex
	// floor is the revision of the last full load: events at or below it
	// are already in objs.
	floor int64
	// rev is the highest revision applied.
	rev  int64
	objs map[model.Key]entry
	// tombstones remember the revision that deleted a key, so a replayed
	// older put does not bring it back.
	tombstones map[model.Key]int64
}

type entry struct {
	obj    model.Object
	modRev int64
}

func newState() *state {
	return &state{objs: map[model.Key]entry{}, tombstones: map[model.Key]int64{}}
}

// reset replaces the content with a full load at rev.
func (s *state) reset(items []model.Stored, rev int64) {
	objs := make(map[model.Key]entry, len(items))
	for _, it := range items {
		objs[it.Key] = entry{it.Object, it.ModRevision}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objs, s.tombstones, s.floor, s.rev = objs, map[model.Key]int64{}, rev, rev
}

// revision returns the highest revision applied.
func (s *state) revision() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rev
}

// apply applies a PUT or DELETE event. It reports whether the mesh changed;
// an event the state already reflects changes nothing. It also returns
// when the change was observed by its source, if the event says.
func (s *state) apply(k model.Key, ev *meshv1.ChangeEvent) (changed bool, observed time.Time, err error) {
	changed, obj, err := s.applyObject(k, ev)
	if obj != nil && obj.GetOrigin().GetObservedAt() != nil {
		observed = obj.GetOrigin().GetObservedAt().AsTime()
	}
	return changed, observed, err
}

func (s *state) applyObject(k model.Key, ev *meshv1.ChangeEvent) (bool, model.Object, error) {
	var obj model.Object
	if ev.Type == meshv1.ChangeEvent_TYPE_PUT {
		o, err := model.Decode(k, ev.Value)
		if err != nil {
			return false, nil, err
		}
		obj = o
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev.Revision <= s.floor {
		return false, nil, nil
	}
	if e, ok := s.objs[k]; ok && e.modRev >= ev.Revision {
		return false, nil, nil
	}
	if t, ok := s.tombstones[k]; ok && t >= ev.Revision {
		return false, nil, nil
	}
	s.rev = max(s.rev, ev.Revision)
	switch ev.Type {
	case meshv1.ChangeEvent_TYPE_PUT:
		s.objs[k] = entry{obj, ev.Revision}
		delete(s.tombstones, k)
	case meshv1.ChangeEvent_TYPE_DELETE:
		if _, ok := s.objs[k]; !ok {
			s.tombstones[k] = ev.Revision
			return false, nil, nil
		}
		delete(s.objs, k)
		s.tombstones[k] = ev.Revision
	}
	return true, obj, nil
}

// mesh builds the generators' view of the current content and returns the
// revision it reflects.
func (s *state) mesh() (*generate.Mesh, *classIndex, int64) {
	s.mu.Lock()
	type nsName struct{ ns, name string }
	services := map[nsName]*generate.Service{}
	type shardEps struct {
		shard  string
		eps    []*meshv1.Endpoint
		modRev int64
	}
	endpoints := map[nsName][]shardEps{}
	type keyedPolicy struct {
		key    model.Key
		policy *meshv1.TrafficPolicy
		modRev int64
	}
	serviceRev := map[nsName]int64{}
	var policies []keyedPolicy
	var routes []*generate.Route
	var scopes []scopeEntry
	var gateways []*generate.Gateway
	for k, e := range s.objs {
		switch o := e.obj.(type) {
		case *meshv1.Service:
			services[nsName{k.Namespace, k.Name}] = &generate.Service{Namespace: k.Namespace, Name: k.Name, Spec: o}
			serviceRev[nsName{k.Namespace, k.Name}] = e.modRev
		case *meshv1.Endpoints:
			id := nsName{k.Namespace, o.Service}
			endpoints[id] = append(endpoints[id], shardEps{o.Shard, o.Endpoints, e.modRev})
		case *meshv1.TrafficPolicy:
			policies = append(policies, keyedPolicy{k, o, e.modRev})
		case *meshv1.Scope:
			scopes = append(scopes, scopeEntry{namespace: k.Namespace, name: k.Name, scope: o})
		case *meshv1.Gateway:
			gateways = append(gateways, &generate.Gateway{Namespace: k.Namespace, Name: k.Name, Spec: o})
		case *meshv1.RouteRule:
			routes = append(routes, &generate.Route{Namespace: k.Namespace, Name: k.Name, Rule: o, Version: strconv.FormatInt(e.modRev, 10)})
		}
	}
	rev := s.rev
	s.mu.Unlock()

	// Services that share a host name — the same Service in several
	// clusters, a ServiceEntry beside a Service — share their endpoints.
	sharing := map[string][]nsName{}
	for id, svc := range services {
		for _, h := range svc.Spec.Hostnames {
			sharing[h] = append(sharing[h], id)
		}
	}
	byHost := map[string][]*generate.Service{}
	list := make([]*generate.Service, 0, len(services))
	for id, svc := range services {
		ids := map[nsName]bool{id: true}
		for _, h := range svc.Spec.Hostnames {
			for _, other := range sharing[h] {
				ids[other] = true
			}
		}
		var shards []shardEps
		for other := range ids {
			shards = append(shards, endpoints[other]...)
		}
		slices.SortFunc(shards, func(a, b shardEps) int { return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.modRev, b.modRev)) })
		// The version names every input by its store revision.
		var version strings.Builder
		fmt.Fprintf(&version, "s%d", serviceRev[id])
		for _, sh := range shards {
			fmt.Fprintf(&version, "e%d", sh.modRev)
		}
		svc.Version = version.String()
		svc.ConfigVersion = fmt.Sprintf("s%d", serviceRev[id])
		seen := map[string]bool{}
		for _, sh := range shards {
			for _, ep := range sh.eps {
				// One workload seen by two shards is one endpoint; grpc-go
				// rejects an assignment that lists it twice.
				if id := model.EndpointID(ep); !seen[id] {
					seen[id] = true
					svc.Endpoints = append(svc.Endpoints, ep)
				}
			}
		}
		for _, h := range svc.Spec.Hostnames {
			byHost[h] = append(byHost[h], svc)
		}
		list = append(list, svc)
	}
	// Where two policies name one host, the first by namespace and name wins.
	slices.SortFunc(policies, func(a, b keyedPolicy) int { return cmp.Compare(a.key.String(), b.key.String()) })
	for _, p := range policies {
		for _, svc := range byHost[p.policy.Host] {
			if svc.Policy == nil {
				svc.Policy = p.policy
				svc.Version += fmt.Sprintf("p%d", p.modRev)
				svc.ConfigVersion += fmt.Sprintf("p%d", p.modRev)
			}
		}
	}
	restricted := false
	for _, svc := range list {
		for _, ns := range svc.Spec.ExportTo {
			restricted = restricted || ns != "*"
		}
	}
	slices.SortFunc(gateways, func(a, b *generate.Gateway) int { return cmp.Compare(a.Key(), b.Key()) })
	m := generate.NewMesh(list, routes)
	m.Gateways = gateways
	return m, newClassIndex(scopes, restricted), rev
}

// MeshOf builds the generators' view of a set of stored objects, as a
// pusher does from its store: for tools that serve a mesh without one
// (the load test's snapshot-cache baseline).
func MeshOf(items []model.Stored) *generate.Mesh {
	s := newState()
	s.reset(items, 0)
	m, _, _ := s.mesh()
	return m
}
