package pusher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"google.golang.org/protobuf/proto"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	gcpcache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/prometheus/client_golang/prometheus"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/classify"
	"github.com/shardpilot/shardpilot/pkg/debounce"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// Loader reads the whole mesh from the store at one revision.
type Loader interface {
	List(ctx context.Context) (items []model.Stored, rev int64, errs []error, err error)
	// Revision returns the store's current revision.
	Revision(ctx context.Context) (int64, error)
}

// Feed is the change stream.
type Feed interface {
	LastSeq(ctx context.Context) (uint64, error)
	Consume(ctx context.Context, fromSeq uint64, fn func(seq uint64, ev *meshv1.ChangeEvent) error) error
}

// Sink receives the generated resources of a class and type; the cache.
type Sink interface {
	// Update makes a table hold exactly resources.
	Update(class, typeURL string, resources map[string]types.Resource) (changed, removed, bytes int, err error)
	// Patch sets some resources of a table and removes some names.
	Patch(class, typeURL string, set map[string]types.Resource, remove []string) (changed, removed, bytes int, err error)
	// Classes returns the classes the sink serves.
	Classes() []string
	// Backlog returns how many proxy watches still have a change due: while
	// it is not zero, the last generation is still being written, and the
	// next one waits (up to MaxDelay) to take more changes together.
	Backlog() int64
}

// The classes of proxy the pusher generates for, and the types it serves per
// class and mesh-wide.
var (
	Classes     = []string{generate.Envoy.String(), generate.Proxyless.String()}
	ClassTypes  = []string{resource.ClusterType, resource.ListenerType, resource.RouteType}
	SharedTypes = []string{resource.EndpointType}
)

