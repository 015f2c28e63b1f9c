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

	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
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

// Store is what a Syncer needs of the store. A write names the mod
// revision the Syncer last saw for the key (0: absent), so that it is one
// round trip when the store agrees; rev is the key's mod revision after a
// put and the store revision after a delete.
type Store interface {
	PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (written bool, rev int64, err error)
	DeleteAt(ctx context.Context, k model.Key, modRev int64) (deleted bool, rev int64, err error)
	// WriteAll makes many guarded writes in one transaction (a nil
	// Object deletes): ok false says some key was not as expected, and
	// nothing was written (see store.Store.WriteAll).
	WriteAll(ctx context.Context, writes []model.Stored) (ok bool, rev int64, deleted []bool, err error)
	List(ctx context.Context) (items []model.Stored, rev int64, errs []error, err error)
	// Revision is the store's current revision.
	Revision(ctx context.Context) (int64, error)
}

// Writer is what a source writes what it read through: a *Syncer.
type Writer interface {
	Sync(ctx context.Context, objs []Object, problems []Problem) (Result, error)
	SyncPart(ctx context.Context, part []string, objs []Object, problems []Problem) (Result, error)
	// Forget makes the next sync read the store again.
	Forget()
	// WentBack: see Syncer.
	WentBack(ctx context.Context) (bool, error)
	// Pending, RetryPending and Stored: see Syncer.
	Pending() bool
	RetryPending(ctx context.Context) (Result, error)
	Stored(ctx context.Context, k model.Key) (model.Object, error)
}

var _ Writer = (*Syncer)(nil)

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
	// Report is shared by every Syncer of a process (its metrics are labelled by
	// source); nil keeps them unregistered.
	Report *Report
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

