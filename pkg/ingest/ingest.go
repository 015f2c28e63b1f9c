package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
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
}

func (p Problem) Error() string {
	var b strings.Builder
	b.WriteString(p.Location)
	if p.Resource != "" {
		b.WriteString(" (" + p.Resource + ")")
	}
	b.WriteString(": ")
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Reason)
	return b.String()
}

// Store is what a Syncer needs of the store.
type Store interface {
	Put(ctx context.Context, k model.Key, o model.Object) (written bool, rev int64, err error)
	Delete(ctx context.Context, k model.Key) (deleted bool, rev int64, err error)
	List(ctx context.Context) (items []model.Stored, rev int64, errs []error, err error)
}

// Config configures a Syncer.
type Config struct {
	// Source names the source; it is stamped into each object's origin and
	// decides which stored objects the Syncer owns.
	Source string
	Store  Store
	Log    *slog.Logger
	// Metrics are shared by every Syncer of a process (they are labelled by
	// source); nil keeps them unregistered.
	Metrics *Metrics
}

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
	return nil
}

// Metrics are the ingest metrics, labelled by source.
type Metrics struct {
	rejected *prometheus.CounterVec
	writes   *prometheus.CounterVec
	objects  *prometheus.GaugeVec
	latency  *prometheus.HistogramVec
	lag      *prometheus.HistogramVec
}

// NewMetrics creates the ingest metrics and registers them on reg (nil
// registers nothing).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_rejected_objects_total",
			Help: "Inputs rejected as invalid (normalization and validation errors), by source."}, []string{"source"}),
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
		for _, c := range []prometheus.Collector{m.rejected, m.writes, m.objects, m.latency, m.lag} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("ingest: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Syncer makes the store hold what one source holds.
type Syncer struct {
	cfg Config
	m   *Metrics
	// reported holds the problems already logged and counted, so that an
	// input that stays bad is reported once, not at every sync.
	reported map[string]bool
}

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
	Problems []Problem
}

// Sync makes the store hold objs as this source's content: it writes the
// valid objects that changed and deletes this source's other objects, except
// those that problems say to keep. Every problem, the source's and the ones
// Sync finds, is logged, counted and returned.
func (s *Syncer) Sync(ctx context.Context, objs []Object, problems []Problem) (Result, error) {
	stored, _, listErrs, err := s.cfg.Store.List(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
	}
	for _, e := range listErrs {
		s.cfg.Log.Warn("store holds an unreadable value", "err", e)
	}

	mine := map[model.Key]model.Stored{}
	for _, it := range stored {
		if it.Object.GetOrigin().GetSource() == s.cfg.Source {
			mine[it.Key] = it
		}
	}
	valid, problems := s.validate(objs, stored, mine, problems)
	res := Result{Problems: problems}
	s.report(problems)

	want := make(map[model.Key]bool, len(valid))
	counts := map[model.Kind]int{}
	puts := map[model.Kind][]Object{}
	for _, o := range valid {
		want[o.Key] = true
		counts[o.Key.Kind]++
		if it, ok := mine[o.Key]; ok && model.SameContent(it.Object, o.Object) {
			// The list just read says the store has it: no round trip.
			res.Unchanged++
			continue
		}
		puts[o.Key.Kind] = append(puts[o.Key.Kind], o)
	}
	dels := map[model.Kind][]model.Key{}
	for _, it := range stored {
		if it.Object.GetOrigin().GetSource() != s.cfg.Source || want[it.Key] {
			continue
		}
		if keep(it, problems) {
			counts[it.Key.Kind]++
			continue
		}
		dels[it.Key.Kind] = append(dels[it.Key.Kind], it.Key)
	}
	// Writes go out in waves, each wave's guarded transactions in
	// parallel: puts kind by kind, services and endpoints before what
	// refers to them, then deletes in the reverse order, so that nothing
	// is ever stored referring to what is not there yet or any more.
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
			start := time.Now()
			written, rev, err := s.cfg.Store.Put(ctx, o.Key, o.Object)
			s.m.latency.WithLabelValues(s.cfg.Source).Observe(time.Since(start).Seconds())
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
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
			return res, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
		}
	}
	for _, kind := range slices.Backward(order) {
		err := parallel(ctx, dels[kind], func(ctx context.Context, k model.Key) error {
			start := time.Now()
			deleted, rev, err := s.cfg.Store.Delete(ctx, k)
			s.m.latency.WithLabelValues(s.cfg.Source).Observe(time.Since(start).Seconds())
			if err != nil {
				return err
			}
			if deleted {
				mu.Lock()
				defer mu.Unlock()
				res.Deleted++
				res.Revision = max(res.Revision, rev)
				s.m.writes.WithLabelValues(s.cfg.Source, string(k.Kind), "delete").Inc()
			}
			return nil
		})
		if err != nil {
			return res, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
		}
	}
	for _, k := range model.Kinds {
		s.m.objects.WithLabelValues(s.cfg.Source, string(k)).Set(float64(counts[k]))
	}
	return res, nil
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
		s.m.rejected.WithLabelValues(s.cfg.Source).Inc()
		s.cfg.Log.Warn("input rejected", "source", s.cfg.Source, "location", p.Location,
			"resource", p.Resource, "field", p.Field, "reason", p.Reason)
	}
	s.reported = now
}

