package cache

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"iter"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strconv"
	"sync"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	gcpcache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
)

// Config configures a Cache.
type Config struct {
	// Classes are the proxy classes that exist from the start; each gets
	// its own cache per type. Classify may name more: their caches are
	// created when the first proxy of the class asks.
	Classes []string
	// Types are the type URLs each class gets a cache of.
	Types []string
	// SharedTypes are the type URLs one mesh-wide cache serves to every class.
	SharedTypes []string
	// Classify returns the class of a proxy from its node.
	Classify func(*core.Node) string
	// Shards splits every cache into this many copies, each serving a share
	// of the proxies under its own lock, so that pushes to many proxies use
	// every core. Default GOMAXPROCS.
	Shards int
	// NewClass, when set, is called (outside the cache's locks) the first
	// time a class is seen, before its first watch is served, so the
	// caller can fill the class's caches.
	NewClass func(class string)
	Log      *slog.Logger
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Classify == nil {
		return errors.New("cache: a classifier is required")
	}
	for _, t := range c.SharedTypes {
		if slices.Contains(c.Types, t) {
			return fmt.Errorf("cache: type %s is both per class and shared", t)
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Shards == 0 {
		c.Shards = runtime.GOMAXPROCS(0)
	}
	if c.Shards < 1 {
		return fmt.Errorf("cache: %d shards: want at least 1", c.Shards)
	}
	return nil
}

// Shared is the class name Update takes for a shared type.
const Shared = ""

// Cache is the pusher's resource cache.
type Cache struct {
	cfg    Config
	prefix string

	mu sync.Mutex
	// caches holds each cache key's shards. The shards of a key are
	// created and updated together, so their LinearCache versions agree.
	caches map[string][]*gcpcache.LinearCache
	held   map[string]map[string]held // cache key → resource name → what it holds
	// updates counts each cache's updates: a LinearCache's version is its
	// prefix and that count, and a resource's is the count when it was set.
	updates map[string]uint64
	// pending is what a cache key holds while its shards are being updated.
	pending map[string]map[string]held
	classes map[string]bool
	// creating serializes the first watch of a new class with its filling.
	creating sync.Mutex
	// updating serializes updates, which run outside mu.
	updating sync.Mutex
}

func cacheKey(class, typeURL string) string { return class + "|" + typeURL }

// New returns an empty Cache.
func New(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// The LinearCaches' own versions are counters, which mean nothing to
	// another replica: a prefix per process tells ours apart. Proxies are
	// sent content versions instead (see ResponseVersion).
	var b [4]byte
	_, _ = rand.Read(b[:])
	c := &Cache{cfg: cfg, prefix: hex.EncodeToString(b[:]) + "-",
		caches: map[string][]*gcpcache.LinearCache{}, held: map[string]map[string]held{},
		updates: map[string]uint64{}, pending: map[string]map[string]held{}, classes: map[string]bool{}}
	for _, t := range cfg.SharedTypes {
		c.addLocked(Shared, t)
	}
	for _, class := range cfg.Classes {
		c.addClassLocked(class)
	}
	return c, nil
}

func (c *Cache) addLocked(class, t string) {
	k := cacheKey(class, t)
	shards := make([]*gcpcache.LinearCache, c.cfg.Shards)
	for i := range shards {
		shards[i] = gcpcache.NewLinearCache(t, gcpcache.WithVersionPrefix(c.prefix))
	}
	c.caches[k] = shards
	c.held[k] = map[string]held{}
}

func (c *Cache) addClassLocked(class string) {
	c.classes[class] = true
	for _, t := range c.cfg.Types {
		c.addLocked(class, t)
	}
}

// Classes returns every class the cache holds, in order.
func (c *Cache) Classes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.classes))
	for class := range c.classes {
		out = append(out, class)
	}
	slices.Sort(out)
	return out
}

// class returns the class whose cache serves a node's requests for a type.
func (c *Cache) class(node *core.Node, typeURL string) string {
	if slices.Contains(c.cfg.SharedTypes, typeURL) {
		return Shared
	}
	return c.cfg.Classify(node)
}

// watched returns the cache serving a node's requests for a type, and its
// key, creating (and having the caller fill) the caches of a class seen
// for the first time.
func (c *Cache) watched(node *core.Node, typeURL string) (*gcpcache.LinearCache, string, error) {
	class := c.class(node, typeURL)
	k := cacheKey(class, typeURL)
	shard := c.shard(node)
	c.mu.Lock()
	shards, ok := c.caches[k]
	c.mu.Unlock()
	if ok {
		return shards[shard], k, nil
	}
	if class == Shared || !slices.Contains(c.cfg.Types, typeURL) {
		return nil, "", fmt.Errorf("cache: type %s is not served", typeURL)
	}
	c.creating.Lock()
	defer c.creating.Unlock()
	c.mu.Lock()
	shards, ok = c.caches[k]
	if !ok {
		c.addClassLocked(class)
		shards = c.caches[k]
	}
	c.mu.Unlock()
	if !ok {
		c.cfg.Log.Info("new proxy class", "class", class)
		if c.cfg.NewClass != nil {
			c.cfg.NewClass(class)
		}
	}
	return shards[shard], k, nil
}

