package cache

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/anypb"
)

// ErrNoClass is returned for a class the cache does not hold yet.
var ErrNoClass = errors.New("cache: no such class")

// ErrNotServed is returned for a type the cache does not serve.
var ErrNotServed = errors.New("cache: type not served")

// Config configures a Cache.
type Config struct {
	// Classes are the proxy classes that exist from the start; each gets
	// a table per type. More are added by AddClass.
	Classes []Class
	// Types are the type URLs each class gets a table of.
	Types []string
	// SharedTypes are the type URLs one mesh-wide table serves to every class.
	SharedTypes []string
	// LogSize is how many changes each table remembers; a stream further
	// behind is answered from a scan of its subscription. Default 4096.
	LogSize int
	// Reuse is a cache whose tables may hold the very objects this one is
	// handed (the locality variants of load assignments are mostly the
	// shared ones): the two share what they checked and encoded, so that
	// an object either holds is not encoded again (see validator.objects).
	Reuse *Cache
	Log   *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	for _, t := range c.SharedTypes {
		if slices.Contains(c.Types, t) {
			return fmt.Errorf("cache: type %s is both per class and shared", t)
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.LogSize == 0 {
		c.LogSize = 4096
	}
	if c.LogSize < 1 {
		return fmt.Errorf("cache: log size %d: want at least 1", c.LogSize)
	}
	return nil
}

// Class names the tables of one class: the proxies of a class (its key,
// in the grammar of classify.Class), the secrets of one identity, or the
// load assignments of one locality. A type of its own, it cannot be
// taken for a type URL or a resource's name.
type Class string

// Shared is the class name Update and Table take for a shared type.
const Shared Class = ""

// VHDSRoutesType keys a class's table of route configurations as a proxy
// that takes their virtual hosts apart (VHDS) is sent them: each without
// its virtual hosts, which it names the ADS stream the source of. A table
// keyed by a variant (the type URL, '#', a name) answers with the type URL
// alone.
const VHDSRoutesType = resource.RouteType + "#vhds"

// wireType is the type URL a table's responses carry: its key's, without a
// variant.
func wireType(key string) string {
	t, _, _ := strings.Cut(key, "#")
	return t
}

// fullState reports whether a SotW response of a type must carry every
// resource the proxy subscribes to (listeners and clusters), rather than
// only those that changed (the xDS protocol's rule).
func fullState(typeURL string) bool {
	return typeURL == resource.ClusterType || typeURL == resource.ListenerType
}

type tableKey struct {
	class   Class
	typeURL string
}

// Cache is the pusher's resource cache: a Table per class and type.
type Cache struct {
	cfg     Config
	invalid prometheus.Counter
	// backlog is what the watches owe (see Owed).
	backlog backlog
	// epoch numbers the generations the tables hold (see BeginEpoch).
	epoch atomic.Int64

	mu     sync.RWMutex
	tables map[tableKey]*Table
	// filling holds the tables of classes being filled by AddClass: Update
	// reaches them, Table does not.
	filling map[tableKey]*Table
	classes map[Class]bool
	// adding holds a channel per class being added, closed once it is:
	// a class is filled once, while other classes are filled beside it.
	adding map[Class]chan struct{}
	// check validates what the tables take, remembering the virtual hosts
	// found valid.
	check *validator
}

// New returns a Cache with empty tables for the configured classes.
func New(cfg Config) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	check := newValidator()
	if cfg.Reuse != nil {
		check = cfg.Reuse.check
	}
	c := &Cache{cfg: cfg, check: check, tables: map[tableKey]*Table{}, filling: map[tableKey]*Table{}, classes: map[Class]bool{}, adding: map[Class]chan struct{}{},
		invalid: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_invalid_resources_total",
			Help: "Generated resources not served because they failed validation (the last valid version, if any, stays)."})}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(c.invalid); err != nil {
			return nil, fmt.Errorf("cache: register metrics: %w", err)
		}
	}
	c.epoch.Store(1)
	for _, t := range cfg.SharedTypes {
		c.tables[tableKey{Shared, t}] = c.newTable(t)
	}
	for _, class := range cfg.Classes {
		c.classes[class] = true
		for _, t := range cfg.Types {
			c.tables[tableKey{class, t}] = c.newTable(t)
		}
	}
	return c, nil
}

// Backlog returns how many watches have a change due that they have not
// been answered from yet, or a response that was not yet ACKed: while it
// is not zero, the last wave of pushes is still being written.
func (c *Cache) Backlog() int64 { return c.backlog.due.Load() }

// Holding returns the units of the backlog that hold the next generation:
// those of every watch but the ones sent a response in parts (see Owed).
func (c *Cache) Holding() int64 { return c.backlog.holding.Load() }

// Epoch returns the epoch of the generation the tables hold: a response
// sent now contains every change up to it. A new cache holds epoch 1.
func (c *Cache) Epoch() int64 { return c.epoch.Load() }

// BeginEpoch starts and returns the epoch of a new generation; the
// generator begins it before it updates a table, so that a response sent
// from then on may contain its changes.
func (c *Cache) BeginEpoch() int64 { return c.epoch.Add(1) }

func (c *Cache) newTable(typeURL string) *Table {
	t := newTable(wireType(typeURL), c.cfg.LogSize, &c.backlog, func(name string, err error) {
		c.invalid.Inc()
		c.cfg.Log.Error("generated resource is invalid; not served", "type", typeURL, "name", name, "err", err)
	})
	t.check = c.check
	return t
}