func keep(it model.Stored, problems []Problem) bool {
	loc := it.Object.GetOrigin().GetLocation()
	for _, p := range problems {
		if p.Keep != nil && *p.Keep == it.Key {
			return true
		}
		if k := p.KeepLocation; k != "" && (loc == k || strings.HasPrefix(loc, k+" ")) {
			return true
		}
	}
	return false
}

// validate de-duplicates objects by key, checks each on its own and against
// the hosts the mesh knows, stamps the source into the valid ones, and
// returns them with every problem found.
func (s *Syncer) validate(objs []Object, stored []model.Stored, mine map[model.Key]model.Stored, problems []Problem) ([]Object, []Problem) {
	ix := newIndex()
	for _, it := range stored {
		if _, ok := mine[it.Key]; !ok {
			ix.add(it.Key, it.Object)
		}
	}
	// A stored object that a problem keeps in effect still counts.
	for _, it := range mine {
		if keep(it, problems) {
			ix.add(it.Key, it.Object)
		}
	}
	objs, problems = s.dedupe(objs, mine, problems)

	var valid []Object
	reject := func(o Object, err error) {
		p := Problem{Location: o.Object.GetOrigin().GetLocation(), Resource: o.resource(), Reason: err.Error()}
		var fe *model.FieldError
		if errors.As(err, &fe) {
			p.Field, p.Reason = fe.Field, fe.Reason
		}
		k := o.Key
		p.Keep = &k
		problems = append(problems, p)
		if it, ok := mine[k]; ok {
			// The last valid version stays in effect, hosts and all.
			ix.add(it.Key, it.Object)
		}
	}
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
		if err := model.Validate(o.Object); err != nil {
			reject(o, err)
			continue
		}
		if err := model.ValidateRefs(o.Object, ix); err != nil {
			reject(o, err)
			continue
		}
		ix.add(o.Key, o.Object)
		o.Object.GetOrigin().Source = s.cfg.Source
		valid = append(valid, o)
	}
	return valid, problems
}

// index is the part of the mesh cross-object validation looks at: which
// service defines each host, and each service's endpoints.
type index struct {
	hosts     map[string][]nsName
	endpoints map[nsName][]*meshv1.Endpoint
}

type nsName struct{ namespace, name string }

func newIndex() *index {
	return &index{hosts: map[string][]nsName{}, endpoints: map[nsName][]*meshv1.Endpoint{}}
}

func (ix *index) add(k model.Key, o model.Object) {
	switch o := o.(type) {
	case *meshv1.Service:
		for _, h := range o.Hostnames {
			ix.hosts[h] = append(ix.hosts[h], nsName{k.Namespace, k.Name})
		}
	case *meshv1.Endpoints:
		id := nsName{k.Namespace, o.Service}
		ix.endpoints[id] = append(ix.endpoints[id], o.Endpoints...)
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
	for _, id := range ix.hosts[h] {
		out = append(out, ix.endpoints[id]...)
	}
	return out
}

// dedupe keeps one object per key: the one already in effect (same
// location as the stored object), else the first. The others are reported;
// endpoints, which derive from a service, follow their service quietly.
func (s *Syncer) dedupe(objs []Object, mine map[model.Key]model.Stored, problems []Problem) ([]Object, []Problem) {
	byKey := map[model.Key][]int{}
	for i, o := range objs {
		byKey[o.Key] = append(byKey[o.Key], i)
	}
	drop := map[int]bool{}
	for k, idx := range byKey {
		if len(idx) < 2 {
			continue
		}
		winner := idx[0]
		if it, ok := mine[k]; ok {
			for _, i := range idx {
				if objs[i].Object.GetOrigin().GetLocation() == it.Object.GetOrigin().GetLocation() {
					winner = i
					break
				}
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
				Reason:   "another object with this kind, namespace and name is defined at " + objs[winner].Object.GetOrigin().GetLocation() + "; this one is ignored",
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