// Config configures a Pusher.
type Config struct {
	// RootNamespace is the mesh's root namespace, whose security policies
	// apply to every namespace. Default generate.DefaultRootNamespace.
	RootNamespace string
	// NoAutoMTLS turns off automatic mutual TLS (Envoys' clusters to
	// endpoints with a sidecar), for proxies that cannot get workload
	// certificates, whatever the mesh's settings say.
	NoAutoMTLS bool
	// MeshOverrides are settings that win over the mesh's MeshConfig: the
	// fields they set (the operator's flags).
	MeshOverrides *meshv1.MeshConfig
	// TrustDomain is the mesh's SPIFFE trust domain (default cluster.local).
	TrustDomain string
	// AgentCertificates says Envoys get their workload certificates from
	// Istio's agent beside them (see generate.Mesh).
	AgentCertificates bool
	// SharedGatewayNamespaces are the namespaces whose gateway proxies any
	// namespace's Gateways may select; a gateway proxy of another namespace
	// is selected by its own namespace's alone (see
	// classify.SharedGatewayNamespaces). Nil: any Gateway selects any
	// gateway proxy, as istiod does by default.
	SharedGatewayNamespaces []string
	// Namespaces, when set, are the namespaces whose proxies the pusher
	// serves: it loads and follows only what their Sidecars let them see
	// (see scopeOf), which needs a ScopedLoader and a ScopedFeed. Empty:
	// the whole mesh, unless Placed.
	Namespaces []string
	// Placed says the namespaces served are a placement that Place changes
	// at run time: Namespaces to begin with, which may be none (the pusher
	// then holds the Sidecars, Gateways and root namespace alone).
	Placed bool
	// ScopeByProxies makes the namespaces served those of the proxies
	// connected (among Namespaces, when set): a namespace's scope is
	// loaded when its first proxy comes (see Admit), and released
	// ScopeGrace after its last one left (see Left).
	ScopeByProxies bool
	// ScopeGrace is how long a namespace stays served after its last
	// proxy left. Default 5m.
	ScopeGrace time.Duration
	Loader     Loader
	Feed       Feed
	Sink       Sink
	// Localities, when set, receives the load assignments as the proxies
	// of each locality class it holds see them (see FillLocality); their
	// class is generate.LocalityName of the proxy's locality.
	Localities Sink
	Log        *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Quiet is the debounce quiet period: it takes the events of one
	// store transaction or source sync together. Batching beyond that
	// adapts to load: a generation waits while the last one's pushes are
	// still being written (Sink.Backlog), and each stream coalesces what
	// changes while its last response is in flight. Default 10ms.
	Quiet time.Duration
	// MaxDelay bounds how long a change waits for the quiet period.
	// Default 1s.
	MaxDelay time.Duration
	// MaxHold bounds how long a change waits while the last generation's
	// pushes are still being written: under load, batches last as long as
	// a wave of pushes takes, up to this. Default 5s.
	MaxHold time.Duration
	// RetryDelay is the pause before loading again after a failure. Default 1s.
	RetryDelay time.Duration
	// CacheSize bounds the per-service generated resources kept. Default 100,000.
	CacheSize int
	// ClusterLinger is how long a cluster a class no longer has is still
	// served, so that the routes that stop naming it reach the proxies
	// first (make before break). Default 5s; negative removes at once.
	ClusterLinger time.Duration
	// MaxProxylessResponse bounds the size of the clusters or listeners of
	// a class of proxyless clients, which every response of theirs holds
	// whole: grpc-go refuses a message above 4 MiB (and the stream with
	// it). Past it, the class keeps its last resources of that type and the
	// generation is reported. Default 4 MiB less 64 KiB for the envelope.
	MaxProxylessResponse int
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Loader == nil || c.Feed == nil || c.Sink == nil {
		return errors.New("pusher: a loader, a feed and a sink are required")
	}
	if c.ScopeGrace == 0 {
		c.ScopeGrace = 5 * time.Minute
	}
	if len(c.Namespaces) > 0 || c.Placed || c.ScopeByProxies {
		_, loads := c.Loader.(ScopedLoader)
		_, follows := c.Feed.(ScopedFeed)
		if !loads || !follows {
			return errors.New("pusher: serving some namespaces needs a loader and a feed that can be scoped")
		}
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Quiet == 0 {
		c.Quiet = 10 * time.Millisecond
	}
	if c.MaxDelay == 0 {
		c.MaxDelay = time.Second
	}
	if c.MaxHold == 0 {
		c.MaxHold = max(5*time.Second, c.MaxDelay)
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.CacheSize == 0 {
		c.CacheSize = 100_000
	}
	if c.ClusterLinger == 0 {
		c.ClusterLinger = 5 * time.Second
	}
	if c.MaxProxylessResponse == 0 {
		c.MaxProxylessResponse = 4<<20 - 64<<10
	}
	if c.Quiet < 0 || c.MaxDelay < c.Quiet || c.MaxHold < c.MaxDelay {
		return fmt.Errorf("pusher: debounce quiet period %s, maximum delay %s and maximum hold %s: want 0 < quiet <= max delay <= max hold", c.Quiet, c.MaxDelay, c.MaxHold)
	}
	return nil
}

// Pusher follows the store and generates xDS resources.
type Pusher struct {
	cfg       Config
	state     *state
	debouncer *debounce.Debouncer[change]
	m         metrics
	generated atomic.Int64  // revision of the last generation, 0 before the first
	following atomic.Bool   // the store is loaded and the stream followed
	consumed  atomic.Uint64 // the stream sequence of the last event consumed
	// lru holds per-service generated resources by their inputs' versions.
	lru *lru.Cache[string, any]
	// settings are the mesh's stored settings of the last generation
	// (owned by the generating goroutine).
	settings *meshv1.MeshConfig
	// index classifies proxies; last is the mesh of the last generation,
	// for a class seen between generations.
	index       atomic.Pointer[classify.Index]
	last        atomic.Pointer[generate.Mesh]
	conv        *convergence
	sizes       sizes
	routes      routeMemo
	prints      prints
	serverPorts serverPorts
	linger      linger
	// gen numbers the generations; delivered says whether the last wave of
	// pushes was written and answered when the current one began.
	gen       atomic.Uint64
	delivered atomic.Bool
	// lingerDue is set while a generation is scheduled to drop lingering
	// clusters at the latest.
	lingerDue atomic.Bool
	// classesChanged says that what decides classes changed.
	classesChanged chan struct{}
	// eds holds, by service, the names of the load assignments last
	// handed to the sink, and edsCount how many there are (owned by the
	// generating goroutine): an endpoint change replaces only its
	// services' assignments.
	eds      map[string][]string
	edsCount int
	// localities generates the load assignments of proxies' localities.
	localities localities
	// sidecars are every Sidecar, and scope the namespaces loaded (nil:
	// all), of a pusher serving some namespaces (owned by the following
	// goroutine).
	sidecars map[model.Key]*meshv1.Scope
	scope    []string
	// served tracks the namespaces served by proxies (ScopeByProxies).
	served served
	// placement is the namespaces served (Namespaces, changed by Place).
	placement struct {
		mu         sync.Mutex
		namespaces []string
	}
}

// sizes keeps, per type, the largest class's resource count and bytes of
// a generation.
type sizes struct {
	mu           sync.Mutex
	count, bytes map[string]int
}

func (s *sizes) observe(typ string, count, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.count == nil {
		s.count, s.bytes = map[string]int{}, map[string]int{}
	}
	s.count[typ] = max(s.count[typ], count)
	s.bytes[typ] = max(s.bytes[typ], bytes)
}

// flush sets the gauges and starts over.
func (s *sizes) flush(m metrics) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for typ, n := range s.count {
		m.resources.WithLabelValues(typ).Set(float64(n))
		m.configBytes.WithLabelValues(typ).Set(float64(s.bytes[typ]))
	}
	s.count, s.bytes = nil, nil
}

// change is what the debouncer merges: how many changes, since when, and
// whether any of them was more than an endpoint change.
type change struct {
	n     int
	since time.Time
	full  bool
	// observed is when the earliest change was observed at its source;
	// zero for a reload.
	observed time.Time
}

type metrics struct {
	events      *prometheus.CounterVec
	loads       prometheus.Counter
	generations *prometheus.CounterVec
	convergence prometheus.Histogram
	applyLag    prometheus.Histogram
	cache       *prometheus.CounterVec
	genTime     prometheus.Histogram
	debounce    prometheus.Histogram
	resources   *prometheus.GaugeVec
	configBytes *prometheus.GaugeVec
	classes     *prometheus.CounterVec
	tooLarge    prometheus.Counter
	scope       prometheus.Gauge
}

// New returns a Pusher.
func New(cfg Config) (*Pusher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := debounce.New(debounce.Config[change]{
		Quiet: cfg.Quiet, MaxDelay: cfg.MaxDelay, MaxHold: cfg.MaxHold,
		Hold: func() bool { return cfg.Sink.Backlog() > 0 },
		Merge: func(a, b change) change {
			observed := a.observed
			if observed.IsZero() || (!b.observed.IsZero() && b.observed.Before(observed)) {
				observed = b.observed
			}
			return change{a.n + b.n, a.since, a.full || b.full, observed}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("pusher: %w", err)
	}
	m := metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_events_total",
			Help: "Change events consumed, by outcome (applied, skipped, invalid; refused: not published by the relay, on a subject that is not its key's or without its signature)."}, []string{"outcome"}),
		loads: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_store_loads_total",
			Help: "Full loads of the mesh from the store (start, gaps, resyncs)."}),
		generations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_generations_total",
			Help: "xDS generations, by kind: full, or eds (endpoint changes alone)."}, []string{"kind"}),
		convergence: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_convergence_seconds",
			Help: "From when a source observed a change to when a proxy ACKed a response containing it, per proxy and type.",
			// 15 % apart from 5 ms to 68 s, so that a quantile is close
			// enough to compare with what the proxies saw (the load test's
			// report).
			Buckets: prometheus.ExponentialBuckets(0.005, 1.15, 69)}),
		applyLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_apply_lag_seconds",
			Help:    "From when a source observed a change to when the pusher applied its event (ingest, store, relay and stream together).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_cache_lookups_total",
			Help: "Per-service generated resources looked up in the cache, by type and result (hit, miss)."}, []string{"type", "result"}),
		genTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_generation_seconds",
			Help: "Time to generate and hand over the resources.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		debounce: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_debounce_seconds",
			Help: "Time from the first change of a batch to its generation.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 10)}),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardpilot_pusher_resources",
			Help: "Resources of a type in the largest class (load assignments: mesh-wide), at the last generation."}, []string{"type"}),
		tooLarge: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_too_large_total",
			Help: "Generations whose clusters or listeners for a class of proxyless clients exceeded what grpc-go receives in one message (the class kept its last ones)."}),
		classes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_class_generations_total",
			Help: "Classes considered by a generation, by outcome: generated, or unchanged (nothing the class sees changed)."}, []string{"outcome"}),
		scope: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_scope_namespaces",
			Help: "Namespaces whose objects a pusher serving some namespaces loads and follows (0: the whole mesh)."}),
		configBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardpilot_pusher_config_bytes",
			Help: "Encoded size of a type's resources in the largest class (load assignments: mesh-wide), at the last generation."}, []string{"type"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.events, m.loads, m.generations, m.convergence, m.applyLag, m.cache, m.genTime, m.debounce, m.resources, m.configBytes, m.classes, m.tooLarge, m.scope} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("pusher: register metrics: %w", err)
			}
		}
	}
	cache, err := lru.New[string, any](cfg.CacheSize)
	if err != nil {
		return nil, fmt.Errorf("pusher: cache: %w", err)
	}
	p := &Pusher{cfg: cfg, state: newState(cfg.RootNamespace, meshSettings{noAutoMTLS: cfg.NoAutoMTLS, trustDomain: cfg.TrustDomain, agentCertificates: cfg.AgentCertificates, overrides: cfg.MeshOverrides},
		gatewayScope(cfg.SharedGatewayNamespaces)...), debouncer: d, m: m, lru: cache, conv: newConvergence(m.convergence),
		classesChanged: make(chan struct{}, 1), linger: linger{period: cfg.ClusterLinger}}
	p.placement.namespaces = slices.Compact(slices.Sorted(slices.Values(cfg.Namespaces)))
	if cfg.Registerer != nil {
		lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_pusher_bus_lag_messages",
			Help: "Change events in the stream this pusher has not consumed yet: the stream's last sequence minus the last one consumed (read at each scrape)."},
			p.busLag)
		if err := cfg.Registerer.Register(lag); err != nil {
			return nil, fmt.Errorf("pusher: register metrics: %w", err)
		}
	}
	return p, nil
}

