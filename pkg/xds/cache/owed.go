package cache

import "sync/atomic"

// The backlog is what the streams owe the last generations: a unit for
// each watch notified of a change it has not answered yet, and one for
// each response in flight. The pusher holds the next generation while
// units hold it (Cache.Holding), up to its maximum hold. Every unit is
// held by one watch's Owed, so that a watch that goes, or a stream excused
// (behind: a proxy that does not answer), gives back exactly what it
// holds.
//
// The units of a watch sent a response in parts (apart: Delta load
// assignments or virtual hosts past the response limit) are in the
// backlog but hold nothing: its rest goes after each part's answer, and a
// change made meanwhile goes in the next part, ahead of that rest, so
// that holding the next generation for the rest would only delay what it
// brings, by the maximum hold at every generation for as long as a large
// change takes to reach the proxies.

// backlog is a cache's units: all of them (due), and those that hold the
// next generation (holding).
type backlog struct {
	due, holding atomic.Int64
}

// Owed is one watch's units of its cache's backlog. It is safe for
// concurrent use: a table's Notify adds under the table's lock, the
// stream's sender and handler drop, and the server excuses.
type Owed struct {
	// state is the units held (the low 32 bits) and, in the bit above,
	// whether the watch is apart: one word, so that each change of either
	// gives the backlog exactly its own difference.
	state atomic.Uint64
	b     *backlog // the cache's; nil: a table of no cache
}

const apartBit = 1 << 32

// NewOwed returns a watch's share of the backlog of t's cache, holding
// nothing.
func (t *Table) NewOwed() *Owed { return &Owed{b: t.backlog} }

// Add adds a unit, unless excused is set: its holder owes nothing while it
// is. One excused while the unit was added (see Excuse) gives it back.
func (o *Owed) Add(excused *atomic.Bool) {
	if excused.Load() {
		return
	}
	o.change(func(n uint64, apart bool) (uint64, bool) { return n + 1, apart })
	if excused.Load() {
		o.Drop() // excused meanwhile: Excuse gave back the others
	}
}

// Drop gives back a unit, if any is held.
func (o *Owed) Drop() {
	o.change(func(n uint64, apart bool) (uint64, bool) { return n - min(n, 1), apart })
}

// Excuse gives back every unit held.
func (o *Owed) Excuse() {
	o.change(func(_ uint64, apart bool) (uint64, bool) { return 0, apart })
}

// Apart says whether the watch's last response left a rest, to go in
// parts: while it does, its units hold no generation.
func (o *Owed) Apart(apart bool) {
	o.change(func(n uint64, _ bool) (uint64, bool) { return n, apart })
}

// Held returns how many units are held.
func (o *Owed) Held() int32 { return int32(o.state.Load() &^ apartBit) }

// change moves the state as next says, and gives the backlog the
// difference.
func (o *Owed) change(next func(n uint64, apart bool) (uint64, bool)) {
	for {
		old := o.state.Load()
		n, apart := next(old&^apartBit, old&apartBit != 0)
		s := n
		if apart {
			s |= apartBit
		}
		if s == old {
			return
		}
		if !o.state.CompareAndSwap(old, s) {
			continue
		}
		if o.b != nil {
			o.b.due.Add(int64(n) - int64(old&^apartBit))
			o.b.holding.Add(holding(s) - holding(old))
		}
		return
	}
}

// holding is the units of a state that hold the next generation.
func holding(state uint64) int64 {
	if state&apartBit != 0 {
		return 0
	}
	return int64(state)
}