// Syncer makes the store hold what one source holds. It remembers what it
// read and wrote (each object of its source with its mod revision, and the
// hosts and endpoints of every stored object), so that a sync costs what
// changed: the store is listed at first, after Forget and after a failed
// write, not at every sync.
type Syncer struct {
	cfg Config
	m   *Report

	// loaded says mine and ix hold the store as of the last list plus
	// this Syncer's writes since.
	loaded bool
	// listed is the store revision of the last list: RetryPending lists
	// again only once the store moved past it.
	listed int64
	// highest is the highest store revision the Syncer saw (its lists and
	// its writes): a store below it went back (see WentBack).
	highest int64
	mine    map[model.Key]held
	ix      *index
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
	m := cfg.Report
	if m == nil {
		m, _ = NewReport(nil)
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
// locations part names hold now (an entry names a location and every
// location it prefixes followed by a space, as KeepLocation does). The
// rest stays as the last sync left it.
func (s *Syncer) SyncPart(ctx context.Context, part []string, objs []Object, problems []Problem) (Result, error) {
	if !s.loaded {
		if err := s.load(ctx); err != nil {
			return Result{}, err
		}
	}
	if part == nil {
		part = []string{} // nil would mean everything
	}
	return s.apply(ctx, part, objs, problems)
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
	s.listed, s.highest = rev, max(s.highest, rev)
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

// WentBack reports whether the store's revision is below the highest the
// Syncer saw: the store was restored from an older snapshot, and may lack
// what this source wrote since, which the Syncer believes it holds. It
// then forgets what it read, so that the next sync lists the store and
// writes what is missing; a source's Loop asks every StoreCheck and syncs
// all at once when it did.
func (s *Syncer) WentBack(ctx context.Context) (bool, error) {
	if s.highest == 0 {
		return false, nil
	}
	rev, err := s.cfg.Store.Revision(ctx)
	if err != nil {
		return false, fmt.Errorf("ingest: %s: %w", s.cfg.Source, err)
	}
	if rev >= s.highest {
		return false, nil
	}
	s.highest = rev
	s.Forget()
	return true, nil
}

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
	s.loaded, s.listed, s.highest = true, rev, max(s.highest, rev)
	return nil
}

// Covers reports whether loc lies within part (see SyncPart); a nil
// part holds everything.
func Covers(part []string, loc string) bool {
	if part == nil {
		return true
	}
	for _, k := range part {
		if within(loc, k) {
			return true
		}
	}
	return false
}

// within reports whether loc is k or lies within it ("a.yaml" holds
// "a.yaml document 2").
func within(loc, k string) bool {
	return strings.HasPrefix(loc, k) && (len(loc) == len(k) || loc[len(k)] == ' ')
}

// apply syncs the part of the source that part names (nil: all of it).
func (s *Syncer) apply(ctx context.Context, part []string, objs []Object, problems []Problem) (Result, error) {
	// What the part held before: it leaves the index, except what a
	// problem of the source keeps in effect.
	var before []model.Key
	for k, h := range s.mine {
		if Covers(part, h.location()) {
			before = append(before, k)
			s.ix.remove(k, h.obj)
		}
	}
	for k, o := range s.pending {
		if Covers(part, o.Object.GetOrigin().GetLocation()) {
			delete(s.pending, k)
		}
	}
	for _, k := range before {
		if keep(k, s.mine[k].obj, problems) {
			s.ix.add(k, s.mine[k].obj)
		}
	}

	valid, unchanged, problems := s.validate(part, objs, problems)
	res := Result{Unchanged: unchanged}
	retried, fixed := s.retry(part)
	valid = append(valid, retried...)

	// Problems outside the part stay, but for those of a retried object
	// that is now valid.
	for _, p := range s.problems {
		if !Covers(part, p.Location) && (p.Keep == nil || !fixed[*p.Keep]) {
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
// stored referring to what is not there yet or any more. A wave's writes
// go many to a transaction.
func (s *Syncer) write(ctx context.Context, puts map[model.Kind][]Object, dels map[model.Kind][]model.Key, res *Result) error {
	w := writer{s: s, res: res}
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
		writes := make([]model.Stored, len(puts[kind]))
		for i, o := range puts[kind] {
			writes[i] = model.Stored{Key: o.Key, Object: o.Object}
		}
		if err := parallel(ctx, w.batches(writes), w.batch); err != nil {
			return err
		}
	}
	for _, kind := range slices.Backward(order) {
		writes := make([]model.Stored, len(dels[kind]))
		for i, k := range dels[kind] {
			writes[i] = model.Stored{Key: k}
		}
		if err := parallel(ctx, w.batches(writes), w.batch); err != nil {
			return err
		}
	}
	return nil
}

// A transaction holds at most batchWrites writes of batchBytes in all,
// well within etcd's defaults (--max-txn-ops 128, --max-request-bytes
// 1.5 MiB). One transaction per key wrote 2,000 keys a second: 20,000
// services and their endpoints took 20 s, and every change of the source
// after them waited.
const (
	batchWrites = 64
	batchBytes  = 512 << 10
)

// writer makes one sync's writes (a nil Object deletes).
type writer struct {
	s   *Syncer
	res *Result
	mu  sync.Mutex // guards the Syncer's state and res
}

// batches splits a wave's writes into transactions.
func (w *writer) batches(writes []model.Stored) [][]model.Stored {
	var out [][]model.Stored
	start, bytes := 0, 0
	for i, wr := range writes {
		size := 0
		if wr.Object != nil {
			size = proto.Size(wr.Object)
		}
		if i > start && (i-start == batchWrites || bytes+size > batchBytes) {
			out = append(out, writes[start:i])
			start, bytes = i, 0
		}
		bytes += size
	}
	if start < len(writes) {
		out = append(out, writes[start:])
	}
	return out
}

// batch makes a transaction's writes: in one, when the store holds every
// key as this source last saw it; else one by one, each told how the store
// differs.
func (w *writer) batch(ctx context.Context, writes []model.Stored) error {
	w.mu.Lock()
	for i := range writes {
		writes[i].ModRevision = w.s.mine[writes[i].Key].modRev
	}
	w.mu.Unlock()
	if len(writes) > 1 {
		start := time.Now()
		ok, rev, deleted, err := w.s.cfg.Store.WriteAll(ctx, writes)
		w.s.m.latency.WithLabelValues(w.s.cfg.Source).Observe(time.Since(start).Seconds())
		if err != nil && ctx.Err() != nil {
			return err
		}
		if err == nil && ok {
			w.mu.Lock()
			defer w.mu.Unlock()
			for i, wr := range writes {
				w.done(wr, true, rev, deleted[i])
			}
			return nil
		}
		// A key moved since this source read it, or the store refused
		// the transaction: one by one, each write finds out.
	}
	for _, wr := range writes {
		if err := w.one(ctx, wr); err != nil {
			return err
		}
	}
	return nil
}

// one makes one guarded write.
func (w *writer) one(ctx context.Context, wr model.Stored) error {
	start := time.Now()
	var written bool
	var rev int64
	var err error
	if wr.Object != nil {
		written, rev, err = w.s.cfg.Store.PutAt(ctx, wr.Key, wr.Object, wr.ModRevision)
	} else {
		written, rev, err = w.s.cfg.Store.DeleteAt(ctx, wr.Key, wr.ModRevision)
	}
	w.s.m.latency.WithLabelValues(w.s.cfg.Source).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done(wr, written, rev, written)
	return nil
}

// done records a write the store made (written: a put that changed the
// key, deleted: a delete of a key that existed), holding w.mu.
func (w *writer) done(wr model.Stored, written bool, rev int64, deleted bool) {
	s, res := w.s, w.res
	s.highest = max(s.highest, rev)
	if wr.Object == nil {
		delete(s.mine, wr.Key)
		if deleted {
			res.Deleted++
			res.Revision = max(res.Revision, rev)
			s.m.writes.WithLabelValues(s.cfg.Source, string(wr.Key.Kind), "delete").Inc()
		}
		return
	}
	s.mine[wr.Key] = held{wr.Object, rev}
	if !written {
		res.Unchanged++
		return
	}
	res.Written++
	res.Revision = max(res.Revision, rev)
	s.m.writes.WithLabelValues(s.cfg.Source, string(wr.Key.Kind), "put").Inc()
	if at := wr.Object.GetOrigin().GetObservedAt(); at != nil {
		s.m.lag.WithLabelValues(s.cfg.Source).Observe(time.Since(at.AsTime()).Seconds())
	}
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