// busLag is how many stream events the pusher has yet to consume; NaN
// when the stream cannot be read.
func (p *Pusher) busLag() float64 {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	last, err := p.cfg.Feed.LastSeq(ctx)
	if err != nil {
		return math.NaN()
	}
	return float64(last - min(last, p.consumed.Load()))
}

// Following reports whether the pusher follows the store's changes: it
// loaded the store and reads the change stream. While it does not, it
// serves what it generated last.
func (p *Pusher) Following() bool { return p.following.Load() }

// GeneratedRevision returns the store revision the served resources
// reflect, 0 before the first generation.
func (p *Pusher) GeneratedRevision() int64 { return p.generated.Load() }

// Run follows the store and generates until ctx is done.
func (p *Pusher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() {
		_ = p.debouncer.Run(ctx, p.generate)
	})
	p.follow(ctx)
	wg.Wait()
	return nil
}

// errReload ends a pass of follow so that the next one loads the store again.
var errReload = errors.New("pusher: reload requested")

func (p *Pusher) follow(ctx context.Context) {
	if p.cfg.ScopeByProxies {
		go p.served.expire(ctx, p.cfg.ScopeGrace)
	}
	for {
		pass, cancel := context.WithCancel(ctx)
		p.served.setReload(cancel)
		err := p.followOnce(pass)
		rescoped := pass.Err() != nil // asked for while following
		cancel()
		if ctx.Err() != nil {
			return
		}
		if rescoped {
			err = fmt.Errorf("%w: the namespaces served changed", errReload)
		}
		switch {
		case errors.Is(err, model.ErrRefused):
			// Not the relay's: its change is not applied, and the store
			// says what is true.
			p.m.events.WithLabelValues("refused").Inc()
			p.cfg.Log.Error("change event refused; reloading the mesh from the store", "reason", err)
			continue
		case errors.Is(err, errReload), errors.Is(err, model.ErrGap):
			p.cfg.Log.Info("reloading the mesh from the store", "reason", err)
			continue
		}
		p.cfg.Log.Warn("lost the store or the change stream; serving the last config", "err", err, "retry_in", p.cfg.RetryDelay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.cfg.RetryDelay):
		}
	}
}

