package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Object is one normalized object a source holds.
type Object struct {
	Key    model.Key
	Object model.Object
	// Resource names the input as its user knows it, for example
	// "VirtualService demo/greeter"; the key's kind and name when empty.
	Resource string
}

func (o Object) resource() string {
	if o.Resource != "" {
		return o.Resource
	}
	return string(o.Key.Kind) + " " + o.Key.Namespace + "/" + o.Key.Name
}

// Problem is an input a source could not turn into a valid object.
type Problem struct {
	// Location is where the input is, for example "mesh/a.yaml document 2".
	Location string
	// Resource names the input, for example "VirtualService default/reviews",
	// when it could be read.
	Resource string
	// Field is the path of the offending field, when there is one.
	Field  string
	Reason string
	// Keep is the key whose stored version stays in effect, when known.
	Keep *model.Key
	// KeepLocation keeps every stored object whose origin location is it or
	// lies within it ("a.yaml" holds "a.yaml document 2"): the source could
	// not tell what that location holds now.
	KeepLocation string
	// Warning says the input is applied all the same: a field that has no
	// effect yet, said rather than dropped in silence.
	Warning bool
}

func (p Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.Location)
	if p.Resource != "" {
		b.WriteString(" (" + p.Resource + ")")
	}
	b.WriteString(": ")
	if p.Warning {
		b.WriteString("warning: ")
	}
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Reason)
	return b.String()
}

// Store is what a Syncer needs of the store. A write names the mod
// revision the Syncer last saw for the key (0: absent), so that it is one
// round trip when the store agrees; rev is the key's mod revision after a
// put and the store revision after a delete.
type Store interface {
	PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (written bool, rev int64, err error)
	DeleteAt(ctx context.Context, k model.Key, modRev int64) (deleted bool, rev int64, err error)
	List(ctx context.Context) (items []model.Stored, rev int64, errs []error, err error)
	// Revision is the store's current revision.
	Revision(ctx context.Context) (int64, error)
}

// Sink is what a source writes what it read through: a *Syncer.
type Sink interface {
	Sync(ctx context.Context, objs []Object, problems []Problem) (Result, error)
	SyncPart(ctx context.Context, scope []string, objs []Object, problems []Problem) (Result, error)
	// Forget makes the next sync read the store again.
	Forget()
	// Pending, RetryPending and Stored: see Syncer.
	Pending() bool
	RetryPending(ctx context.Context) (Result, error)
	Stored(ctx context.Context, k model.Key) (model.Object, error)
}

var _ Sink = (*Syncer)(nil)

// Config configures a Syncer.
type Config struct {
	// Source names the source; it is stamped into each object's origin and
	// decides which stored objects the Syncer owns.
	Source string
	// Adopts, when set, says which objects another source wrote this one
	// owns too (from its first listing of the store on): those of the
	// sources it replaces, such as a cluster's namespaces split into other
	// parts before.
	Adopts func(source string, k model.Key) bool
	Store  Store
	Log    *slog.Logger
	// Metrics are shared by every Syncer of a process (they are labelled by
	// source); nil keeps them unregistered.
	Metrics *Metrics
	// MaxObjectSize bounds the encoded size of a stored object. Default
	// MaxObjectSize.
	MaxObjectSize int
}

// MaxObjectSize bounds the encoded size of one stored object: well below
// etcd's request limit (1.5 MiB by default) and NATS's message limit
// (1 MiB by default), with room for the change event around it. A larger
// set of endpoints is split into chunks stored under keys of their own, as
// Kubernetes splits endpoints into EndpointSlices; any other object that
// large is rejected.
const MaxObjectSize = 512 << 10

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Source == "" {
		return errors.New("ingest: a source name is required")
	}
	if c.Store == nil {
		return errors.New("ingest: a store is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.MaxObjectSize == 0 {
		c.MaxObjectSize = MaxObjectSize
	}
	return nil
}

