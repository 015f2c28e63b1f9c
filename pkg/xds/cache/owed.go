package cache

import "sync/atomic"

// The backlog is what the streams owe the last generations: a unit for
// each watch notified of a change it has not answered yet, and one for
// each response in flight. The pusher holds the next generation while it
// is above 0 (Cache.Backlog), up to its maximum hold. Every unit is held
// by one watch's Owed, so that a watch that goes, or a stream excused
// (behind: a proxy that does not answer), gives back exactly what it
// holds.

// Owed is one watch's units of its cache's backlog. It is safe for
// concurrent use: a table's Notify adds under the table's lock, the
// stream's sender and handler drop, and the server excuses.
type Owed struct {
	n   atomic.Int32
	due *atomic.Int64 // the cache's backlog; nil: a table of no cache
}

// NewOwed returns a watch's share of the backlog of t's cache, holding
// nothing.
func (t *Table) NewOwed() *Owed { return &Owed{due: t.due} }

// Add adds a unit, unless excused is set: its holder owes nothing while it
// is. One excused while the unit was added (see Excuse) gives it back.
func (o *Owed) Add(excused *atomic.Bool) {
	if excused.Load() {
		return
	}
	o.n.Add(1)
	o.backlog(1)
	if excused.Load() {
		o.Drop() // excused meanwhile: Excuse gave back the others
	}
}

// Drop gives back a unit, if any is held.
func (o *Owed) Drop() {
	for {
		n := o.n.Load()
		if n <= 0 {
			return
		}
		if o.n.CompareAndSwap(n, n-1) {
			o.backlog(-1)
			return
		}
	}
}

// Excuse gives back every unit held.
func (o *Owed) Excuse() {
	if n := o.n.Swap(0); n > 0 {
		o.backlog(-int64(n))
	}
}

// Held returns how many units are held.
func (o *Owed) Held() int32 { return o.n.Load() }

func (o *Owed) backlog(d int64) {
	if o.due != nil {
		o.due.Add(d)
	}
}
