package ingest

import (
	"fmt"
	"strconv"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// split splits the endpoints too large to store into chunks, and rejects
// every other object too large to store.
func (s *Syncer) split(objs []Object, problems []Problem) ([]Object, []Problem) {
	limit := s.cfg.MaxObjectSize
	var out []Object
	for i, o := range objs {
		size := proto.Size(o.Object)
		if size <= limit {
			if out != nil {
				out = append(out, o)
			}
			continue
		}
		if out == nil {
			out = append(make([]Object, 0, len(objs)+8), objs[:i]...)
		}
		tooLarge := func(what string, n int) {
			k := o.Key
			problems = append(problems, Problem{Location: o.Object.GetOrigin().GetLocation(), Resource: o.resource(), Keep: &k,
				Reason: fmt.Sprintf("%s is %d bytes encoded; the store and the bus take at most %d: split it", what, n, limit)})
		}
		eps, ok := o.Object.(*meshv1.Endpoints)
		if !ok {
			tooLarge("the object", size)
			continue
		}
		chunks, big := chunkEndpoints(o, eps, limit)
		if big >= 0 {
			tooLarge(fmt.Sprintf("endpoint %d (%s)", big, eps.Endpoints[big].GetAddress()), proto.Size(eps.Endpoints[big]))
			continue
		}
		out = append(out, chunks...)
	}
	if out == nil {
		return objs, problems
	}
	return out, problems
}

// chunkEndpoints splits a set of endpoints into objects below limit: the
// first keeps the key, the others are named "<key name>~<n>". It returns
// the index of an endpoint too large on its own, or -1.
func chunkEndpoints(o Object, eps *meshv1.Endpoints, limit int) ([]Object, int) {
	newChunk := func() *meshv1.Endpoints {
		return &meshv1.Endpoints{Origin: proto.Clone(eps.Origin).(*meshv1.Origin), Service: eps.Service, Shard: eps.Shard}
	}
	var out []Object
	cur := newChunk()
	base := proto.Size(cur)
	size := base
	flush := func() {
		k := o.Key
		if len(out) > 0 {
			k.Name += "~" + strconv.Itoa(len(out))
		}
		out = append(out, Object{Key: k, Object: cur, Resource: o.Resource})
		cur, size = newChunk(), base
	}
	for i, ep := range eps.Endpoints {
		n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(ep))
		if base+n > limit {
			return nil, i
		}
		if size+n > limit {
			flush()
		}
		cur.Endpoints = append(cur.Endpoints, ep)
		size += n
	}
	flush()
	return out, -1
}