// shard returns the shard that serves a node.
func (c *Cache) shard(node *core.Node) int {
	if c.cfg.Shards == 1 {
		return 0
	}
	f := fnv.New32a()
	_, _ = f.Write([]byte(node.GetId()))
	return int(f.Sum32() % uint32(c.cfg.Shards))
}

// Server returns the go-control-plane cache to serve from.
func (c *Cache) Server() gcpcache.Cache { return server{c} }

// server routes each watch to its class's cache, and stands between the
// versions proxies see and the LinearCaches' own.
//
// A SotW proxy is sent content versions (ResponseVersion), the same on
// every replica, and echoes them back. A request on a stream that has been
// answered before is judged by what the stream was sent (the
// subscription's returned resources), never by its version: so an ACK
// waits for the next change, and so does a NACK, which is how a rejected
// response is kept from being re-sent in a loop (a LinearCache answers a
// version it does not know at once, with exactly what was just rejected).
// The first request of a stream that carries a content version (a proxy
// that moved from another replica, or reconnected) is checked against what
// this replica holds: if the proxy has exactly that, the subscription is
// marked as knowing it, and only the next change is sent. Delta needs no
// help: its resource versions are content hashes, and a delta subscription
// knows what it was sent.
type server struct{ c *Cache }

// ResponseVersion is the version a SotW response is sent with, given the
// request it answers and the LinearCache version it was computed at: a
// hash of the content of every resource the proxy holds once it has
// applied the response. When the cache has moved on since the response was
// computed, the proxy's state is not known exactly and the response keeps
// the cache's own version, which a reconnect to any replica answers in full.
func (s server) ResponseVersion(r *gcpcache.Request, version string) string {
	c := s.c
	k := cacheKey(c.class(r.GetNode(), r.GetTypeUrl()), r.GetTypeUrl())
	c.mu.Lock()
	// A held map is never changed once published (Update builds a new
	// one), so it is read outside the lock every stream's sends share.
	var holds map[string]held
	switch version {
	case c.prefix + strconv.FormatUint(c.updates[k], 10):
		holds = c.held[k]
	case c.prefix + strconv.FormatUint(c.updates[k]+1, 10):
		holds = c.pending[k] // computed by a shard already updated
	}
	c.mu.Unlock()
	if holds == nil {
		return version
	}
	names := r.GetResourceNames()
	wildcard := len(names) == 0 || slices.Contains(names, "*")
	sum, _ := contentVersion(holds, wildcard, slices.Values(names), false)
	return sum
}

// contentVersion sums the content hashes of the resources a subscription
// holds (all of them when wildcard, else those named that exist), and,
// when asked, returns each one's cache version too. The sum does not
// depend on order, so it needs no sorting.
func contentVersion(holds map[string]held, wildcard bool, names iter.Seq[string], versions bool) (string, map[string]uint64) {
	var sum uint64
	var known map[string]uint64
	if versions {
		known = map[string]uint64{}
	}
	add := func(name string, h held) {
		sum += h.sum
		if versions {
			known[name] = h.updated
		}
	}
	if wildcard {
		for name, h := range holds {
			add(name, h)
		}
	} else {
		for name := range names {
			if h, ok := holds[name]; ok {
				add(name, h)
			}
		}
	}
	return fmt.Sprintf("%016x", sum), known
}

func (s server) CreateWatch(r *gcpcache.Request, sub gcpcache.Subscription, ch chan gcpcache.Response) (func(), error) {
	c := s.c
	lc, k, err := c.watched(r.GetNode(), r.GetTypeUrl())
	if err != nil {
		return nil, err
	}
	// Any version with this replica's prefix makes the LinearCache judge
	// by the subscription alone.
	ours := c.prefix + "known"
	switch {
	case len(sub.ReturnedResources()) > 0 || r.GetErrorDetail() != nil:
		r = withVersion(r, ours)
	case r.GetVersionInfo() != "":
		// Held maps are never changed once published: read outside the
		// lock, so that a reconnect storm does not queue on it.
		c.mu.Lock()
		holds := c.held[k]
		c.mu.Unlock()
		sum, known := contentVersion(holds, sub.IsWildcard(), maps.Keys(sub.SubscribedResources()), true)
		if sum == r.GetVersionInfo() {
			returned := make(map[string]string, len(known))
			for name, v := range known {
				returned[name] = c.prefix + strconv.FormatUint(v, 10)
			}
			sub = knownSubscription{sub, returned}
			r = withVersion(r, ours)
		}
	}
	return lc.CreateWatch(r, sub, ch)
}