// Classes returns every class the cache holds, and those being filled by
// AddClass, in order: a generation that starts while a class is filled
// generates it too, so that what the fill read before that generation is
// replaced (the class's fill and the generations run in turn).
func (c *Cache) Classes() []Class {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Class, 0, len(c.classes))
	for class := range c.classes {
		out = append(out, class)
	}
	for k := range c.filling {
		if k.typeURL == c.cfg.Types[0] {
			out = append(out, k.class)
		}
	}
	slices.Sort(out)
	return out
}

// Table returns the table that serves a class's requests for a type: the
// shared table for a shared type (class Shared asks for it alone). It
// returns ErrNoClass for a class not added yet, whatever the type: a
// stream that asks for a shared type first still has its class added,
// whose tables say what of the shared one it may see. It returns
// ErrNotServed for a type the cache does not serve.
func (c *Cache) Table(class Class, typeURL string) (*Table, error) {
	key := tableKey{class, typeURL}
	if slices.Contains(c.cfg.SharedTypes, typeURL) {
		key.class = Shared
	} else if !slices.Contains(c.cfg.Types, typeURL) {
		return nil, fmt.Errorf("%w: %s", ErrNotServed, typeURL)
	}
	c.mu.RLock()
	t, ok := c.tables[key]
	if class != Shared && key.class == Shared {
		ok = ok && c.classes[class]
	}
	c.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNoClass, class)
	}
	return t, nil
}

// AddClass adds the tables of a class not held yet and calls fill, which
// may Update them, before any Table call can return them: no proxy is
// served a new class's tables empty. It reports whether the class was new.
// A class is filled once: a second AddClass of it waits for the first.
// No lock is held while fill runs, so classes are filled side by side.
func (c *Cache) AddClass(class Class, fill func(class Class)) bool {
	c.mu.Lock()
	for {
		if c.classes[class] {
			c.mu.Unlock()
			return false
		}
		wait, ok := c.adding[class]
		if !ok {
			break
		}
		c.mu.Unlock()
		<-wait
		c.mu.Lock()
	}
	done := make(chan struct{})
	c.adding[class] = done
	for _, t := range c.cfg.Types {
		c.filling[tableKey{class, t}] = c.newTable(t)
	}
	c.mu.Unlock()
	c.cfg.Log.Info("new proxy class", "class", class)
	if fill != nil {
		fill(class)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.cfg.Types {
		k := tableKey{class, t}
		c.tables[k] = c.filling[k]
		delete(c.filling, k)
	}
	c.classes[class] = true
	delete(c.adding, class)
	close(done)
	return true
}

// RemoveClass drops the tables of a class added by AddClass (the classes
// the cache was made with stay); the caller makes sure no stream watches
// them. It reports whether the class was held.
func (c *Cache) RemoveClass(class Class) bool {
	if slices.Contains(c.cfg.Classes, class) {
		return false
	}
	// A class being added is not held yet, so not removed: RemoveClass
	// does not wait for a fill.
	c.mu.Lock()
	if !c.classes[class] {
		c.mu.Unlock()
		return false
	}
	var dropped []*Table
	for _, t := range c.cfg.Types {
		dropped = append(dropped, c.tables[tableKey{class, t}])
		delete(c.tables, tableKey{class, t})
	}
	delete(c.classes, class)
	c.mu.Unlock()
	for _, t := range dropped {
		t.drop()
	}
	c.cfg.Log.Info("proxy class dropped: no proxy left", "class", class)
	return true
}

// table returns the table Update writes: a held one or one being filled.
func (c *Cache) table(class Class, typeURL string) (*Table, bool) {
	k := tableKey{class, typeURL}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if t, ok := c.tables[k]; ok {
		return t, true
	}
	t, ok := c.filling[k]
	return t, ok
}

// Update makes the table of a class and type hold exactly resources. It
// encodes only the resources whose content may have changed (a resource
// handed over again as the same object is not encoded again), and reports
// how many changed, how many were removed, and the encoded size of them all.
//
// A class the cache does not hold (dropped while it was being generated)
// is nothing to update.
func (c *Cache) Update(class Class, typeURL string, resources map[string]types.Resource) (changed, removed, bytes int, err error) {
	t, ok := c.table(class, typeURL)
	if !ok {
		return 0, 0, 0, nil
	}
	return t.Update(resources)
}

// Patch sets some resources of the table of a class and type and removes
// some names, leaving the rest as it is (see Update).
func (c *Cache) Patch(class Class, typeURL string, set map[string]types.Resource, remove []string) (changed, removed, bytes int, err error) {
	t, ok := c.table(class, typeURL)
	if !ok {
		return 0, 0, 0, nil
	}
	return t.Patch(set, remove)
}

// Resources returns what the table of a class and type holds.
func (c *Cache) Resources(class Class, typeURL string) map[string]types.Resource {
	t, err := c.Table(class, typeURL)
	if err != nil {
		return nil
	}
	return t.Resources()
}

// Encoded returns a copy of what a class's table of a type holds, each
// resource as the Any every response shares (read-only); nil for a table
// that does not exist.
func (c *Cache) Encoded(class Class, typeURL string) map[string]*anypb.Any {
	t, err := c.Table(class, typeURL)
	if err != nil {
		return nil
	}
	return t.Encoded()
}
