package pusher

import (
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"
)

// genCache holds generated resources by their inputs' versions. It is
// bounded by entries and by bytes (the resources' encoded size), and it
// forgets what no generation has used for a while: a change of the mesh's
// settings, or inputs removed, would otherwise leave their resources in
// it until entries alone pushed them out. Streams filling a class use it
// beside the generating goroutine: it is safe for concurrent use.
type genCache struct {
	// now is the start of the current generation (Unix nanoseconds), the
	// time a lookup marks its entry used: no clock read, no lock of this
	// cache on a hit (the LRU has its own).
	now      atomic.Int64
	mu       sync.Mutex // bytes, swept and adding
	lru      *lru.Cache[string, *genEntry]
	bytes    int64
	maxBytes int64
	idle     time.Duration
	swept    time.Time
	held     prometheus.Gauge // bytes held
}

type genEntry struct {
	v    any
	size int64
	used atomic.Int64 // Unix nanoseconds
}

func newGenCache(entries int, maxBytes int64, idle time.Duration, held prometheus.Gauge) (*genCache, error) {
	c := &genCache{maxBytes: maxBytes, idle: idle, held: held}
	c.now.Store(time.Now().UnixNano())
	var err error
	c.lru, err = lru.NewWithEvict(entries, func(_ string, e *genEntry) { c.bytes -= e.size })
	return c, err
}

// get returns the value under key, marking it used.
func (c *genCache) get(key string) (any, bool) {
	e, ok := c.lru.Get(key)
	if !ok {
		return nil, false
	}
	e.used.Store(c.now.Load())
	return e.v, true
}

// add caches a value of size bytes, evicting the least recently used past
// the bounds.
func (c *genCache) add(key string, v any, size int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.lru.Peek(key); ok {
		c.bytes -= old.size
		old.size = 0 // the eviction callback does not run on a replace
	}
	e := &genEntry{v: v, size: size}
	e.used.Store(c.now.Load())
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
	c.now.Store(now.UnixNano())
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle <= 0 || now.Sub(c.swept) < min(time.Minute, c.idle) {
		return
	}
	c.swept = now
	for {
		key, e, ok := c.lru.GetOldest()
		if !ok || now.Sub(time.Unix(0, e.used.Load())) < c.idle {
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
	c.mu.Lock()
	defer c.mu.Unlock()
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
