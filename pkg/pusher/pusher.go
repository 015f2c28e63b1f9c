package pusher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/classify"
	"github.com/shardpilot/shardpilot/pkg/debounce"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/patch"
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

// Tables receive the generated resources of a class and type: the cache.
type Tables interface {
	// Update makes a table hold exactly resources.
	Update(class cache.Class, typeURL string, resources map[string]types.Resource) (changed, removed, bytes int, err error)
	// Patch sets some resources of a table and removes some names.
	Patch(class cache.Class, typeURL string, set map[string]types.Resource, remove []string) (changed, removed, bytes int, err error)
	// Classes returns the classes the tables serve, with those being
	// filled (FillClass).
	Classes() []cache.Class
	// Backlog returns how many proxy watches still have a change due, or
	// a response unanswered: while it is not zero, the last generation is
	// still being written.
	Backlog() int64
	// Holding returns the part of the backlog the next generation waits
	// for (up to MaxHold) to take more changes together: all of it but
	// the watches sent a response in parts (see cache.Owed).
	Holding() int64
	// BeginEpoch numbers a new generation before it updates any table
	// (see cache.Cache.BeginEpoch).
	BeginEpoch() int64
}

// The classes of proxy the pusher generates for, and the types it serves per
// class and mesh-wide.
var (
	Classes     = []cache.Class{cache.Class(generate.Envoy.String()), cache.Class(generate.Proxyless.String())}
	ClassTypes  = []string{resource.ClusterType, resource.ListenerType, resource.RouteType}
	SharedTypes = []string{resource.EndpointType}
	// VHDSTypes are the types per class of the route configurations as an
	// Envoy that takes their virtual hosts apart is sent them (see
	// Config.VirtualHosts): a cache the pusher fills holds them beside
	// ClassTypes.
	VHDSTypes = []string{cache.VHDSRoutesType, resource.VirtualHostType}
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
	// VirtualHosts makes the sidecars' and gateways' classes also hold their route
	// configurations taken apart (VHDSTypes), which the Envoys that speak
	// Delta are sent (the server's Hooks.OnVirtualHosts, VirtualHosts): a
	// route change sends them the virtual host it changed, not its port's
	// whole route configuration.
	VirtualHosts bool
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
	Tables     Tables
	// Localities, when set, receives the load assignments as the proxies
	// of each locality class it holds see them (see FillLocality); their
	// class is generate.LocalityName of the proxy's locality.
	Localities Tables
	Log        *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// Quiet is the debounce quiet period: it takes the events of one
	// store transaction or source sync together. Batching beyond that
	// adapts to load: a generation waits while the last one's pushes are
	// still being written (Tables.Backlog), and each stream coalesces what
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
	// StoreCheck is how often the pusher asks the store, when the Loader
	// can tell (StoreWatcher), whether it holds changes the change stream
	// has not brought. Default 5s; negative never asks.
	StoreCheck time.Duration
	// CacheSize bounds the per-service generated resources kept, about
	// six per service port (clusters and virtual hosts of each kind of
	// proxy, load assignments and their locality variants). Default
	// 1,000,000: CacheBytes is the bound that holds (100,000 entries
	// missed at every generation past about 17,000 services, and each
	// miss made every class check and encode its objects anew).
	CacheSize int
	// CacheBytes bounds them by their encoded size as well. Default 256 MiB.
	CacheBytes int64
	// CacheIdle is how long a generated resource no generation used is
	// kept. Default 5m; negative keeps it until the bounds push it out.
	CacheIdle time.Duration
	// ClusterLinger is how long a cluster a class no longer has is still
	// served, so that the routes that stop naming it reach the proxies
	// first (make before break). Default 5s; negative removes at once.
	ClusterLinger time.Duration
	// MaxProxylessResponse bounds one response to a proxyless client
	// (ResponseLimit): grpc-go refuses a message above 4 MiB (and the
	// stream with it). grpc-go names the clusters and listeners it needs,
	// so a class's whole set may be larger; it is reported when it is.
	// Default 4 MiB less 64 KiB for the envelope.
	MaxProxylessResponse int
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Loader == nil || c.Feed == nil || c.Tables == nil {
		return errors.New("pusher: a loader, a feed and tables are required")
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
	if c.StoreCheck == 0 {
		c.StoreCheck = 5 * time.Second
	}
	if c.CacheBytes == 0 {
		c.CacheBytes = 256 << 20
	}
	if c.CacheIdle == 0 {
		c.CacheIdle = 5 * time.Minute
	}
	if c.CacheSize == 0 {
		c.CacheSize = 1_000_000
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
	generated atomic.Int64 // revision of the last generation, 0 before the first
	following atomic.Bool  // the store is loaded and the stream followed
	applied   atomic.Int64 // the highest revision the owner applied
	// lostAt is when the pusher last stopped following (its start before
	// it first did), in Unix nanoseconds.
	lostAt atomic.Int64
	// behind is when a change the store holds and the stream has not
	// brought was first seen (Unix nanoseconds; 0: none), behindRev its
	// revision (see checkStore).
	behind, behindRev atomic.Int64
	consumed          atomic.Uint64 // the stream sequence of the last event consumed
	// lru holds per-service generated resources by their inputs' versions.
	lru *genCache
	// settings are the mesh's stored settings of the last generation
	// (owned by the generating goroutine).
	settings *meshv1.MeshConfig
	// index classifies proxies (read by the streams).
	index atomic.Pointer[classify.Index]
	conv  *convergence
	// arrivals carry what the follow goroutine read to the owner, the
	// goroutine that applies and generates (owner.go); inbox carries the
	// streams' fills and questions to it; stopped is closed when it has
	// stopped. What follows, up to placement, is the owner's alone.
	arrivals chan arrival
	inbox    chan func()
	stopped  chan struct{}
	// pass is the follow pass whose load the owner took last, passEnd
	// ends it (nil once ended).
	pass    uint64
	passEnd context.CancelCauseFunc
	// last is the mesh of the last generation, for a class or locality
	// seen between generations.
	last        *generate.Mesh
	sizes       sizes
	routes      routeMemo
	prints      prints
	serverPorts serverPorts
	// fullTook is how long the last full generation took.
	fullTook time.Duration
	// reroutes counts the generations that rerouted classes since the
	// memos were last swept (see maxReroutes).
	reroutes int
	linger   linger
	// gen numbers the generations; delivered says whether the last wave of
	// pushes was written and answered when the current one began.
	gen       uint64
	delivered bool
	// genAt is when the current generation began: the time lingering
	// clusters are stamped with and let go by, alike for every class.
	genAt time.Time
	// lingerAt is when the owner asks, at the latest, for the generation
	// that drops lingering clusters (zero: none).
	lingerAt time.Time
	// classesChanged says that what decides classes changed.
	classesChanged chan struct{}
	// eds holds, by service, the names of the load assignments last
	// handed to the tables, and edsCount how many there are (owned by the
	// generating goroutine): an endpoint change replaces only its
	// services' assignments.
	eds      map[string][]string
	edsCount int
	// oversize holds the proxyless classes and types whose set last passed
	// MaxProxylessResponse ("<class> <type>"), logged once each.
	oversize map[string]bool
	// refused holds the EnvoyFilter refusals logged (see noteRefusals),
	// and patchValues the EnvoyFilters' decoded values (both owned by the
	// generating goroutine).
	refused     map[string]bool
	patchValues patch.Decoded
	// apiListeners are proxyless clients' listeners, and vhds the route
	// configurations taken apart (both owned by the generating goroutine).
	apiListeners apiListeners
	vhds         virtualHosts
	// sidecars are every Sidecar, and scope the namespaces loaded (nil:
	// all), of a pusher serving some namespaces.
	sidecars map[model.Key]*meshv1.Scope
	scope    []string
	// root is the mesh's root namespace.
	root string
	// served tracks the namespaces served by proxies (ScopeByProxies).
	served served
	// placement is the namespaces served (Namespaces, changed by Place).
	placement struct {
		mu         sync.Mutex
		namespaces []string
	}
}

// change is what the debouncer merges: how many changes, since when,
// whether any of them was more than an endpoint change, and how many were
// endpoint changes.
type change struct {
	n     int
	since time.Time
	full  bool
	// whole asks for every class to be generated whole, whatever changed
	// (see Pusher.rerouteClass).
	whole bool
	// observed is when the earliest change other than an endpoint change
	// was observed at its source; zero for a reload.
	observed time.Time
	// endpoints counts the endpoint changes, the earliest observed at
	// endpointsObserved.
	endpoints         int
	endpointsObserved time.Time
}

// fullChange is a change that generates every class: a reload, a
// lingering cluster let go, at at.
func fullChange(at time.Time) change { return change{n: 1, since: at, full: true, whole: true} }

// merge folds b into c.
func (c change) merge(b change) change {
	return change{n: c.n + b.n, since: c.since, full: c.full || b.full, whole: c.whole || b.whole, observed: earliest(c.observed, b.observed),
		endpoints: c.endpoints + b.endpoints, endpointsObserved: earliest(c.endpointsObserved, b.endpointsObserved)}
}

// earliestObserved is when the earliest of the changes was observed.
func (c change) earliestObserved() time.Time { return earliest(c.observed, c.endpointsObserved) }

// earliest returns the earlier of two times, zero standing for none.
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || !b.IsZero() && b.Before(a) {
		return b
	}
	return a
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
	refusals    prometheus.Counter
	scope       prometheus.Gauge
	cacheBytes  prometheus.Gauge
	drained     prometheus.Gauge
	storeBack   prometheus.Counter
	byReference prometheus.Counter
	// impossibleClock counts changes whose observed time is impossible.
	impossibleClock prometheus.Counter
}

// New returns a Pusher.
func New(cfg Config) (*Pusher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := debounce.New(debounce.Config[change]{
		Quiet: cfg.Quiet, MaxDelay: cfg.MaxDelay, MaxHold: cfg.MaxHold,
		Hold:  func() bool { return cfg.Tables.Holding() > 0 },
		Merge: change.merge,
	})
	if err != nil {
		return nil, fmt.Errorf("pusher: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	memo, err := newGenCache(cfg.CacheSize, cfg.CacheBytes, cfg.CacheIdle, m.cacheBytes)
	if err != nil {
		return nil, fmt.Errorf("pusher: cache: %w", err)
	}
	p := &Pusher{cfg: cfg, state: newState(cfg.RootNamespace, meshSettings{noAutoMTLS: cfg.NoAutoMTLS, trustDomain: cfg.TrustDomain, agentCertificates: cfg.AgentCertificates, overrides: cfg.MeshOverrides},
		gatewayBinding(cfg.SharedGatewayNamespaces)...), debouncer: d, m: m, lru: memo, oversize: map[string]bool{}, refused: map[string]bool{}, conv: newConvergence(m.convergence, cfg.Tables.BeginEpoch),
		classesChanged: make(chan struct{}, 1), linger: linger{period: cfg.ClusterLinger},
		arrivals: make(chan arrival, arrivalsQueued), inbox: make(chan func()), stopped: make(chan struct{})}
	p.root = p.state.b.RootNamespace
	p.served.reloads = make(chan struct{}, 1)
	p.lostAt.Store(time.Now().UnixNano())
	p.placement.namespaces = slices.Compact(slices.Sorted(slices.Values(cfg.Namespaces)))
	p.noteDrained()
	if cfg.Registerer != nil {
		stale := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_pusher_stale_seconds",
			Help: "Seconds the pusher has been behind the store (0 while it is not): since it stopped following the store's changes (etcd or NATS out of reach), or since it first found a change in the store that the change stream has not brought (a stuck relay, a broken stream). It serves what it generated last, which may be that old, and stays ready."},
			func() float64 { return p.Stale().Seconds() })
		if err := cfg.Registerer.Register(stale); err != nil {
			return nil, fmt.Errorf("pusher: register metrics: %w", err)
		}
		lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_pusher_bus_lag_messages",
			Help: "Change events in the stream this pusher has not consumed yet: the stream's last sequence minus the last one consumed (read at each scrape)."},
			p.busLag)
		if err := cfg.Registerer.Register(lag); err != nil {
			return nil, fmt.Errorf("pusher: register metrics: %w", err)
		}
		backlog := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_pusher_xds_backlog", Help: backlogHelp},
			func() float64 { return float64(cfg.Tables.Backlog()) })
		if err := cfg.Registerer.Register(backlog); err != nil {
			return nil, fmt.Errorf("pusher: register metrics: %w", err)
		}
	}
	return p, nil
}