// followOnce loads the store and follows the stream until an error.
func (p *Pusher) followOnce(ctx context.Context) error {
	// Take the stream position before the load: every event at or before
	// it is in the load, and later ones older than the load are skipped.
	seq, err := p.cfg.Feed.LastSeq(ctx)
	if err != nil {
		return err
	}
	items, rev, scope, err := p.load(ctx)
	if err != nil {
		return err
	}
	p.scope = scope
	p.m.scope.Set(float64(len(scope)))
	p.state.reset(items, rev)
	p.m.loads.Inc()
	p.cfg.Log.Info("mesh loaded from the store", "revision", rev, "objects", len(items), "stream_seq", seq, "namespaces", scope)
	p.debouncer.Add(change{1, time.Now(), true, time.Time{}})
	p.consumed.Store(seq)
	p.following.Store(true)
	defer p.following.Store(false)
	fn := func(n uint64, ev *meshv1.ChangeEvent) error {
		if err := p.apply(ctx, ev); err != nil {
			return err
		}
		p.consumed.Store(n)
		return nil
	}
	if scope != nil {
		return p.cfg.Feed.(ScopedFeed).ConsumeSubjects(ctx, seq+1, bus.ScopeSubjects(scope), fn)
	}
	return p.cfg.Feed.Consume(ctx, seq+1, fn)
}

// revisionJump is how far past the last applied revision an event may be
// before the store is asked whether it has come that far: a forged event
// far in the future would otherwise hold its key until the store caught up.
const revisionJump = 1 << 20

func (p *Pusher) apply(ctx context.Context, ev *meshv1.ChangeEvent) error {
	if ev == nil {
		// Its change would be lost: read the store again instead.
		p.m.events.WithLabelValues("invalid").Inc()
		return fmt.Errorf("%w: an undecodable change event", errReload)
	}
	if ev.Revision > p.state.revision()+revisionJump {
		rev, err := p.cfg.Loader.Revision(ctx)
		if err != nil {
			return err
		}
		if ev.Revision > rev {
			p.m.events.WithLabelValues("invalid").Inc()
			p.cfg.Log.Warn("change event beyond the store's revision refused", "key", ev.Key, "revision", ev.Revision, "store_revision", rev)
			return nil
		}
	}
	if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC {
		if ev.Revision > p.state.revision() {
			return fmt.Errorf("%w: resync at revision %d", errReload, ev.Revision)
		}
		return nil
	}
	k, err := model.ParseKey(ev.Key)
	if err == nil {
		var changed bool
		var obj model.Object
		changed, obj, err = p.state.apply(k, ev)
		if err == nil {
			if !changed {
				p.m.events.WithLabelValues("skipped").Inc()
				return nil
			}
			p.m.events.WithLabelValues("applied").Inc()
			if err := p.rescope(k, obj); err != nil {
				return err
			}
			observed := time.Now() // a delete: observed when it arrives
			if obj != nil && obj.GetOrigin().GetObservedAt() != nil {
				observed = obj.GetOrigin().GetObservedAt().AsTime()
				p.m.applyLag.Observe(time.Since(observed).Seconds())
			}
			p.debouncer.Add(change{1, time.Now(), k.Kind != model.KindEndpoints, observed})
			return nil
		}
	}
	// Its change would be lost: read the store again instead.
	p.m.events.WithLabelValues("invalid").Inc()
	return fmt.Errorf("%w: change event %s at revision %d: %v", errReload, ev.Key, ev.Revision, err)
}

