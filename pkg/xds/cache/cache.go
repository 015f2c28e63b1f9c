package cache

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
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
	return nil
}

// Shared is the class name Update takes for a shared type.
const Shared = ""

// Cache is the pusher's resource cache.
type Cache struct {
	cfg    Config
	prefix string

	mu      sync.Mutex
	caches  map[string]*gcpcache.LinearCache // cache key → cache
	held    map[string]map[string]held       // cache key → resource name → what it holds
	classes map[string]bool
	// creating serializes the first watch of a new class with its filling.
	creating sync.Mutex
}

func cacheKey(class, typeURL string) string { return class + "|" + typeURL }

// New returns an empty Cache.
func New(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Versions from another replica must not look like ours: a prefix per
	// process makes a reconnecting proxy get a full answer.
	var b [4]byte
	_, _ = rand.Read(b[:])
	c := &Cache{cfg: cfg, prefix: hex.EncodeToString(b[:]) + "-",
		caches: map[string]*gcpcache.LinearCache{}, held: map[string]map[string]held{}, classes: map[string]bool{}}
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
	c.caches[k] = gcpcache.NewLinearCache(t, gcpcache.WithVersionPrefix(c.prefix))
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

// watched returns the cache serving a node's requests for a type, creating
// (and having the caller fill) the caches of a class seen for the first time.
func (c *Cache) watched(node *core.Node, typeURL string) (*gcpcache.LinearCache, error) {
	class := Shared
	if !slices.Contains(c.cfg.SharedTypes, typeURL) {
		class = c.cfg.Classify(node)
	}
	c.mu.Lock()
	lc, ok := c.caches[cacheKey(class, typeURL)]
	c.mu.Unlock()
	if ok {
		return lc, nil
	}
	if class == Shared || !slices.Contains(c.cfg.Types, typeURL) {
		return nil, fmt.Errorf("cache: type %s is not served", typeURL)
	}
	c.creating.Lock()
	defer c.creating.Unlock()
	c.mu.Lock()
	lc, ok = c.caches[cacheKey(class, typeURL)]
	if !ok {
		c.addClassLocked(class)
		lc = c.caches[cacheKey(class, typeURL)]
	}
	c.mu.Unlock()
	if !ok {
		c.cfg.Log.Info("new proxy class", "class", class)
		if c.cfg.NewClass != nil {
			c.cfg.NewClass(class)
		}
	}
	return lc, nil
}

// Server returns the go-control-plane cache to serve from.
func (c *Cache) Server() gcpcache.Cache { return server{c} }

// server routes each watch to its class's cache. It also keeps a rejected
// response from being sent again in a loop: a SotW NACK carries the last
// version the proxy accepted; when it accepted none from this replica (a
// first response, or a reconnect from another replica), a LinearCache
// answers such a request at once, with exactly what was just rejected, and
// the proxy NACKs again. Such a NACK is marked as holding this replica's
// versions, so that it is answered only when the resources change. Delta
// NACKs need no help: a delta subscription knows what it was sent.
type server struct{ c *Cache }

func (s server) CreateWatch(r *gcpcache.Request, sub gcpcache.Subscription, ch chan gcpcache.Response) (func(), error) {
	lc, err := s.c.watched(r.GetNode(), r.GetTypeUrl())
	if err != nil {
		return nil, err
	}
	if r.GetErrorDetail() != nil && !strings.HasPrefix(r.GetVersionInfo(), s.c.prefix) {
		nacked := proto.Clone(r).(*gcpcache.Request)
		nacked.VersionInfo = s.c.prefix + "rejected"
		r = nacked
	}
	return lc.CreateWatch(r, sub, ch)
}

func (s server) CreateDeltaWatch(r *gcpcache.DeltaRequest, sub gcpcache.Subscription, ch chan gcpcache.DeltaResponse) (func(), error) {
	lc, err := s.c.watched(r.GetNode(), r.GetTypeUrl())
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
	size int
}

// Update makes the cache of a class and type hold exactly resources. It
// replaces only the resources whose content changed, and reports how many
// changed, how many were removed, and the encoded size of them all. A
// resource handed over again as the same object (the generator's cache
// returns the same objects for unchanged inputs) is not encoded again.
func (c *Cache) Update(class, typeURL string, resources map[string]types.Resource) (changed, removed, bytes int, err error) {
	k := cacheKey(class, typeURL)
	c.mu.Lock()
	defer c.mu.Unlock()
	lc, ok := c.caches[k]
	if !ok {
		return 0, 0, 0, fmt.Errorf("cache: no cache for class %q type %s", class, typeURL)
	}
	old := c.held[k]
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
			h = held{res: r, hash: f.Sum64(), size: len(b)}
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
	c.held[k] = next
	if len(toUpdate) == 0 && len(toDelete) == 0 {
		return 0, 0, bytes, nil
	}
	if err := lc.UpdateResources(toUpdate, toDelete); err != nil {
		return 0, 0, 0, fmt.Errorf("cache: update %s: %w", typeURL, err)
	}
	return len(toUpdate), len(toDelete), bytes, nil
}

// Touch re-issues every resource of a class under a new version without
// changing it, so that each of its SotW proxies receives a response and,
// asking again, is classified afresh: how a proxy leaves a class when a
// Sidecar or Gateway that applies to it appears. (A Delta subscription
// sees no change and stays until its class next changes.)
func (c *Cache) Touch(class string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.cfg.Types {
		lc, ok := c.caches[cacheKey(class, t)]
		if !ok {
			continue
		}
		if res := lc.GetResources(); len(res) > 0 {
			_ = lc.UpdateResources(res, nil)
		}
	}
}

// Resources returns what the cache of a class and type holds.
func (c *Cache) Resources(class, typeURL string) map[string]types.Resource {
	c.mu.Lock()
	lc, ok := c.caches[cacheKey(class, typeURL)]
	c.mu.Unlock()
	if !ok {
		return nil
	}
	return lc.GetResources()
}
