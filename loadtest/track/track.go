// Package track measures convergence: when each change was made, and when
// each simulated proxy ACKed a response that contains it (or something
// newer for the same thing, which includes it).
//
// A Tracker is safe for concurrent use.
package track

import (
	"math"
	"slices"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
)

// Key is what a change changes: a service's endpoints or route (Service
// below the spec's count), or the existence of a dynamic service.
type Key struct {
	Kind    meshgen.Kind
	Service int
}

// KeyOf returns the key a change changes.
func KeyOf(c meshgen.Change) Key { return Key{c.Kind, c.Service} }

type record struct {
	change meshgen.Change
	made   time.Time
	seen   []uint64 // a bit per proxy
	count  int
	// audience is how many proxies the change reaches.
	audience int
	last     time.Duration // the latest proxy's convergence so far
}

// Tracker records changes and what the proxies saw of them.
type Tracker struct {
	mu      sync.Mutex
	proxies int
	records map[int]*record
	byKey   map[Key][]int // change numbers in order
	// each counts each proxy's convergence of each change, by code.
	each    []int
	samples int
	// audience, when set, says how many proxies a change reaches (all of
	// them without it).
	audience func(meshgen.Change) int
	// held, for the proxy followed (see Follow), is the change each key
	// was last seen as, older ones included.
	followed int
	held     map[Key]int
}

// Follow makes the Tracker remember what proxy p holds: the change each
// key was last seen as, even one older than seen before (a store that
// went back), for Behind.
func (t *Tracker) Follow(p int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.followed, t.held = p, map[Key]int{}
}

// Behind returns the keys of the endpoint and route changes whose newest
// change the followed proxy does not hold (an older one, or none), of
// those sees says reach it.
func (t *Tracker) Behind(sees func(meshgen.Change) bool) []Key {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Key
	for k, list := range t.byKey {
		if k.Kind != meshgen.Endpoint && k.Kind != meshgen.Route || len(list) == 0 {
			continue
		}
		newest := list[len(list)-1]
		if !sees(t.records[newest].change) {
			continue
		}
		if n, ok := t.held[k]; !ok || n < newest {
			out = append(out, k)
		}
	}
	return out
}

// Expect sets how many proxies each change reaches, for a mesh whose
// proxies do not all see every change.
func (t *Tracker) Expect(audience func(meshgen.Change) int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.audience = audience
}

// New returns a Tracker for a number of proxies, every one affected by every change.
func New(proxies int) *Tracker {
	return &Tracker{proxies: proxies, records: map[int]*record{}, byKey: map[Key][]int{}, each: make([]int, math.MaxUint16+1)}
}

// Made records a change made at a time.
func (t *Tracker) Made(c meshgen.Change, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := &record{change: c, made: at, seen: make([]uint64, (t.proxies+63)/64), audience: t.proxies}
	if t.audience != nil {
		r.audience = t.audience(c)
	}
	t.records[c.N] = r
	k := KeyOf(c)
	t.byKey[k] = append(t.byKey[k], c.N)
}

// Saw records that proxy p ACKed at a time a response holding key k as of
// change n: that change and every earlier one of the same key reached it.
func (t *Tracker) Saw(p int, k Key, n int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.held != nil && p == t.followed {
		t.held[k] = n
	}
	list := t.byKey[k]
	i, found := slices.BinarySearch(list, n)
	if found {
		i++
	}
	for i--; i >= 0; i-- { // from the newest change up to n
		r := t.records[list[i]]
		word, bit := p/64, uint64(1)<<(p%64)
		if r.seen[word]&bit != 0 {
			return // so are all earlier ones
		}
		r.seen[word] |= bit
		r.count++
		r.last = max(r.last, at.Sub(r.made))
		t.each[code(at.Sub(r.made))]++
		t.samples++
	}
}

// Done reports whether change n has reached every proxy.
func (t *Tracker) Done(n int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.records[n]
	return ok && r.count >= r.audience
}

// Result is one change's convergence.
type Result struct {
	Change meshgen.Change
	Made   time.Time
	// Converged is when the last proxy ACKed it; Proxies how many did.
	Converged time.Duration
	Proxies   int
	Done      bool
	// Audience is how many proxies the change was to reach (0: none of
	// those running sees it).
	Audience int
}

// Results returns every change's convergence, in the order made.
func (t *Tracker) Results() []Result {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Result, 0, len(t.records))
	for _, r := range t.records {
		out = append(out, Result{Change: r.change, Made: r.made, Converged: r.last, Proxies: r.count, Done: r.count >= r.audience, Audience: r.audience})
	}
	slices.SortFunc(out, func(a, b Result) int { return a.Change.N - b.Change.N })
	return out
}

// Pending returns how many changes some proxy has not yet seen.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, r := range t.records {
		if r.count < r.audience {
			n++
		}
	}
	return n
}

// A proxy's convergence of a change is kept in two bytes: the logarithm
// of the duration in microseconds, in steps of 0.05 %, from 1 µs to
// beyond any run.
const step = 1.0005

func code(d time.Duration) uint16 {
	us := max(float64(d)/float64(time.Microsecond), 1)
	return uint16(min(math.Round(math.Log(us)/math.Log(step)), math.MaxUint16))
}

func decode(c uint16) time.Duration {
	return time.Duration(math.Pow(step, float64(c)) * float64(time.Microsecond))
}

// EachProxy returns quantiles (0 to 1) of each proxy's convergence of
// each change: from when the change was made to when that proxy ACKed
// it, which is what the control plane's histogram
// shardpilot_pusher_convergence_seconds measures (from when a source
// observed it), where a change's convergence is its last proxy's. It
// also returns how many there are.
func (t *Tracker) EachProxy(qs ...float64) (n int, at []time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at = make([]time.Duration, len(qs))
	if t.samples == 0 {
		return 0, at
	}
	for i, q := range qs {
		rank := max(int(math.Ceil(q*float64(t.samples))), 1) // nearest rank
		seen := 0
		for c, k := range t.each {
			if seen += k; seen >= rank {
				at[i] = decode(uint16(c))
				break
			}
		}
	}
	return t.samples, at
}