// generate rebuilds the resources and hands them to the sink. Endpoint
// changes alone rebuild only the load assignments of the services whose
// endpoints changed (the EDS fast path). Per-service resources come from
// an LRU cache keyed by the versions of their inputs, so a generation
// costs what changed, not the mesh.
func (p *Pusher) generate(c change) {
	start := time.Now()
	p.m.debounce.Observe(start.Sub(c.since).Seconds())
	p.conv.begin(c.observed)
	p.delivered.Store(p.cfg.Sink.Backlog() == 0)
	p.gen.Add(1)
	built, index, rev := p.state.mesh()
	mesh := built.Mesh
	previous := p.index.Swap(index)
	p.last.Store(mesh)
	p.noteSettings(built.Settings)
	if !c.full && (built.Changed == nil || p.serverPorts.changed(built.Changed)) {
		// The build joined everything again (endpoints of a DNS service
		// are part of its clusters), or endpoints changed the ports
		// proxyless servers serve or gateways listen on: generate the
		// classes again.
		c.full = true
	}
	if c.full {
		p.serverPorts.record(mesh)
	}
	p.generateEndpoints(built)
	if c.full {
		classes := p.cfg.Sink.Classes()
		for _, class := range classes {
			p.generateClass(mesh, class)
		}
		p.routes.keep(classes)
		p.prints.keep(classes)
		p.linger.keep(classes)
		if previous != nil && !previous.Same(index) {
			// Sidecars, exportTo or Gateways changed: a connected proxy may
			// belong to another class now.
			select {
			case p.classesChanged <- struct{}{}:
			default:
			}
		}
		p.sizes.flush(p.m)
	}
	p.generated.Store(rev)
	kind := "full"
	if !c.full {
		kind = "eds"
	}
	p.m.generations.WithLabelValues(kind).Inc()
	p.m.genTime.Observe(time.Since(start).Seconds())
	p.cfg.Log.Debug("generated", "revision", rev, "changes", c.n, "kind", kind, "took", time.Since(start))
}

// noteSettings logs the mesh's settings when they change, and warns of
// those the pushers take from their own configuration instead.
func (p *Pusher) noteSettings(s *meshv1.MeshConfig) {
	if s == p.settings {
		return
	}
	p.settings = s
	if s == nil {
		p.cfg.Log.Info("mesh settings: istiod's defaults (no MeshConfig stored)")
		return
	}
	p.cfg.Log.Info("mesh settings applied", "from", s.GetOrigin().GetLocation(), "version", s.GetOrigin().GetSourceVersion())
	for _, d := range []struct{ field, mesh, own, flag string }{
		{"trustDomain", s.TrustDomain, cmp.Or(p.cfg.TrustDomain, "cluster.local"), "--trust-domain"},
		{"rootNamespace", s.RootNamespace, p.state.rootNamespace(), "--root-namespace"},
	} {
		if d.mesh != "" && d.mesh != d.own {
			p.cfg.Log.Warn("the mesh's MeshConfig differs from the pushers' own setting, which applies", "field", d.field,
				"meshconfig", d.mesh, "pushers", d.own, "flag", d.flag)
		}
	}
}

// generateEndpoints hands the load assignments to the sink, and their
// variants to each locality's table: every service's after a join, only
// the changed services' after an endpoint change.
func (p *Pusher) generateEndpoints(built *meshbuild.Built) {
	mesh := built.Mesh
	if built.Changed == nil || p.eds == nil {
		p.eds = make(map[string][]string, len(mesh.Services))
		var eds []*endpoint.ClusterLoadAssignment
		for _, s := range mesh.Services {
			las := cached(p, "eds", "", mesh, s, generate.ServiceLoadAssignments)
			p.eds[s.Namespace+"/"+s.Name] = names(las)
			eds = append(eds, las...)
		}
		p.edsCount = len(eds)
		publish(p, "", resource.EndpointType, eds)
		p.localities.generate(p, mesh, nil, nil)
		return
	}
	if len(built.Changed) == 0 {
		return
	}
	set := map[string]types.Resource{}
	var remove []string
	for _, s := range built.Changed {
		id := s.Namespace + "/" + s.Name
		remove = append(remove, p.eds[id]...)
		las := cached(p, "eds", "", mesh, s, generate.ServiceLoadAssignments)
		for _, la := range las {
			set[la.ClusterName] = la
		}
		p.edsCount += len(las) - len(p.eds[id])
		p.eds[id] = names(las)
	}
	_, _, size, err := p.cfg.Sink.Patch("", resource.EndpointType, set, remove)
	if err != nil {
		p.cfg.Log.Error("cache update failed", "class", "", "type", resource.EndpointType, "err", err)
		return
	}
	p.sizes.observe("ClusterLoadAssignment", p.edsCount, size)
	p.localities.generate(p, mesh, built.Changed, remove)
}