// Metrics are the ingest metrics, labelled by source.
type Metrics struct {
	rejected *prometheus.CounterVec
	warnings *prometheus.CounterVec
	writes   *prometheus.CounterVec
	objects  *prometheus.GaugeVec
	latency  *prometheus.HistogramVec
	lag      *prometheus.HistogramVec

	mu      sync.Mutex
	current map[string][]Problem // by source
}

// Problems returns every source's current problems, as of its last sync
// (for the status page).
func (m *Metrics) Problems() map[string][]Problem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.current)
}

// Forget drops a source's problems, when this process stops syncing it
// (it lost the source's leadership): the new leader reports them. A nil
// Metrics forgets nothing.
func (m *Metrics) Forget(source string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.current, source)
}

func (m *Metrics) setProblems(source string, problems []Problem) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current == nil {
		m.current = map[string][]Problem{}
	}
	m.current[source] = slices.Clone(problems)
}

// NewMetrics creates the ingest metrics and registers them on reg (nil
// registers nothing).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_rejected_objects_total",
			Help: "Inputs rejected as invalid (normalization and validation errors), by source."}, []string{"source"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_ignored_fields_total",
			Help: "Inputs applied with a field that has no effect yet (said, never dropped in silence), by source."}, []string{"source"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_store_writes_total",
			Help: "Store writes by source, kind and operation (put, delete)."}, []string{"source", "kind", "op"}),
		objects: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardpilot_ingest_objects",
			Help: "Objects a source holds in the store, by kind."}, []string{"source", "kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardpilot_ingest_store_write_seconds",
			Help: "Latency of one guarded store write (put or delete), by source.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"source"}),
		lag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardpilot_ingest_commit_lag_seconds",
			Help:    "From when a source observed an object to when its write committed (the first stage of convergence), by source.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}, []string{"source"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.rejected, m.warnings, m.writes, m.objects, m.latency, m.lag} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("ingest: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Syncer makes the store hold what one source holds. It remembers what it
// read and wrote (each object of its source with its mod revision, and the
// hosts and endpoints of every stored object), so that a sync costs what
// changed: the store is listed at first, after Forget and after a failed
// write, not at every sync.
type Syncer struct {
	cfg Config
	m   *Metrics

	// loaded says mine and ix hold the store as of the last list plus
	// this Syncer's writes since.
	loaded bool
	// listed is the store revision of the last list: RetryPending lists
	// again only once the store moved past it.
	listed int64
	mine   map[model.Key]held
	ix     *index
	// problems are the current ones, every location's.
	problems []Problem
	// pending holds the objects rejected only for a reference to a host
	// or subset that does not exist yet: every sync tries them again.
	pending map[model.Key]Object
	// reported holds the problems already logged and counted, so that an
	// input that stays bad is reported once, not at every sync.
	reported map[string]bool
}

// held is one stored object of this source and its mod revision.
type held struct {
	obj    model.Object
	modRev int64
}

func (h held) location() string { return h.obj.GetOrigin().GetLocation() }

// NewSyncer returns a Syncer.
func NewSyncer(cfg Config) (*Syncer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := cfg.Metrics
	if m == nil {
		m, _ = NewMetrics(nil)
	}
	return &Syncer{cfg: cfg, m: m, reported: map[string]bool{}}, nil
}

// Result says what one Sync did.
type Result struct {
	Written, Deleted, Unchanged int
	// Revision is the store revision of the last write, 0 when nothing was written.
	Revision int64
	// Problems are every current problem of the source, not only the
	// synced part's.
	Problems []Problem
}

// Sync makes the store hold objs as this source's whole content: it
// writes the valid objects that changed and deletes this source's other
// objects, except those that problems say to keep. Every problem, the
// source's and the ones Sync finds, is logged, counted and returned. It
// lists the store only when it does not know what the store holds: at
// first, after Forget and after a failed write.
func (s *Syncer) Sync(ctx context.Context, objs []Object, problems []Problem) (Result, error) {
	if !s.loaded {
		if err := s.load(ctx); err != nil {
			return Result{}, err
		}
	}
	return s.apply(ctx, nil, objs, problems)
}

// SyncPart is Sync for part of the source: objs and problems are what the
// locations scope names hold now (an entry names a location and every
// location it prefixes followed by a space, as KeepLocation does). The
// rest stays as the last sync left it.
func (s *Syncer) SyncPart(ctx context.Context, scope []string, objs []Object, problems []Problem) (Result, error) {
	if !s.loaded {
		if err := s.load(ctx); err != nil {
			return Result{}, err
		}
	}
	if scope == nil {
		scope = []string{} // nil would mean everything
	}
	return s.apply(ctx, scope, objs, problems)
}

// Pending reports whether objects wait for a host or endpoints that are
// not in the store yet (a route to a service another source has not
// written, a subset no endpoint has yet).
func (s *Syncer) Pending() bool { return len(s.pending) > 0 }

// RetryPending reads the hosts and endpoints of the store again, which
// other sources write, and writes the pending objects they now make
// valid. A sync of this source retries them too, but only against what
// the Syncer saw when it last listed the store.
func (s *Syncer) RetryPending(ctx context.Context) (Result, error) {
	if len(s.pending) == 0 || !s.loaded {
		return Result{}, nil // unloaded, the next sync lists the store
	}
	// Waiting on a store nobody wrote since costs one small read, not a
	// list: an object that names a host no source will ever define may
	// wait for good.
	if rev, err := s.cfg.Store.Revision(ctx); err != nil || rev == s.listed {
		if err != nil {
			return Result{}, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
		}
		return Result{}, nil
	}
	stored, rev, _, err := s.cfg.Store.List(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
	}
	s.listed = rev
	ix := newIndex()
	for _, it := range stored {
		if !s.owns(it) {
			ix.add(it.Key, it.Object)
		}
	}
	for k, h := range s.mine {
		ix.add(k, h.obj)
	}
	s.ix = ix
	return s.apply(ctx, []string{}, nil, nil)
}

// Stored returns the object this source holds in the store under k (nil:
// none), as of its last list and its writes since; it lists the store
// first if it has not (after Forget, the sync that follows uses that
// list).
func (s *Syncer) Stored(ctx context.Context, k model.Key) (model.Object, error) {
	if !s.loaded {
		if err := s.load(ctx); err != nil {
			return nil, err
		}
	}
	return s.mine[k].obj, nil
}

// owns says whether a stored object is this source's: it wrote it, or it
// adopts it.
func (s *Syncer) owns(it model.Stored) bool {
	src := it.Object.GetOrigin().GetSource()
	return src == s.cfg.Source || (s.cfg.Adopts != nil && s.cfg.Adopts(src, it.Key))
}

// Forget makes the next sync list the store, to repair any drift (a
// source calls it at its start and on a resync).
func (s *Syncer) Forget() { s.loaded = false }

// load reads the store: this source's objects and every object's hosts
// and endpoints.
func (s *Syncer) load(ctx context.Context) error {
	s.loaded = false
	stored, rev, listErrs, err := s.cfg.Store.List(ctx)
	if err != nil {
		return fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
	}
	for _, e := range listErrs {
		s.cfg.Log.Warn("store holds an unreadable value", "err", e)
	}
	s.mine = map[model.Key]held{}
	s.ix = newIndex()
	for _, it := range stored {
		s.ix.add(it.Key, it.Object)
		if s.owns(it) {
			s.mine[it.Key] = held{it.Object, it.ModRevision}
		}
	}
	s.pending = map[model.Key]Object{}
	s.loaded, s.listed = true, rev
	return nil
}

// InScope reports whether loc lies within scope (see SyncPart); a nil
// scope holds everything.
func InScope(scope []string, loc string) bool {
	if scope == nil {
		return true
	}
	for _, k := range scope {
		if within(loc, k) {
			return true
		}
	}
	return false
}

// within reports whether loc is k or lies within it ("a.yaml" holds
// "a.yaml document 2").
func within(loc, k string) bool {
	return loc == k || strings.HasPrefix(loc, k+" ")
}

// apply syncs the part of the source that scope names (nil: all of it).
func (s *Syncer) apply(ctx context.Context, scope []string, objs []Object, problems []Problem) (Result, error) {
	// What the part held before: it leaves the index, except what a
	// problem of the source keeps in effect.
	var before []model.Key
	for k, h := range s.mine {
		if InScope(scope, h.location()) {
			before = append(before, k)
			s.ix.remove(k, h.obj)
		}
	}
	for k, o := range s.pending {
		if InScope(scope, o.Object.GetOrigin().GetLocation()) {
			delete(s.pending, k)
		}
	}
	for _, k := range before {
		if keep(k, s.mine[k].obj, problems) {
			s.ix.add(k, s.mine[k].obj)
		}
	}

	valid, unchanged, problems := s.validate(scope, objs, problems)
	res := Result{Unchanged: unchanged}
	retried, fixed := s.retry(scope)
	valid = append(valid, retried...)

	// Problems outside the part stay, but for those of a retried object
	// that is now valid.
	for _, p := range s.problems {
		if !InScope(scope, p.Location) && (p.Keep == nil || !fixed[*p.Keep]) {
			problems = append(problems, p)
		}
	}
	s.problems = problems
	res.Problems = problems
	s.report(problems)

	want := make(map[model.Key]bool, len(objs))
	for _, o := range objs {
		want[o.Key] = true
	}
	puts := map[model.Kind][]Object{}
	for _, o := range valid {
		puts[o.Key.Kind] = append(puts[o.Key.Kind], o)
	}
	dels := map[model.Kind][]model.Key{}
	for _, k := range before {
		if !want[k] && !keep(k, s.mine[k].obj, problems) {
			dels[k.Kind] = append(dels[k.Kind], k)
		}
	}
	if err := s.write(ctx, puts, dels, &res); err != nil {
		// What the store holds is no longer known: the next sync lists it.
		s.loaded = false
		return res, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
	}
	counts := map[model.Kind]int{}
	for k := range s.mine {
		counts[k.Kind]++
	}
	for _, k := range model.Kinds {
		s.m.objects.WithLabelValues(s.cfg.Source, string(k)).Set(float64(counts[k]))
	}
	return res, nil
}

// write makes the writes in waves, each wave's guarded transactions in
// parallel: puts kind by kind, services and endpoints before what refers
// to them, then deletes in the reverse order, so that nothing is ever
// stored referring to what is not there yet or any more.
func (s *Syncer) write(ctx context.Context, puts map[model.Kind][]Object, dels map[model.Kind][]model.Key, res *Result) error {
	var mu sync.Mutex
	order := slices.Clone(model.Kinds)
	for k := range puts {
		if !slices.Contains(order, k) {
			order = append(order, k) // a kind the order does not know yet: last
		}
	}
	for k := range dels {
		if !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	for _, kind := range order {
		err := parallel(ctx, puts[kind], func(ctx context.Context, o Object) error {
			mu.Lock()
			modRev := s.mine[o.Key].modRev
			mu.Unlock()
			start := time.Now()
			written, rev, err := s.cfg.Store.PutAt(ctx, o.Key, o.Object, modRev)
			s.m.latency.WithLabelValues(s.cfg.Source).Observe(time.Since(start).Seconds())
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			s.mine[o.Key] = held{o.Object, rev}
			if !written {
				res.Unchanged++
				return nil
			}
			res.Written++
			res.Revision = max(res.Revision, rev)
			s.m.writes.WithLabelValues(s.cfg.Source, string(o.Key.Kind), "put").Inc()
			if at := o.Object.GetOrigin().GetObservedAt(); at != nil {
				s.m.lag.WithLabelValues(s.cfg.Source).Observe(time.Since(at.AsTime()).Seconds())
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, kind := range slices.Backward(order) {
		err := parallel(ctx, dels[kind], func(ctx context.Context, k model.Key) error {
			mu.Lock()
			modRev := s.mine[k].modRev
			mu.Unlock()
			start := time.Now()
			deleted, rev, err := s.cfg.Store.DeleteAt(ctx, k, modRev)
			s.m.latency.WithLabelValues(s.cfg.Source).Observe(time.Since(start).Seconds())
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			delete(s.mine, k)
			if deleted {
				res.Deleted++
				res.Revision = max(res.Revision, rev)
				s.m.writes.WithLabelValues(s.cfg.Source, string(k.Kind), "delete").Inc()
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// writeConcurrency bounds the guarded transactions a sync has in flight.
const writeConcurrency = 16

// parallel calls fn for every item, at most writeConcurrency at once, and
// returns the first error (the others are cancelled).
func parallel[T any](ctx context.Context, items []T, fn func(context.Context, T) error) error {
	if len(items) == 1 {
		return fn(ctx, items[0])
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(writeConcurrency)
	for _, it := range items {
		g.Go(func() error { return fn(ctx, it) })
	}
	return g.Wait()
}

// report logs and counts the problems not reported by the previous sync.
func (s *Syncer) report(problems []Problem) {
	now := make(map[string]bool, len(problems))
	for _, p := range problems {
		id := p.Error()
		now[id] = true
		if s.reported[id] {
			continue
		}
		if p.Warning {
			s.m.warnings.WithLabelValues(s.cfg.Source).Inc()
			s.cfg.Log.Warn("input field not acted on; the rest applies", "source", s.cfg.Source, "location", p.Location,
				"resource", p.Resource, "field", p.Field, "reason", p.Reason)
			continue
		}
		s.m.rejected.WithLabelValues(s.cfg.Source).Inc()
		s.cfg.Log.Warn("input rejected", "source", s.cfg.Source, "location", p.Location,
			"resource", p.Resource, "field", p.Field, "reason", p.Reason)
	}
	s.reported = now
	s.m.setProblems(s.cfg.Source, problems)
}

// keep reports whether a problem keeps the stored object o under k in effect.
func keep(k model.Key, o model.Object, problems []Problem) bool {
	loc := o.GetOrigin().GetLocation()
	for _, p := range problems {
		if p.Keep != nil && *p.Keep == k {
			return true
		}
		if p.KeepLocation != "" && within(loc, p.KeepLocation) {
			return true
		}
	}
	return false
}

// validate de-duplicates the part's objects by key, checks the ones that
// changed on their own and against the hosts the mesh knows, stamps the
// source into the valid ones, and returns them, how many did not change,
// and the source's problems with every one found.
func (s *Syncer) validate(scope []string, objs []Object, problems []Problem) (valid []Object, unchanged int, _ []Problem) {
	objs, problems = s.split(objs, problems)
	objs, problems = s.dedupe(scope, objs, problems)
	// Services and endpoints first, so that what refers to them is checked
	// against the valid ones.
	ordered := slices.Clone(objs)
	slices.SortStableFunc(ordered, func(a, b Object) int {
		return slices.Index(model.Kinds, a.Key.Kind) - slices.Index(model.Kinds, b.Key.Kind)
	})
	for _, o := range ordered {
		if o.Object.GetOrigin() == nil {
			problems = append(problems, Problem{Location: o.Key.String(), Reason: "internal: object has no origin"})
			continue
		}
		o.Object.GetOrigin().Source = s.cfg.Source
		if h, ok := s.mine[o.Key]; ok && model.SameContent(h.obj, o.Object) {
			// Stored and checked when it was written: no round trip.
			s.ix.add(o.Key, h.obj)
			unchanged++
			continue
		}
		if err := model.Validate(o.Object); err != nil {
			problems = append(problems, s.reject(o, err))
			continue
		}
		if err := model.ValidateRefs(o.Object, s.ix); err != nil {
			problems = append(problems, s.reject(o, err))
			s.pending[o.Key] = o
			continue
		}
		s.ix.add(o.Key, o.Object)
		valid = append(valid, o)
	}
	return valid, unchanged, problems
}

// split splits the endpoints too large to store into chunks, and rejects
// every other object too large to store.
func (s *Syncer) split(objs []Object, problems []Problem) ([]Object, []Problem) {
	limit := s.cfg.MaxObjectSize
	var out []Object
	for i, o := range objs {
		size := proto.Size(o.Object)
		if size <= limit {
			if out != nil {
				out = append(out, o)
			}
			continue
		}
		if out == nil {
			out = append(make([]Object, 0, len(objs)+8), objs[:i]...)
		}
		tooLarge := func(what string, n int) {
			k := o.Key
			problems = append(problems, Problem{Location: o.Object.GetOrigin().GetLocation(), Resource: o.resource(), Keep: &k,
				Reason: fmt.Sprintf("%s is %d bytes encoded; the store and the bus take at most %d: split it", what, n, limit)})
		}
		eps, ok := o.Object.(*meshv1.Endpoints)
		if !ok {
			tooLarge("the object", size)
			continue
		}
		chunks, big := chunkEndpoints(o, eps, limit)
		if big >= 0 {
			tooLarge(fmt.Sprintf("endpoint %d (%s)", big, eps.Endpoints[big].GetAddress()), proto.Size(eps.Endpoints[big]))
			continue
		}
		out = append(out, chunks...)
	}
	if out == nil {
		return objs, problems
	}
	return out, problems
}

// chunkEndpoints splits a set of endpoints into objects below limit: the
// first keeps the key, the others are named "<key name>~<n>". It returns
// the index of an endpoint too large on its own, or -1.
func chunkEndpoints(o Object, eps *meshv1.Endpoints, limit int) ([]Object, int) {
	newChunk := func() *meshv1.Endpoints {
		return &meshv1.Endpoints{Origin: proto.Clone(eps.Origin).(*meshv1.Origin), Service: eps.Service, Shard: eps.Shard}
	}
	var out []Object
	cur := newChunk()
	base := proto.Size(cur)
	size := base
	flush := func() {
		k := o.Key
		if len(out) > 0 {
			k.Name += "~" + strconv.Itoa(len(out))
		}
		out = append(out, Object{Key: k, Object: cur, Resource: o.Resource})
		cur, size = newChunk(), base
	}
	for i, ep := range eps.Endpoints {
		n := protowire.SizeTag(1) + protowire.SizeBytes(proto.Size(ep))
		if base+n > limit {
			return nil, i
		}
		if size+n > limit {
			flush()
		}
		cur.Endpoints = append(cur.Endpoints, ep)
		size += n
	}
	flush()
	return out, -1
}

// reject returns the problem of an invalid object; the last valid version
// stays in effect, hosts and all.
func (s *Syncer) reject(o Object, err error) Problem {
	k := o.Key
	p := Problem{Location: o.Object.GetOrigin().GetLocation(), Resource: o.resource(), Reason: err.Error(), Keep: &k}
	var fe *model.FieldError
	if errors.As(err, &fe) {
		p.Field, p.Reason = fe.Field, fe.Reason
	}
	if h, ok := s.mine[k]; ok {
		s.ix.add(k, h.obj)
	}
	return p
}

// retry checks again the pending objects outside scope, which a host or
// endpoint added since may have made valid, and returns those that are
// now, and their keys.
func (s *Syncer) retry(scope []string) ([]Object, map[model.Key]bool) {
	var valid []Object
	fixed := map[model.Key]bool{}
	for k, o := range s.pending {
		if InScope(scope, o.Object.GetOrigin().GetLocation()) || model.ValidateRefs(o.Object, s.ix) != nil {
			continue
		}
		delete(s.pending, k)
		if h, ok := s.mine[k]; ok {
			s.ix.remove(k, h.obj)
		}
		s.ix.add(k, o.Object)
		valid = append(valid, o)
		fixed[k] = true
	}
	return valid, fixed
}

// index is the part of the mesh cross-object validation looks at: which
// services define each host, and each service's endpoints by the key of
// the object that holds them.
type index struct {
	hosts     map[string]map[nsName]bool
	endpoints map[nsName]map[model.Key][]*meshv1.Endpoint
}

type nsName struct{ namespace, name string }

func newIndex() *index {
	return &index{hosts: map[string]map[nsName]bool{}, endpoints: map[nsName]map[model.Key][]*meshv1.Endpoint{}}
}

// add enters o under k; adding the same object twice is harmless.
func (ix *index) add(k model.Key, o model.Object) {
	switch o := o.(type) {
	case *meshv1.Service:
		for _, h := range o.Hostnames {
			if ix.hosts[h] == nil {
				ix.hosts[h] = map[nsName]bool{}
			}
			ix.hosts[h][nsName{k.Namespace, k.Name}] = true
		}
	case *meshv1.Endpoints:
		id := nsName{k.Namespace, o.Service}
		if ix.endpoints[id] == nil {
			ix.endpoints[id] = map[model.Key][]*meshv1.Endpoint{}
		}
		ix.endpoints[id][k] = o.Endpoints
	}
}

// remove takes o, entered under k, out.
func (ix *index) remove(k model.Key, o model.Object) {
	switch o := o.(type) {
	case *meshv1.Service:
		for _, h := range o.Hostnames {
			delete(ix.hosts[h], nsName{k.Namespace, k.Name})
			if len(ix.hosts[h]) == 0 {
				delete(ix.hosts, h)
			}
		}
	case *meshv1.Endpoints:
		id := nsName{k.Namespace, o.Service}
		delete(ix.endpoints[id], k)
		if len(ix.endpoints[id]) == 0 {
			delete(ix.endpoints, id)
		}
	}
}

func (ix *index) KnownHost(h string) bool {
	_, ok := ix.hosts[h]
	return ok
}

// Endpoints returns the endpoints of every service that defines h: the
// pusher merges them the same way.
func (ix *index) Endpoints(h string) []*meshv1.Endpoint {
	var out []*meshv1.Endpoint
	for id := range ix.hosts[h] {
		for _, eps := range ix.endpoints[id] {
			out = append(out, eps...)
		}
	}
	return out
}

// dedupe keeps one object per key: the one already in effect (same
// location as the stored object, or any stored object outside scope),
// else the first. The others are reported; endpoints, which derive from a
// service, follow their service quietly.
func (s *Syncer) dedupe(scope []string, objs []Object, problems []Problem) ([]Object, []Problem) {
	byKey := make(map[model.Key][]int, len(objs))
	for i, o := range objs {
		byKey[o.Key] = append(byKey[o.Key], i)
	}
	drop := map[int]bool{}
	for k, idx := range byKey {
		h, stored := s.mine[k]
		outside := stored && !InScope(scope, h.location())
		if len(idx) < 2 && !outside {
			continue
		}
		winner, winnerAt := idx[0], objs[idx[0]].Object.GetOrigin().GetLocation()
		if stored {
			for _, i := range idx {
				if objs[i].Object.GetOrigin().GetLocation() == h.location() {
					winner, winnerAt = i, h.location()
					break
				}
			}
			if outside {
				winner, winnerAt = -1, h.location()
			}
		}
		for _, i := range idx {
			if i == winner {
				continue
			}
			drop[i] = true
			if k.Kind == model.KindEndpoints {
				continue
			}
			problems = append(problems, Problem{
				Location: objs[i].Object.GetOrigin().GetLocation(),
				Resource: objs[i].resource(),
				Field:    "metadata.name",
				Reason:   "another object with this kind, namespace and name is defined at " + winnerAt + "; this one is ignored",
			})
		}
	}
	if len(drop) == 0 {
		return objs, problems
	}
	out := make([]Object, 0, len(objs)-len(drop))
	for i, o := range objs {
		if !drop[i] {
			out = append(out, o)
		}
	}
	return out, problems
}