const backlogHelp = "Subscriptions with a change due or a response unanswered, leaving out the streams behind (--answer-wait): while above 0, the next generation waits, up to --debounce-max-hold."

// newMetrics makes the pusher's metrics, registered with reg when it is
// not nil.
func newMetrics(reg prometheus.Registerer) (metrics, error) {
	m := metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_events_total",
			Help: "Change events consumed, by outcome (applied, skipped, invalid; refused: not published by the relay, on a subject that is not its key's or without its signature)."}, []string{"outcome"}),
		loads: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_store_loads_total",
			Help: "Full loads of the mesh from the store (start, gaps, resyncs)."}),
		generations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_generations_total",
			Help: "xDS generations, by kind: full, routes (route rules that changed virtual hosts alone, and endpoints), or eds (endpoint changes alone)."}, []string{"kind"}),
		convergence: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_convergence_seconds",
			Help: "From when a source observed a change to when a proxy ACKed a response containing it, per proxy and type.",
			// 15 % apart from 5 ms to 68 s, so that a quantile is close
			// enough to compare with what the proxies saw (the load test's
			// report).
			Buckets: prometheus.ExponentialBuckets(0.005, 1.15, 69)}),
		applyLag: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_apply_lag_seconds",
			Help:    "From when a source observed a change to when the pusher read its event (ingest, store, relay and stream together).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		cache: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_cache_lookups_total",
			Help: "Per-service generated resources looked up in the cache, by type and result (hit, miss)."}, []string{"type", "result"}),
		genTime: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_generation_seconds",
			Help: "Time to generate and hand over the resources.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		debounce: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_debounce_seconds",
			Help: "Time from the first change of a batch to its generation.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 10)}),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardpilot_pusher_resources",
			Help: "Resources of a type in the largest class (load assignments: mesh-wide), at the last generation."}, []string{"type"}),
		drained: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_drained",
			Help: "1 while a placed pusher's placement names no namespace (a shard being removed): it is meant to serve no proxy."}),
		cacheBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_generation_cache_bytes",
			Help: "Encoded bytes of the generated resources the pusher keeps for reuse (bounded by --cache-bytes; what no generation used for --cache-idle is forgotten)."}),
		tooLarge: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_too_large_total",
			Help: "Generations whose clusters or listeners for a class of proxyless clients exceeded what grpc-go receives in one message: served all the same, each client being sent those it names (a response past the limit is counted in shardpilot_pusher_xds_limited_total{limit=\"response_size\"})."}),
		refusals: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_envoyfilter_refusals_total",
			Help: "EnvoyFilter patches not applied to a resource because the result would be invalid (or the value is not the resource's type), each counted once: the resource is served without the patch, and the refusal is logged."}),
		classes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_class_generations_total",
			Help: "Classes considered by a generation, by outcome: generated, rerouted (only the virtual hosts a route change changed), or unchanged (nothing the class sees changed)."}, []string{"outcome"}),
		scope: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_scope_namespaces",
			Help: "Namespaces whose objects a pusher serving some namespaces loads and follows (0: the whole mesh)."}),
		impossibleClock: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_impossible_observed_times_total",
			Help: "Changes whose source stamped an impossible observed time (after their arrival, or over 10 minutes before it: the ingester's clock is off); their convergence is measured from their arrival at the pusher."}),
		byReference: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_events_by_reference_total",
			Help: "Change events carried by reference (their value too large for the bus), whose value the pusher read from the store."}),
		storeBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_store_restores_total",
			Help: "Times the store's revision was found below what the pusher applied (etcd restored from a snapshot): the mesh was loaded again."}),
		configBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardpilot_pusher_config_bytes",
			Help: "Encoded size of a type's resources in the largest class (load assignments: mesh-wide), at the last generation."}, []string{"type"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.events, m.loads, m.generations, m.convergence, m.applyLag, m.cache, m.genTime, m.debounce, m.resources, m.configBytes, m.classes, m.tooLarge, m.refusals, m.scope, m.cacheBytes, m.drained, m.storeBack, m.byReference, m.impossibleClock} {
			if err := reg.Register(c); err != nil {
				return metrics{}, fmt.Errorf("pusher: register metrics: %w", err)
			}
		}
	}
	return m, nil
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