func names(las []*endpoint.ClusterLoadAssignment) []string {
	out := make([]string, len(las))
	for i, la := range las {
		out[i] = la.ClusterName
	}
	return out
}

// ClassesChanged receives after a generation in which what decides
// classes changed (Sidecars, exportTo, Gateways): connected proxies may
// belong to another class now.
func (p *Pusher) ClassesChanged() <-chan struct{} { return p.classesChanged }

// FillClass generates the resources of a class seen for the first time,
// from the last generation's mesh, before its first proxy is served.
func (p *Pusher) FillClass(class string) {
	p.prints.forget(class) // its tables are new, whatever it had before
	if m := p.last.Load(); m != nil {
		p.generateClass(m, class)
	}
}

// generateClass generates the clusters, routes and listeners of one class
// from the part of the mesh its view sees.
func (p *Pusher) generateClass(mesh *generate.Mesh, class string) {
	if gateways, ok := classify.Gateways(class); ok {
		p.generateRouter(mesh, class, gateways)
		return
	}
	proxy, view := p.index.Load().View(class)
	view.RegistryOnly = view.Outbound == meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY ||
		view.Outbound == meshv1.OutboundPolicy_OUTBOUND_POLICY_UNSET && mesh.RegistryOnly
	m := mesh.For(view)
	// Its inbound security (an Envoy's virtual inbound listener, a
	// proxyless class's servers' listeners) follows the policies that
	// apply; a proxyless class also follows the ports its namespace serves.
	security := mesh.PoliciesFor(view.Namespace, view.Policies)
	var servers string
	for _, pol := range security {
		servers += "|" + pol.Tag() + "@" + pol.Version
	}
	if proxy == generate.Proxyless {
		for _, s := range mesh.Services {
			if view.Namespace == "" || s.Namespace == view.Namespace {
				servers += s.Namespace + "/" + s.Name + ":" + p.serverPorts.of(s) + "|"
			}
		}
		for _, pol := range mesh.Policies {
			// The namespaces with policies have classes of their own.
			servers += "|" + pol.Namespace + "/" + pol.Tag() + "@" + pol.Version
		}
	}
	if !p.prints.changed(class, classPrint(m, proxy, view, p.linger.key(class), servers)) {
		// Nothing this class sees changed: its resources would be the same.
		p.m.classes.WithLabelValues("unchanged").Inc()
		return
	}
	p.m.classes.WithLabelValues("generated").Inc()
	var clusters []*cluster.Cluster
	for _, s := range m.Services {
		clusters = append(clusters, cached(p, "cds", proxy.String(), m, s, func(m *generate.Mesh, s *generate.Service) []*cluster.Cluster {
			return generate.ServiceClusters(m, s, proxy)
		})...)
	}
	clusters = append(clusters, generate.InboundClusters(m, proxy)...)
	if proxy == generate.Envoy {
		clusters = append(clusters, generate.JWKSClusters(security)...)
	}
	clusters = append(clusters, generate.CatchAllClusters(m, proxy)...)
	p.publishClusters(class, clusters)
	publish(p, class, resource.RouteType, p.routes.reuse(class, generate.RoutesFrom(m, proxy, p.virtualHost(proxy))))
	listeners := generate.Listeners(m, proxy, security)
	if proxy == generate.Proxyless {
		listeners = append(listeners, generate.ServerListeners(mesh, view.Namespace, security)...)
	}
	publish(p, class, resource.ListenerType, listeners)
}

// serverPorts remembers, from the last full generation, the ports each
// service's proxyless servers got listeners for and the target ports it
// gives the gateways' server ports; and the gateways' selectors, which
// change only with a full generation.
type serverPorts struct {
	mu      sync.Mutex
	print   map[string]string
	targets generate.GatewayTargets
}

func (s *serverPorts) record(mesh *generate.Mesh) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.targets = generate.NewGatewayTargets(mesh.Gateways)
	s.print = make(map[string]string, len(mesh.Services))
	for _, svc := range mesh.Services {
		s.print[svc.Namespace+"/"+svc.Name] = s.printOf(svc)
	}
}

// printOf prints a service's ports; s.mu is held.
func (s *serverPorts) printOf(svc *generate.Service) string {
	return generate.ServicePortsPrint(svc) + "|" + s.targets.Print(svc)
}

// of returns a service's ports as recorded (computed when it is new).
func (s *serverPorts) of(svc *generate.Service) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if print, ok := s.print[svc.Namespace+"/"+svc.Name]; ok {
		return print
	}
	return s.printOf(svc)
}

