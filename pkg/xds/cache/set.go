package cache

import (
	"fmt"
	"hash/maphash"
	"sync"
)

// Watcher is told when something a set it watches holds may have changed.
// Notify is called with the table's lock held: it must only set a flag
// and wake its owner without blocking.
type Watcher interface {
	Notify()
}

// Fingerprint identifies a list of resource names regardless of order:
// the sum of the names' hashes and their count. Two subscriptions with the
// same fingerprint are taken to be the same set (the names are compared
// when a set is interned).
type Fingerprint struct {
	Sum uint64
	N   int
}

var seed = maphash.MakeSeed()

// Add adds one name, given as bytes (as decoded from a request).
func (f *Fingerprint) Add(name []byte) {
	f.Sum += maphash.Bytes(seed, name)
	f.N++
}

// AddString adds one name.
func (f *Fingerprint) AddString(name string) {
	f.Sum += maphash.String(seed, name)
	f.N++
}

// FingerprintOf returns the fingerprint of a list of names.
func FingerprintOf(names []string) Fingerprint {
	var f Fingerprint
	for _, n := range names {
		f.AddString(n)
	}
	return f
}

// Set is an interned subscription: the names a stream asks for, shared by
// every stream of the table that asks for the same ones, or the wildcard.
// Its names never change once interned.
type Set struct {
	table    *Table
	wildcard bool
	// except are namespaces a wildcard set made by AllBut does not hold.
	except   []string
	fp       Fingerprint
	names    map[string]struct{}
	bytes    int // see Bytes
	refs     int
	watchers map[Watcher]int // under table.mu; how many subscriptions each holds

	mu sync.Mutex
	// sum is the content sum of what the set holds at table version sumAt.
	sum, sumAt uint64
	summed     bool
	// bodies are encoded responses at the table version bodiesAt.
	bodies   map[bodyKey]Response
	bodiesAt uint64
}

// Has reports whether the set subscribes to a name.
func (s *Set) Has(name string) bool {
	if s.wildcard {
		for _, ns := range s.except {
			if len(name) > len(ns) && name[len(ns)] == '/' && name[:len(ns)] == ns {
				return false
			}
		}
		return true
	}
	_, ok := s.names[name]
	return ok
}

func (s *Set) holdsAny(names []string) bool {
	if len(names) > 4*len(s.names) {
		for n := range s.names {
			for _, m := range names {
				if n == m {
					return true
				}
			}
		}
		return false
	}
	for _, n := range names {
		if _, ok := s.names[n]; ok {
			return true
		}
	}
	return false
}

// AllBut returns a set to give a Request as Prev alone (it is not
// interned, nor watched): every name but those in the namespaces given
// (<namespace>/<name>, as Envoy names virtual hosts). A Delta stream that
// newly subscribes to a namespace is then sent what it holds, besides what
// changed.
func AllBut(namespaces []string) *Set { return &Set{wildcard: true, except: namespaces} }

// Subscribe returns the interned set of names (or the wildcard set) and
// has w notified of its changes. Every Subscribe (and Ref) is paired with
// an Unsubscribe of the set it returned. A new set holds the table's own
// string of each name a resource has, so that sets of many classes naming
// the same resources share their names, and names holds nothing after.
func (t *Table) Subscribe(w Watcher, names []string, wildcard bool) *Set {
	set := make(map[string]struct{}, len(names))
	t.mu.RLock()
	for _, n := range names {
		if e := t.entries[n]; e != nil {
			n = e.name
		}
		set[n] = struct{}{}
	}
	t.mu.RUnlock()
	return t.subscribe(w, set, wildcard)
}

// NameOverhead is what a name costs a set beside its bytes: its entry in
// the set's map and its string's header.
const NameOverhead = 32

// Bytes is what the set's names take: their bytes and NameOverhead each
// (none for the wildcard).
func (s *Set) Bytes() int { return s.bytes }

// Names returns the names the set holds (none for the wildcard).
func (s *Set) Names() []string {
	out := make([]string, 0, len(s.names))
	for n := range s.names {
		out = append(out, n)
	}
	return out
}

func (t *Table) subscribe(w Watcher, names map[string]struct{}, wildcard bool) *Set {
	t.mu.Lock()
	defer t.mu.Unlock()
	if wildcard {
		t.wild.watchers[w]++
		return t.wild
	}
	var fp Fingerprint
	bytes := 0
	for n := range names {
		fp.AddString(n)
		bytes += len(n) + NameOverhead
	}
	var s *Set
	for _, cand := range t.sets[fp] {
		if sameNames(cand.names, names) {
			s = cand
			break
		}
	}
	if s == nil {
		s = &Set{table: t, fp: fp, names: names, bytes: bytes, watchers: map[Watcher]int{}}
		t.sets[fp] = append(t.sets[fp], s)
	}
	s.refs++
	s.watchers[w]++
	return s
}

// SubscribeExisting subscribes w to the interned set whose names have
// fingerprint fp and are the n names each yields, without building a new
// set: a reconnecting fleet asks for sets that already exist. It returns
// nil when there is no such set (then Subscribe builds one).
func (t *Table) SubscribeExisting(w Watcher, fp Fingerprint, each func(yield func(name []byte) bool)) *Set {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, cand := range t.sets[fp] {
		if len(cand.names) != fp.N {
			continue
		}
		all := true
		each(func(name []byte) bool {
			_, all = cand.names[string(name)]
			return all
		})
		if all {
			cand.refs++
			cand.watchers[w]++
			return cand
		}
	}
	return nil
}

// Ref subscribes w once more to a set it already holds, to be paired
// with one more Unsubscribe.
func (t *Table) Ref(w Watcher, s *Set) *Set {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !s.wildcard {
		s.refs++
	}
	s.watchers[w]++
	return s
}

// Unsubscribe stops w watching s; a named set nobody uses is forgotten.
func (t *Table) Unsubscribe(w Watcher, s *Set) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.watchers[w]--; s.watchers[w] <= 0 {
		delete(s.watchers, w)
	}
	if s.wildcard {
		return
	}
	s.refs--
	if s.refs > 0 {
		return
	}
	list := t.sets[s.fp]
	for i, cand := range list {
		if cand == s {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(t.sets, s.fp)
	} else {
		t.sets[s.fp] = list
	}
}

func sameNames(a, b map[string]struct{}) bool {
	if len(a) != len(b) {
		return false
	}
	for n := range a {
		if _, ok := b[n]; !ok {
			return false
		}
	}
	return true
}

// contentSumLocked returns the sum of what the set holds at the table's
// version, from the log when the set's last sum is recent enough. It needs
// s.mu and the table's read lock.
func (s *Set) contentSumLocked() uint64 {
	t := s.table
	if s.wildcard {
		return t.sum
	}
	if s.summed && s.sumAt == t.version {
		return s.sum
	}
	if i, ok := t.sinceLocked(s.sumAt); s.summed && ok {
		for _, c := range t.log[i:] {
			if _, in := s.names[c.name]; in {
				s.sum += c.sum - c.old
			}
		}
	} else {
		s.sum = 0
		for n := range s.names {
			if e := t.entries[n]; e != nil {
				s.sum += e.sum
			}
		}
	}
	s.sumAt, s.summed = t.version, true
	return s.sum
}

// ContentVersion returns the version a SotW proxy holding exactly what
// the set names at the table's current version was sent, and that version.
func (s *Set) ContentVersion() (string, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.table.mu.RLock()
	defer s.table.mu.RUnlock()
	return contentVersion(s.contentSumLocked()), s.table.version
}

func contentVersion(sum uint64) string { return fmt.Sprintf("%016x", sum) }