// Stale says how long the pusher has not followed the store's changes: 0
// while it does. What it serves may be that old. It stays ready: a proxy
// is better served the last config than none.
func (p *Pusher) Stale() time.Duration {
	if !p.following.Load() {
		return time.Since(time.Unix(0, p.lostAt.Load()))
	}
	if b := p.behind.Load(); b != 0 {
		return time.Since(time.Unix(0, b))
	}
	return 0
}

// StaleReason says why the pusher is stale ("" when it is not): it does not
// follow the change stream, or it follows it while the store holds a
// change the stream has not brought.
func (p *Pusher) StaleReason() string {
	if !p.following.Load() {
		return fmt.Sprintf("stale: not following the store's changes, serving the last config (for %s)", p.Stale().Round(time.Second))
	}
	if b := p.behind.Load(); b != 0 {
		return fmt.Sprintf("stale: behind the store, its change at revision %d has not come on the change stream (for %s)",
			p.behindRev.Load(), time.Since(time.Unix(0, b)).Round(time.Second))
	}
	return ""
}

// GeneratedRevision returns the store revision the served resources
// reflect, 0 before the first generation.
func (p *Pusher) GeneratedRevision() int64 { return p.generated.Load() }

// arrivalsQueued is how many events the follow goroutine may read and
// decode ahead of the owner, while it generates: enough for a heavy input
// (tens of thousands of objects at once) to be read during one long
// generation and taken whole by the next, rather than a queue's worth per
// generation.
const arrivalsQueued = 1 << 16

// Run follows the store and generates until ctx is done; nothing it
// started outlives it.
func (p *Pusher) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() { p.own(ctx) })
	if p.cfg.ScopeByProxies {
		wg.Go(func() { p.served.expire(ctx, p.cfg.ScopeGrace) })
	}
	p.follow(ctx)
	wg.Wait()
	return nil
}

// ClassesChanged receives after a generation in which what decides
// classes changed (Sidecars, exportTo, Gateways): connected proxies may
// belong to another class now.
func (p *Pusher) ClassesChanged() <-chan struct{} { return p.classesChanged }

// gatewayBinding returns the index options of the shared gateway namespaces.
func gatewayBinding(namespaces []string) []classify.Option {
	if namespaces == nil {
		return nil
	}
	return []classify.Option{classify.SharedGatewayNamespaces(namespaces)}
}