// changed reports whether endpoint changes gave a service another set of
// served ports, or moved a gateway's target port: the listeners of
// proxyless servers or routers must be generated again, not only the load
// assignments.
func (s *serverPorts) changed(services []*generate.Service) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, svc := range services {
		if s.print[svc.Namespace+"/"+svc.Name] != s.printOf(svc) {
			return true
		}
	}
	return false
}

// virtualHost returns the virtual hosts for a kind of proxy from the LRU
// cache, keyed by the versions of their inputs: a VirtualService change
// regenerates only the virtual hosts of the hosts it names.
func (p *Pusher) virtualHost(proxy generate.Proxy) generate.VirtualHostFunc {
	return func(m *generate.Mesh, host string, port uint32) *route.VirtualHost {
		key := "vh|" + proxy.String() + "|" + host + ":" + strconv.FormatUint(uint64(port), 10) + "|" + generate.VirtualHostInputs(m, host, port)
		if v, ok := p.lru.Get(key); ok {
			p.m.cache.WithLabelValues("vh", "hit").Inc()
			return v.(*route.VirtualHost)
		}
		p.m.cache.WithLabelValues("vh", "miss").Inc()
		vh := generate.VirtualHost(m, host, port)
		if proxy == generate.Envoy {
			vh = generate.SidecarVirtualHost(m, host, port)
		}
		p.lru.Add(key, vh)
		return vh
	}
}

// routeMemo keeps each class's last route configurations, so that one
// made of the same virtual hosts is handed to the cache as the same object
// and neither encoded nor sent again: only the route configurations a
// change touched are new.
type routeMemo struct {
	mu   sync.Mutex
	last map[string]map[string]*route.RouteConfiguration // class → name → configuration
}

func (r *routeMemo) reuse(class string, rcs []*route.RouteConfiguration) []*route.RouteConfiguration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		r.last = map[string]map[string]*route.RouteConfiguration{}
	}
	prev := r.last[class]
	next := make(map[string]*route.RouteConfiguration, len(rcs))
	for i, rc := range rcs {
		if old, ok := prev[rc.Name]; ok && slices.Equal(old.VirtualHosts, rc.VirtualHosts) {
			rcs[i] = old
		}
		next[rc.Name] = rcs[i]
	}
	r.last[class] = next
	return rcs
}

// prints holds, per class, a hash of everything its last generation read,
// so that a change the class does not see costs it nothing.
type prints struct {
	mu   sync.Mutex
	last map[string]uint64
}

// changed records a class's print and reports whether it differs from
// the last one.
func (pr *prints) changed(class string, print uint64) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.last == nil {
		pr.last = map[string]uint64{}
	}
	old, ok := pr.last[class]
	pr.last[class] = print
	return !ok || old != print
}

func (pr *prints) forget(class string) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	delete(pr.last, class)
}

// keep forgets the classes not listed (dropped by the sink).
func (pr *prints) keep(classes []string) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	for class := range pr.last {
		if !slices.Contains(classes, class) {
			delete(pr.last, class)
		}
	}
}