// withVersion returns a request like r with another version. It shares
// r's fields (a SotW request names every resource it subscribes to, which
// can be thousands): neither the cache nor the server changes a request.
func withVersion(r *gcpcache.Request, version string) *gcpcache.Request {
	return &gcpcache.Request{
		VersionInfo: version, Node: r.Node, ResourceNames: r.ResourceNames,
		ResourceLocators: r.ResourceLocators, TypeUrl: r.TypeUrl,
		ResponseNonce: r.ResponseNonce, ErrorDetail: r.ErrorDetail,
	}
}

// knownSubscription is a stream's subscription that already holds what
// this replica would send it.
type knownSubscription struct {
	gcpcache.Subscription
	returned map[string]string
}

func (k knownSubscription) ReturnedResources() map[string]string { return k.returned }

func (s server) CreateDeltaWatch(r *gcpcache.DeltaRequest, sub gcpcache.Subscription, ch chan gcpcache.DeltaResponse) (func(), error) {
	lc, _, err := s.c.watched(r.GetNode(), r.GetTypeUrl())
	if err != nil {
		return nil, err
	}
	return lc.CreateDeltaWatch(r, sub, ch)
}

func (s server) Fetch(context.Context, *gcpcache.Request) (gcpcache.Response, error) {
	return nil, errors.New("cache: fetch (REST xDS) is not served")
}

// held is a resource the cache holds, with its content hash and size.
type held struct {
	res  types.Resource
	hash uint64
	// sum is a hash of the name and content, summed into content versions.
	sum  uint64
	size int
	// updated is the cache's update count when the resource was set.
	updated uint64
}

// Update makes the cache of a class and type hold exactly resources. It
// replaces only the resources whose content changed, and reports how many
// changed, how many were removed, and the encoded size of them all. A
// resource handed over again as the same object (the generator's cache
// returns the same objects for unchanged inputs) is not encoded again.
func (c *Cache) Update(class, typeURL string, resources map[string]types.Resource) (changed, removed, bytes int, err error) {
	k := cacheKey(class, typeURL)
	c.updating.Lock()
	defer c.updating.Unlock()
	c.mu.Lock()
	shards, ok := c.caches[k]
	old := c.held[k]
	c.mu.Unlock()
	if !ok {
		return 0, 0, 0, fmt.Errorf("cache: no cache for class %q type %s", class, typeURL)
	}
	next := make(map[string]held, len(resources))
	toUpdate := map[string]types.Resource{}
	for name, r := range resources {
		prev, known := old[name]
		h := prev
		if !known || prev.res != r {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
			if err != nil {
				return 0, 0, 0, fmt.Errorf("cache: encode %s %s: %w", typeURL, name, err)
			}
			f := fnv.New64a()
			_, _ = f.Write(b)
			h = held{res: r, hash: f.Sum64(), size: len(b), updated: prev.updated}
			f.Reset()
			_, _ = f.Write([]byte(name))
			_, _ = f.Write(binary.LittleEndian.AppendUint64(nil, h.hash))
			h.sum = f.Sum64()
		}
		next[name] = h
		bytes += h.size
		if !known || prev.hash != h.hash {
			toUpdate[name] = r
		}
	}
	var toDelete []string
	for name := range old {
		if _, ok := next[name]; !ok {
			toDelete = append(toDelete, name)
		}
	}
	if len(toUpdate) == 0 && len(toDelete) == 0 {
		c.mu.Lock()
		c.held[k] = next
		c.mu.Unlock()
		return 0, 0, bytes, nil
	}
	// The next version is known before the shards take it: responses the
	// shards compute at it find their content in pending.
	c.mu.Lock()
	nextCount := c.updates[k] + 1
	for name := range toUpdate {
		h := next[name]
		h.updated = nextCount
		next[name] = h
	}
	c.pending[k] = next
	c.mu.Unlock()
	// Each shard wakes its own proxies' watches, in parallel.
	errs := make([]error, len(shards))
	var wg sync.WaitGroup
	for i, lc := range shards {
		wg.Go(func() { errs[i] = lc.UpdateResources(toUpdate, toDelete) })
	}
	wg.Wait()
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, k)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, 0, fmt.Errorf("cache: update %s: %w", typeURL, err)
	}
	c.updates[k] = nextCount
	c.held[k] = next
	return len(toUpdate), len(toDelete), bytes, nil
}

// Resources returns what the cache of a class and type holds.
func (c *Cache) Resources(class, typeURL string) map[string]types.Resource {
	c.mu.Lock()
	shards, ok := c.caches[cacheKey(class, typeURL)]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	return shards[0].GetResources()
}
