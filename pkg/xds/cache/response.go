package cache

import (
	"fmt"
	"slices"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Response is an encoded response a stream is to be sent, without its
// nonce (the server appends that). A zero Body means there is nothing to
// send; the stream is then at version To all the same.
type Response struct {
	Body []byte
	// Version is the SotW version_info (a content version), or the Delta
	// system_version_info.
	Version string
	// To is the table version the response brings the stream to.
	To uint64
	// Resources is how many resources it carries.
	Resources int
	// Rest are the names a Delta response left out past Request.Limit,
	// to ask for as Request.Owed once it is answered.
	Rest []string
	// msg is the message Body encodes, until it is encoded (see respond).
	msg proto.Message
}

// Empty reports whether there is nothing to send.
func (r Response) Empty() bool { return r.Body == nil }

// Request says what a stream holds and asks for.
type Request struct {
	// Set is what the stream subscribes to.
	Set *Set
	// From is the table version the stream was last brought to.
	From uint64
	// Fresh is set when the stream has not been answered since it
	// subscribed to Set: its first response, or one after its names changed.
	Fresh bool
	// Prev is the set the stream subscribed to before Set, when its names
	// changed: only what it newly asks for is sent with what changed.
	Prev *Set
	// Initial are the Delta resource versions a new stream says it holds.
	Initial map[string]string
	// Limit, when positive, bounds a Delta response's resources, in
	// encoded bytes: past it, the names left go in Response.Rest (at least
	// one resource is sent, whatever its size).
	Limit int
	// Owed are the names an earlier Delta response left out (its Rest):
	// sent after what changed since, so that the changes of a small
	// generation overtake what is left of a large one.
	Owed []string
}

// bodyKey names a response body a set caches: SotW or Delta, every
// resource or those changed since a version; the version it reaches is
// the set's bodiesAt.
type bodyKey struct {
	delta, since bool
	from         uint64
}

// SotW returns the response that brings a SotW stream from r.From to the
// table's current version. Listeners and clusters are sent whole; other
// types carry only the resources the stream lacks.
func (t *Table) SotW(r Request) (Response, error) { return t.respond(r, false) }

// Delta returns the response that brings a Delta stream from r.From to
// the table's current version: the resources it lacks, and the names it
// holds that are gone.
func (t *Table) Delta(r Request) (Response, error) { return t.respond(r, true) }

// respond returns the response a stream is sent. What it carries is read
// under the table's lock, and encoded after it: a response of thousands of
// resources takes long to encode, and the generator waiting for the lock
// to update the table held every other stream's response behind it. The
// resources' encodings never change once in the table, so the message
// holds what was read.
func (t *Table) respond(r Request, delta bool) (Response, error) {
	s := r.Set
	s.mu.Lock()
	defer s.mu.Unlock()
	resp, keep := t.readLocked(r, delta)
	if resp.msg != nil {
		var err error
		if resp.Body, err = proto.Marshal(resp.msg); err != nil {
			return Response{}, fmt.Errorf("cache: encode %s response: %w", t.typeURL, err)
		}
		resp.msg = nil
	}
	if keep != nil {
		// The set's bodies are of the version read: its lock held since.
		s.bodies[*keep] = resp
	}
	return resp, nil
}

// readLocked reads under the table's lock what respond encodes, and the
// key under which the set keeps the response for the other streams of the
// set at the same version (nil: not kept).
func (t *Table) readLocked(r Request, delta bool) (Response, *bodyKey) {
	s := r.Set
	t.mu.RLock()
	defer t.mu.RUnlock()
	switch {
	case delta && r.Initial != nil:
		return t.encodeFor(r, delta, t.initialLocked(s, r.Initial)), nil
	case r.Fresh && r.Prev != nil && (delta || !t.full):
		return t.encodeFor(r, delta, t.addedLocked(r.Prev, s, r.From, delta)), nil
	case !r.Fresh && r.From == t.version && len(r.Owed) == 0:
		return Response{To: t.version}, nil
	}
	key := bodyKey{delta: delta}
	var names []string
	if !r.Fresh {
		changed, ok := t.changedLocked(s, r.From)
		switch {
		case ok && len(changed) == 0 && len(r.Owed) == 0:
			return Response{To: t.version}, nil
		case ok && (delta || !t.full):
			key.since, key.from, names = true, r.From, changed
		case !ok && delta:
			// Its own to the stream's version (the removals it names):
			// not kept as the set's body.
			return t.encodeFor(r, delta, t.behindLocked(s, s, r.From, delta)), nil
		}
	}
	if len(r.Owed) == 0 {
		if body, ok := s.bodyLocked(key); ok {
			return body, nil
		}
	}
	if !key.since {
		names = t.namesLocked(s)
	}
	resp := t.encodeFor(r, delta, names)
	if len(r.Owed) == 0 && resp.Rest == nil {
		return resp, &key
	}
	return resp, nil
}

// encodeFor encodes the response that brings names to r's stream: a
// Delta one past r.Limit, or with names owed, in part (see partLocked).
func (t *Table) encodeFor(r Request, delta bool, names []string) Response {
	if delta && (len(r.Owed) > 0 || r.Limit > 0 && t.size > r.Limit && t.sizeOf(names...) > r.Limit) {
		return t.partLocked(r, names)
	}
	return t.encode(r.Set, delta, names)
}

// initialLocked returns the names a new Delta stream must be told of: those
// it holds at another version than the table's, and those it holds that
// are gone.
func (t *Table) initialLocked(s *Set, initial map[string]string) []string {
	var names []string
	for n := range initial {
		if t.entries[n] == nil && s.Has(n) {
			names = append(names, n)
		}
	}
	for _, n := range t.namesLocked(s) {
		if initial[n] != t.entries[n].version {
			names = append(names, n)
		}
	}
	return names
}

func (t *Table) encode(s *Set, delta bool, names []string) Response {
	if delta {
		held, gone := t.split(names)
		return t.encodeDelta(s, held, gone)
	}
	return t.encodeSotW(s, names)
}

// bodyLocked returns a cached body for the table's version, forgetting
// those of older versions.
func (s *Set) bodyLocked(k bodyKey) (Response, bool) {
	if s.bodiesAt != s.table.version || s.bodies == nil {
		s.bodies, s.bodiesAt = map[bodyKey]Response{}, s.table.version
		return Response{}, false
	}
	b, ok := s.bodies[k]
	return b, ok
}

// changedLocked returns the names of the set that changed after version
// from, once each, and whether the log reaches back that far.
func (t *Table) changedLocked(s *Set, from uint64) ([]string, bool) {
	i, ok := t.sinceLocked(from)
	if !ok {
		return nil, false
	}
	var out []string
	// Update logs a name once per version: only a range of several
	// versions can name one twice.
	var seen map[string]struct{}
	if i < len(t.log) && t.log[i].version != t.version {
		seen = map[string]struct{}{}
	}
	for _, c := range t.log[i:] {
		if !s.Has(c.name) {
			continue
		}
		if seen != nil {
			if _, dup := seen[c.name]; dup {
				continue
			}
			seen[c.name] = struct{}{}
		}
		out = append(out, c.name)
	}
	return out, true
}

// addedLocked returns the names s holds that prev did not, with the
// names of s that changed after from (see behindLocked when the log does
// not reach back that far).
func (t *Table) addedLocked(prev, s *Set, from uint64, delta bool) []string {
	changed, ok := t.changedLocked(s, from)
	if !ok {
		return t.behindLocked(s, prev, from, delta)
	}
	seen := map[string]struct{}{}
	for _, n := range changed {
		seen[n] = struct{}{}
	}
	add := func(n string) {
		if _, dup := seen[n]; !dup && !prev.Has(n) {
			seen[n] = struct{}{}
			changed = append(changed, n)
		}
	}
	if s.wildcard {
		for n := range t.entries {
			add(n)
		}
	} else {
		for n := range s.names {
			add(n)
		}
	}
	return changed
}

// behindLocked returns the names a stream at version from, which the log
// no longer reaches back to, is sent: every name of s, and, for a Delta
// stream, the names of held (what it subscribed to) removed since, as far
// as the table remembers them (Table.removed); a SotW stream's full
// response says what went by leaving it out.
func (t *Table) behindLocked(s, held *Set, from uint64, delta bool) []string {
	names := t.namesLocked(s)
	if !delta {
		return names
	}
	for n, v := range t.removed {
		if v > from && held.Has(n) {
			names = append(names, n)
		}
	}
	return names
}

// namesLocked returns the names of what the set holds that exist.
func (t *Table) namesLocked(s *Set) []string {
	var out []string
	if s.wildcard {
		out = make([]string, 0, len(t.entries))
		for n := range t.entries {
			out = append(out, n)
		}
		return out
	}
	for n := range s.names {
		if _, ok := t.entries[n]; ok {
			out = append(out, n)
		}
	}
	return out
}

// split divides names into those the table holds and those it does not.
func (t *Table) split(names []string) (held, gone []string) {
	for _, n := range names {
		if _, ok := t.entries[n]; ok {
			held = append(held, n)
		} else {
			gone = append(gone, n)
		}
	}
	return held, gone
}

// encodeSotW makes the SotW response carrying the named resources that
// exist, in name order, under the set's content version (encoded by
// respond).
func (t *Table) encodeSotW(s *Set, names []string) Response {
	held, _ := t.split(names)
	if len(held) == 0 && !t.full {
		return Response{To: t.version}
	}
	slices.Sort(held)
	msg := &discovery.DiscoveryResponse{TypeUrl: t.typeURL, VersionInfo: contentVersion(s.contentSumLocked())}
	msg.Resources = make([]*anypb.Any, 0, len(held))
	for _, n := range held {
		msg.Resources = append(msg.Resources, t.entries[n].any)
	}
	return Response{msg: msg, Version: msg.VersionInfo, To: t.version, Resources: len(held)}
}

// encodeDelta makes the Delta response carrying the named resources and
// removing the gone ones, in name order (encoded by respond).
func (t *Table) encodeDelta(s *Set, held, gone []string) Response {
	if len(held) == 0 && len(gone) == 0 {
		return Response{To: t.version}
	}
	slices.Sort(held)
	slices.Sort(gone)
	msg := &discovery.DeltaDiscoveryResponse{TypeUrl: t.typeURL, SystemVersionInfo: contentVersion(s.contentSumLocked()),
		RemovedResources: gone}
	msg.Resources = make([]*discovery.Resource, 0, len(held))
	for _, n := range held {
		e := t.entries[n]
		msg.Resources = append(msg.Resources, &discovery.Resource{Name: n, Version: e.version, Resource: e.any})
	}
	return Response{msg: msg, Version: msg.SystemVersionInfo, To: t.version, Resources: len(held)}
}

// partLocked returns a Delta response of names and the names owed (see
// Request.Owed), up to r.Limit, with the names left in its Rest. The names
// go smallest change first: those that changed since the stream's version
// in a table version that changed few names, then those of larger ones,
// then those owed, so that an endpoint or a route change made while
// thousands of services arrive goes out in the next response, not behind
// them.
func (t *Table) partLocked(r Request, names []string) Response {
	if !r.Fresh && r.Initial == nil {
		if batch := t.batchesLocked(r.From); batch != nil {
			slices.SortStableFunc(names, func(a, b string) int { return batch[a] - batch[b] })
		}
	}
	seen := make(map[string]struct{}, len(names)+len(r.Owed))
	for _, n := range names {
		seen[n] = struct{}{}
	}
	for _, n := range r.Owed {
		if _, dup := seen[n]; !dup && r.Set.Has(n) {
			seen[n] = struct{}{}
			names = append(names, n)
		}
	}
	cut, size := len(names), 0
	for i, n := range names {
		if size += t.sizeOf(n); r.Limit > 0 && size > r.Limit && i > 0 {
			cut = i
			break
		}
	}
	held, gone := t.split(names[:cut])
	resp := t.encodeDelta(r.Set, held, gone)
	if cut < len(names) {
		resp.Rest = slices.Clone(names[cut:])
	}
	return resp
}

// sizeOf is what names add to a Delta response: each resource's
// encoding, or its name alone when it is gone.
func (t *Table) sizeOf(names ...string) int {
	n := 0
	for _, name := range names {
		n += len(name) + 2
		if e := t.entries[name]; e != nil {
			n += e.size + len(e.version) + 14
		}
	}
	return n
}

// batchesLocked returns, for each name changed after version from, how
// many names the table version of its last change changed; nil when the
// log does not reach back that far.
func (t *Table) batchesLocked(from uint64) map[string]int {
	i, ok := t.sinceLocked(from)
	if !ok {
		return nil
	}
	per := map[uint64]int{}
	for _, c := range t.log[i:] {
		per[c.version]++
	}
	batch := map[string]int{}
	for _, c := range t.log[i:] {
		batch[c.name] = per[c.version] // the last change of a name counts
	}
	return batch
}