// classPrint hashes what a class's clusters, routes and listeners are made
// of: the kind of proxy, its view, the mesh's settings, the services it
// sees with the versions of their configuration (not of their endpoints),
// every route rule, and the removed clusters it still serves (lingering).
func classPrint(m *generate.Mesh, proxy generate.Proxy, view generate.View, lingering, servers string) uint64 {
	h := fnv.New64a()
	write := func(parts ...string) {
		for _, s := range parts {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	write(proxy.String(), view.Namespace, lingering, servers, strconv.FormatBool(view.RegistryOnly), m.ConfigVersion)
	write(view.Egress...)
	for _, il := range view.Ingress {
		write("i", strconv.FormatUint(uint64(il.Port), 10), il.Protocol.String(), il.DefaultEndpoint)
	}
	for _, port := range slices.Sorted(maps.Keys(view.EgressPorts)) {
		write(strconv.FormatUint(uint64(port), 10))
		write(view.EgressPorts[port]...)
	}
	for _, s := range m.Services {
		write("s", s.Namespace, s.Name, s.ConfigVersion)
	}
	for _, r := range m.Routes {
		write("r", r.Namespace, r.Name, r.Version)
	}
	return h.Sum64()
}

// publishClusters hands over a class's clusters with those it lost less
// than ClusterLinger ago (make before break), and schedules the generation
// that drops them.
func (p *Pusher) publishClusters(class string, clusters []*cluster.Cluster) {
	out, next := p.linger.apply(class, clusters, p.gen.Load(), p.delivered.Load(), time.Now())
	publish(p, class, resource.ClusterType, out)
	if next.IsZero() {
		return
	}
	// A generation to drop them: held (up to the maximum hold) until this
	// one's pushes are written and answered, and one at the latest.
	p.debouncer.Add(change{1, time.Now(), true, time.Time{}})
	if p.lingerDue.CompareAndSwap(false, true) {
		time.AfterFunc(time.Until(next), func() {
			p.lingerDue.Store(false)
			p.debouncer.Add(change{1, time.Now(), true, time.Time{}})
		})
	}
}

// tooLarge reports, and logs and counts, resources a class's proxies could
// not receive: the clusters or listeners of proxyless clients above what
// grpc-go takes in one message.
func tooLarge[R types.Resource](p *Pusher, class, typeURL string, list []R) bool {
	if !strings.HasPrefix(class, generate.Proxyless.String()) || (typeURL != resource.ClusterType && typeURL != resource.ListenerType) {
		return false
	}
	size := 0
	for _, r := range list {
		size += proto.Size(r)
	}
	if size <= p.cfg.MaxProxylessResponse {
		return false
	}
	p.m.tooLarge.Inc()
	p.cfg.Log.Error("resources too large for proxyless clients; the class keeps its last ones",
		"class", class, "type", typeURL, "resources", len(list), "bytes", size, "limit", p.cfg.MaxProxylessResponse,
		"hint", "limit what these clients see with a Sidecar (egress hosts)")
	return true
}

// keep forgets the classes not listed (dropped by the sink).
func (r *routeMemo) keep(classes []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for class := range r.last {
		if !slices.Contains(classes, class) {
			delete(r.last, class)
		}
	}
}

// generateRouter generates the resources of a class of gateway proxies:
// every service's clusters, and the listeners and routes of its gateways.
func (p *Pusher) generateRouter(mesh *generate.Mesh, class string, selected []string) {
	var gws []*generate.Gateway
	for _, g := range mesh.Gateways {
		if slices.Contains(selected, g.Key()) {
			gws = append(gws, g)
		}
	}
	var clusters []*cluster.Cluster
	auto := generate.AutoPassthrough(gws)
	for _, s := range mesh.Services {
		cs := cached(p, "cds", generate.Envoy.String(), mesh, s, func(m *generate.Mesh, s *generate.Service) []*cluster.Cluster {
			return generate.ServiceClusters(m, s, generate.Envoy)
		})
		clusters = append(clusters, cs...)
		if auto {
			// Cached like the clusters they copy, so that a generation
			// hands the same objects over and nothing is encoded again.
			clusters = append(clusters, cached(p, "sni", generate.Envoy.String(), mesh, s, func(*generate.Mesh, *generate.Service) []*cluster.Cluster {
				return generate.SNIClusters(cs)
			})...)
		}
	}
	clusters = append(clusters, generate.CatchAllClusters(mesh, generate.Envoy)...)
	p.publishClusters(class, clusters)
	listen := generate.ListenPorts(mesh, gws)
	publish(p, class, resource.RouteType, generate.GatewayRoutes(mesh, gws, listen))
	publish(p, class, resource.ListenerType, generate.GatewayListeners(mesh, gws, listen))
}

// cached returns a service's resources of one kind from the LRU cache, or
// generates and caches them.
func cached[R any](p *Pusher, kind, class string, m *generate.Mesh, s *generate.Service, gen func(*generate.Mesh, *generate.Service) []R) []R {
	// Load assignments follow endpoints; clusters only the service and its policy.
	version := s.ConfigVersion
	if kind == "eds" || kind == "eds@" {
		version = s.Version
	}
	key := kind + "|" + class + "|" + s.Namespace + "/" + s.Name + "|" + version + "|" + m.ConfigVersion + "|" + strings.Join(m.Owned(s), ",")
	if v, ok := p.lru.Get(key); ok {
		p.m.cache.WithLabelValues(kind, "hit").Inc()
		return v.([]R)
	}
	p.m.cache.WithLabelValues(kind, "miss").Inc()
	out := gen(m, s)
	p.lru.Add(key, out)
	return out
}

// publish hands resources to the sink, which validates each new one: a
// proxy must never be sent what it would reject.
func publish[R types.Resource](p *Pusher, class, typeURL string, list []R) {
	out := make(map[string]types.Resource, len(list))
	for _, r := range list {
		out[gcpcache.GetResourceName(r)] = r
	}
	if tooLarge(p, class, typeURL, list) {
		return
	}
	changed, removed, size, err := p.cfg.Sink.Update(class, typeURL, out)
	if err != nil {
		p.cfg.Log.Error("cache update failed", "class", class, "type", typeURL, "err", err)
		return
	}
	p.sizes.observe(typeURL[strings.LastIndex(typeURL, ".")+1:], len(out), size)
	if changed+removed > 0 {
		p.cfg.Log.Debug("resources updated", "class", class, "type", typeURL, "changed", changed, "removed", removed)
	}
}

// gatewayScope returns the index options of the shared gateway namespaces.
func gatewayScope(namespaces []string) []classify.Option {
	if namespaces == nil {
		return nil
	}
	return []classify.Option{classify.SharedGatewayNamespaces(namespaces)}
}
