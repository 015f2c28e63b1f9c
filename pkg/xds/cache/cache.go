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
	// Classes are the proxy classes; each gets its own cache per type.
	Classes []string
	// Types are the type URLs each class gets a cache of.
	Types []string
	// SharedTypes are the type URLs one mesh-wide cache serves to every class.
	SharedTypes []string
	// Classify returns the class of a proxy from its node; it must return
	// one of Classes.
	Classify func(*core.Node) string
	Log      *slog.Logger
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if len(c.Classes) == 0 || c.Classify == nil {
		return errors.New("cache: classes and a classifier are required")
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
	mux    *gcpcache.MuxCache
	prefix string
	caches map[string]*gcpcache.LinearCache

	mu     sync.Mutex
	hashes map[string]map[string]uint64 // cache key → resource name → content hash
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
	prefix := hex.EncodeToString(b[:]) + "-"
	c := &Cache{cfg: cfg, prefix: prefix, caches: map[string]*gcpcache.LinearCache{}, hashes: map[string]map[string]uint64{}}
	add := func(class, t string) {
		k := cacheKey(class, t)
		c.caches[k] = gcpcache.NewLinearCache(t, gcpcache.WithVersionPrefix(prefix))
		c.hashes[k] = map[string]uint64{}
	}
	for _, class := range cfg.Classes {
		for _, t := range cfg.Types {
			add(class, t)
		}
	}
	for _, t := range cfg.SharedTypes {
		add(Shared, t)
	}
	muxed := make(map[string]gcpcache.Cache, len(c.caches))
	for k, v := range c.caches {
		muxed[k] = v
	}
	c.mux = &gcpcache.MuxCache{
		Classify:      func(r *gcpcache.Request) string { return c.key(r.GetNode(), r.GetTypeUrl()) },
		ClassifyDelta: func(r *gcpcache.DeltaRequest) string { return c.key(r.GetNode(), r.GetTypeUrl()) },
		Caches:        muxed,
	}
	return c, nil
}

func (c *Cache) key(node *core.Node, typeURL string) string {
	if slices.Contains(c.cfg.SharedTypes, typeURL) {
		return cacheKey(Shared, typeURL)
	}
	return cacheKey(c.cfg.Classify(node), typeURL)
}

// Server returns the go-control-plane cache to serve from.
func (c *Cache) Server() gcpcache.Cache { return nackGuard{c} }

// nackGuard keeps a rejected response from being sent again in a loop. A
// SotW NACK carries the last version the proxy accepted; when it accepted
// none from this replica (a first response, or a reconnect from another
// replica), the LinearCache answers such a request at once, with exactly
// what was just rejected, and the proxy NACKs again. The guard marks such a
// NACK as holding this replica's versions, so that the cache answers it only
// when the resources change. Delta NACKs need no help: a delta subscription
// knows what it was sent.
type nackGuard struct{ c *Cache }

func (g nackGuard) CreateWatch(r *gcpcache.Request, sub gcpcache.Subscription, ch chan gcpcache.Response) (func(), error) {
	if r.GetErrorDetail() != nil && !strings.HasPrefix(r.GetVersionInfo(), g.c.prefix) {
		nacked := proto.Clone(r).(*gcpcache.Request)
		nacked.VersionInfo = g.c.prefix + "rejected"
		r = nacked
	}
	return g.c.mux.CreateWatch(r, sub, ch)
}

func (g nackGuard) CreateDeltaWatch(r *gcpcache.DeltaRequest, sub gcpcache.Subscription, ch chan gcpcache.DeltaResponse) (func(), error) {
	return g.c.mux.CreateDeltaWatch(r, sub, ch)
}

func (g nackGuard) Fetch(ctx context.Context, r *gcpcache.Request) (gcpcache.Response, error) {
	return g.c.mux.Fetch(ctx, r)
}

// Update makes the cache of a class and type hold exactly resources. It
// replaces only the resources whose content changed and reports how many
// changed and how many were removed.
func (c *Cache) Update(class, typeURL string, resources map[string]types.Resource) (changed, removed int, err error) {
	k := cacheKey(class, typeURL)
	lc, ok := c.caches[k]
	if !ok {
		return 0, 0, fmt.Errorf("cache: no cache for class %q type %s", class, typeURL)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.hashes[k]
	next := make(map[string]uint64, len(resources))
	toUpdate := map[string]types.Resource{}
	for name, r := range resources {
		h, err := hash(r)
		if err != nil {
			return 0, 0, fmt.Errorf("cache: hash %s %s: %w", typeURL, name, err)
		}
		next[name] = h
		if prev, ok := old[name]; !ok || prev != h {
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
		return 0, 0, nil
	}
	if err := lc.UpdateResources(toUpdate, toDelete); err != nil {
		return 0, 0, fmt.Errorf("cache: update %s: %w", typeURL, err)
	}
	c.hashes[k] = next
	return len(toUpdate), len(toDelete), nil
}

// Resources returns what the cache of a class and type holds.
func (c *Cache) Resources(class, typeURL string) map[string]types.Resource {
	lc, ok := c.caches[cacheKey(class, typeURL)]
	if !ok {
		return nil
	}
	return lc.GetResources()
}

func hash(r types.Resource) (uint64, error) {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		return 0, err
	}
	h := fnv.New64a()
	_, _ = h.Write(b)
	return h.Sum64(), nil
}
