package pusher

import (
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
)

// genCache holds generated resources by their inputs' versions. It is
// bounded by entries and by bytes (the resources' encoded size), and it
// forgets what no generation has used for a while: a change of the mesh's
// settings, or inputs removed, would otherwise leave their resources in
// it until entries alone pushed them out. It is the owner's alone
// (owner.go), and so is its LRU, which has no lock.
type genCache struct {
	// now is the start of the current generation, the time a lookup marks
	// its entry used: no clock read on a hit.
	now      time.Time
	lru      *simplelru.LRU[string, *genEntry]
	bytes    int64
	maxBytes int64
	idle     time.Duration
	swept    time.Time
	held     prometheus.Gauge // bytes held
}

type genEntry struct {
	v    any
	size int64
	used time.Time
}

func newGenCache(entries int, maxBytes int64, idle time.Duration, held prometheus.Gauge) (*genCache, error) {
	c := &genCache{now: time.Now(), maxBytes: maxBytes, idle: idle, held: held}
	var err error
	c.lru, err = simplelru.NewLRU(entries, func(_ string, e *genEntry) { c.bytes -= e.size })
	return c, err
}

// get returns the value under key, marking it used.
func (c *genCache) get(key string) (any, bool) {
	e, ok := c.lru.Get(key)
	if !ok {
		return nil, false
	}
	e.used = c.now
	return e.v, true
}

// add caches a value of size bytes, evicting the least recently used past
// the bounds.
func (c *genCache) add(key string, v any, size int64) {
	if old, ok := c.lru.Peek(key); ok {
		c.bytes -= old.size
		old.size = 0 // the eviction callback does not run on a replace
	}
	e := &genEntry{v: v, size: size, used: c.now}
	c.lru.Add(key, e)
	c.bytes += size
	for c.bytes > c.maxBytes && c.lru.Len() > 1 {
		c.lru.RemoveOldest()
	}
	c.held.Set(float64(c.bytes))
}

// sweep starts a generation at now, and forgets the entries no generation
// used for idle, at most once a minute: they are the least recently used,
// the oldest first.
func (c *genCache) sweep(now time.Time) {
	c.now = now
	if c.idle <= 0 || now.Sub(c.swept) < min(time.Minute, c.idle) {
		return
	}
	c.swept = now
	for {
		key, e, ok := c.lru.GetOldest()
		if !ok || now.Sub(e.used) < c.idle {
			break
		}
		c.lru.Remove(key)
	}
	c.held.Set(float64(c.bytes))
}

// len returns how many entries are held.
func (c *genCache) len() int { return c.lru.Len() }

// held returns the bytes held.
func (c *genCache) heldBytes() int64 {
	return c.bytes
}

// sizeOf is the encoded size of generated resources.
func sizeOf[R any](list []R) int64 {
	var n int64
	for _, r := range list {
		if m, ok := any(r).(proto.Message); ok {
			n += int64(proto.Size(m))
		}
	}
	return n
}
