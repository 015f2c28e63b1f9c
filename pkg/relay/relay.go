package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
)

// Watcher is the store side: its current revision, its changes after a
// revision, and whether it committed an event.
type Watcher interface {
	Revision(ctx context.Context) (int64, error)
	Watch(ctx context.Context, fromRev int64, fn func([]*meshv1.ChangeEvent) error) error
	// Confirm returns why the store did not commit ev ("" when it did), or
	// model.ErrCompacted when it can no longer tell.
	Confirm(ctx context.Context, ev *meshv1.ChangeEvent) (reason string, err error)
}

// Publisher is the bus side.
type Publisher interface {
	// Publish publishes ev and waits for the bus to store it.
	Publish(ctx context.Context, ev *meshv1.ChangeEvent) (duplicate bool, err error)
	// PublishAfter publishes ev without waiting, on the condition that the
	// last event the bus holds is after, so that events are stored in order
	// or not at all; ack waits for the bus's answer.
	PublishAfter(ev, after *meshv1.ChangeEvent) (ack func(context.Context) (duplicate bool, err error), err error)
	// Last returns the bus's last event; an error wrapping model.ErrRefused
	// when the relay cannot have published it.
	Last(ctx context.Context) (*meshv1.ChangeEvent, uint64, error)
	// Ensure makes the bus's stream exist as the relay configures it
	// (someone may have deleted or altered it).
	Ensure(ctx context.Context) error
	// Check fails when the stream is gone or altered.
	Check(ctx context.Context) error
}

// Config configures a Relay.
type Config struct {
	Watcher   Watcher
	Publisher Publisher
	Log       *slog.Logger
	// Registerer receives the relay's metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// RetryDelay is the pause after a failure before starting again. Default 1s.
	RetryDelay time.Duration
	// Window is how many published events may await the bus's answer.
	// Default 256.
	Window int
	// CheckEvery is how often the relay checks, while it follows the
	// store, that the stream is still there as it made it. Default 5s.
	CheckEvery time.Duration
	// RepairAfter is how long the relay may fail to publish before it
	// repairs the stream instead of retrying: it starts a new history (a
	// RESYNC at the store's revision, with fresh de-duplication ids) that
	// every pusher obeys. Default 30s.
	RepairAfter time.Duration
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Watcher == nil || c.Publisher == nil {
		return errors.New("relay: a watcher and a publisher are required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.Window == 0 {
		c.Window = 256
	}
	if c.CheckEvery == 0 {
		c.CheckEvery = 5 * time.Second
	}
	if c.RepairAfter == 0 {
		c.RepairAfter = 30 * time.Second
	}
	if c.CheckEvery < 0 || c.RepairAfter < 0 {
		return fmt.Errorf("relay: check interval %s, repair after %s: want positive durations", c.CheckEvery, c.RepairAfter)
	}
	if c.Window < 0 {
		return fmt.Errorf("relay: window %d: want a positive number of events", c.Window)
	}
	return nil
}

// Relay copies store changes to the bus.
type Relay struct {
	cfg Config
	m   metrics
	// failing is set from a failure until the relay shows it follows the
	// store again: a publish answered, or a check interval without failure.
	failing atomic.Bool
	// progress is when the relay last made progress (Unix nanoseconds):
	// it published, or it followed the store a check interval without
	// failing.
	progress atomic.Int64
	// epoch is the history of the store the relay publishes (see
	// meshv1.ChangeEvent.epoch), owned by Run's goroutine.
	epoch int64
}

// Healthy reports whether the relay is following the store (it has not
// failed since it last made progress).
func (r *Relay) Healthy() bool { return !r.failing.Load() }

// Stuck returns how long the relay has failed without progress (0 while it
// is healthy).
func (r *Relay) Stuck() time.Duration {
	if !r.failing.Load() {
		return 0
	}
	return time.Since(time.Unix(0, r.progress.Load()))
}

// advanced records progress.
func (r *Relay) advanced() {
	r.progress.Store(time.Now().UnixNano())
	r.failing.Store(false)
}

type metrics struct {
	published   prometheus.Counter
	duplicates  prometheus.Counter
	resyncs     prometheus.Counter
	failures    prometheus.Counter
	unconfirmed prometheus.Counter
	repairs     *prometheus.CounterVec
	revision    prometheus.Gauge
}

// New returns a Relay.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_relay_published_events_total",
			Help: "Change events published to the bus."}),
		duplicates: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_relay_duplicate_events_total",
			Help: "Published events the bus already had (after a restart)."}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_relay_resyncs_total",
			Help: "RESYNC events published because the stream could not be continued from the store."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_relay_failures_total",
			Help: "Times the relay stopped on an error and started again."}),
		unconfirmed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_relay_unconfirmed_events_total",
			Help: "Times the stream's last event was not one the store committed (forged, or from another store): the relay resynchronised instead of resuming after it."}),
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_relay_repairs_total",
			Help: "Times the relay started a new history of the stream (a RESYNC every pusher obeys, fresh de-duplication ids), by reason: restored (the stream's last event is not one the store committed: etcd restored, or a foreign event), stuck (the bus refused every publish for --relay-repair-after)."}, []string{"reason"}),
		revision: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_relay_published_revision",
			Help: "Store revision of the last published event."}),
	}
	r := &Relay{cfg: cfg, m: m}
	r.progress.Store(time.Now().UnixNano())
	if cfg.Registerer != nil {
		stuck := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_relay_stuck_seconds",
			Help: "Seconds the relay has failed without publishing (0 while it follows the store); past --relay-repair-after it repairs the stream."},
			func() float64 { return r.Stuck().Seconds() })
		for _, c := range []prometheus.Collector{m.published, m.duplicates, m.resyncs, m.failures, m.unconfirmed, m.repairs, m.revision, stuck} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("relay: register metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Run relays until ctx is done. It returns nil on cancellation. The relay
// owns the stream: it makes it before the first pass and again after any
// failure (it may have been deleted or altered).
func (r *Relay) Run(ctx context.Context) error {
	if err := r.bounded(ctx, r.cfg.Publisher.Ensure); err != nil && ctx.Err() == nil {
		r.failing.Store(true)
		r.cfg.Log.Warn("cannot make the stream", "err", err)
	}
	for {
		err := r.relay(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errResynced) {
			continue
		}
		r.m.failures.Inc()
		r.failing.Store(true)
		r.cfg.Log.Warn("relay stopped; starting again", "err", err, "retry_in", r.cfg.RetryDelay, "stuck_for", r.Stuck().Round(time.Second))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(r.cfg.RetryDelay):
		}
		// The stream may be gone or altered: make it again; the next pass
		// finds it empty (and publishes a RESYNC) or confirms its last
		// event against the store.
		if err := r.bounded(ctx, r.cfg.Publisher.Ensure); err != nil && ctx.Err() == nil {
			r.cfg.Log.Warn("cannot make the stream", "err", err)
		}
		// Refused that long, the same write would be refused for ever (a
		// stream that refuses every write, a message it cannot take, ids
		// it takes for others): start a new history instead. A bus out
		// of reach is waited for: its stream resumes where it stopped.
		if stuck := r.Stuck(); stuck >= r.cfg.RepairAfter && errors.Is(err, model.ErrNotStored) {
			if err := r.repair(ctx, "stuck", fmt.Sprintf("no publish succeeded for %s; last error: %v", stuck.Round(time.Second), err)); err != nil && !errors.Is(err, errResynced) && ctx.Err() == nil {
				r.cfg.Log.Error("cannot repair the stream", "err", err)
			}
		}
	}
}

// bounded runs a request to the bus, bounded in time: a bus that does not
// answer (NATS restarting, its requests lost) must not hold the relay,
// which then starts again and makes the stream anew if it is gone.
func (r *Relay) bounded(ctx context.Context, request func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, max(r.cfg.CheckEvery, time.Second))
	defer cancel()
	return request(ctx)
}

// relay finds where the stream stops and follows the store from there until
// an error.
func (r *Relay) relay(ctx context.Context) error {
	if err := r.bounded(ctx, r.cfg.Publisher.Check); err != nil {
		return err
	}
	last, _, err := r.cfg.Publisher.Last(ctx)
	if errors.Is(err, model.ErrRefused) {
		return r.unconfirmed(ctx, err.Error())
	}
	if err != nil {
		return err
	}
	if last == nil {
		// Nothing was ever published: consumers must start from the store.
		return r.resync(ctx, "empty stream")
	}
	r.epoch = last.Epoch
	// Resume only after an event the store committed: one forged far
	// ahead would make the relay skip every real change up to it.
	reason, err := r.cfg.Watcher.Confirm(ctx, last)
	switch {
	case errors.Is(err, model.ErrCompacted):
		return r.resync(ctx, err.Error())
	case err != nil:
		return err
	case reason != "":
		return r.unconfirmed(ctx, fmt.Sprintf("last event %s@%d: %s", last.Key, last.Revision, reason))
	}
	from, skip := resumePoint(last)
	r.m.revision.Set(float64(last.Revision))
	r.cfg.Log.Info("relay resuming", "after_revision", from, "last_event", fmt.Sprintf("%s@%d", last.Key, last.Revision))
	err = r.follow(ctx, last, from, skip)
	if errors.Is(err, model.ErrCompacted) {
		return r.resync(ctx, err.Error())
	}
	return err
}

// pass is one pass of the relay following the store from a resume point.
// Events are published without waiting, each on the condition that the
// one before it is stored; a second goroutine takes the answers in order.
// The first failure stops the pass: the next resumes from what the bus
// holds.
type pass struct {
	r        *Relay
	inFlight chan pending
	unacked  atomic.Int64
	// acked is the newest event the bus stored: the store must still hold
	// it (see check).
	acked atomic.Pointer[meshv1.ChangeEvent]
}

// pending is an event published and its answer to come.
type pending struct {
	ev  *meshv1.ChangeEvent
	ack func(context.Context) (bool, error)
}

// follow publishes the store's changes after from (the first revision's
// events up to skip being published already), last being the newest event
// the bus holds, until an error or ctx ends.
func (r *Relay) follow(ctx context.Context, last *meshv1.ChangeEvent, from int64, skip int32) error {
	p := &pass{r: r, inFlight: make(chan pending, r.cfg.Window)}
	p.acked.Store(last)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return p.answers(gctx) })
	g.Go(func() error { return p.check(gctx) })
	g.Go(func() error { return p.publish(gctx, last, from, skip) })
	return g.Wait()
}

// answers takes the bus's answers, in order.
func (p *pass) answers(ctx context.Context) error {
	r := p.r
	for {
		select {
		case <-ctx.Done():
			return nil
		case pe := <-p.inFlight:
			dup, err := pe.ack(ctx)
			if err != nil {
				return err
			}
			p.unacked.Add(-1)
			p.acked.Store(pe.ev)
			r.advanced()
			if dup {
				r.m.duplicates.Inc()
			}
			r.m.published.Inc()
			r.m.revision.Set(float64(pe.ev.Revision))
		}
	}
}

// check asks, every CheckEvery, whether the bus takes writes and the store
// still holds the last event the bus stored.
func (p *pass) check(ctx context.Context) error {
	r := p.r
	t := time.NewTicker(r.cfg.CheckEvery)
	defer t.Stop()
	for ticks := 1; ; ticks++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := r.bounded(ctx, r.cfg.Publisher.Check); err != nil && ctx.Err() == nil {
			return err
		}
		// A store restored from a snapshot under the watch: the watch
		// waits past revisions the store now reuses, whose changes it
		// would never bring. The next pass finds the last event
		// unconfirmed and starts a new history.
		var reason string
		err := r.bounded(ctx, func(ctx context.Context) (err error) {
			reason, err = r.cfg.Watcher.Confirm(ctx, p.acked.Load())
			return err
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil && reason != "":
			return fmt.Errorf("the store no longer holds the last event published (%s): restored from a snapshot?", reason)
		}
		// Following for two checks with nothing unanswered: a pass that
		// fails at its first publish never gets here.
		if ticks >= 2 && p.unacked.Load() == 0 {
			r.advanced()
		}
	}
}

// publish watches the store and publishes each event after the one before.
func (p *pass) publish(ctx context.Context, last *meshv1.ChangeEvent, from int64, skip int32) error {
	r := p.r
	prev := last
	return r.cfg.Watcher.Watch(ctx, from, func(evs []*meshv1.ChangeEvent) error {
		for _, ev := range evs {
			if ev.Revision == from+1 && ev.Index <= skip {
				continue
			}
			ev.Epoch = r.epoch
			p.unacked.Add(1)
			ack, err := r.cfg.Publisher.PublishAfter(ev, prev)
			if err != nil {
				return err
			}
			select {
			case p.inFlight <- pending{ev, ack}:
			case <-ctx.Done():
				return ctx.Err()
			}
			prev = ev
		}
		return nil
	})
}

// resumePoint returns the revision after which to watch, and the highest
// event index of the first revision that is already published (-1 for none).
func resumePoint(last *meshv1.ChangeEvent) (from int64, skip int32) {
	if last.Type != meshv1.ChangeEvent_TYPE_RESYNC && last.Index+1 < last.Count {
		// The relay stopped inside a revision: publish the rest of it.
		return last.Revision - 1, last.Index
	}
	return last.Revision, -1
}

// unconfirmed starts a new history after a last event the store did not
// commit, loudly: the store was restored from a snapshot (its revisions
// went back), or someone else than the relay wrote the stream.
func (r *Relay) unconfirmed(ctx context.Context, why string) error {
	r.m.unconfirmed.Inc()
	r.failing.Store(true)
	r.cfg.Log.Error("the stream's last event is not one the store committed (etcd restored, or a foreign event): starting a new history every pusher reloads", "reason", why)
	return r.repair(ctx, "restored", why)
}

// repair starts a new history of the stream: a RESYNC at the store's
// revision in a new epoch, so that its events' de-duplication ids are new
// (a restored store reuses revisions the stream's window still holds), and
// marked restored when the store's history is not the stream's, so that
// every pusher reloads whatever revision it holds. The next pass follows
// the store from there.
func (r *Relay) repair(ctx context.Context, reason, why string) error {
	epoch := max(r.epoch+1, time.Now().UnixMilli())
	if err := r.publishResync(ctx, epoch, reason == "restored"); err != nil {
		return err
	}
	r.epoch = epoch
	r.m.repairs.WithLabelValues(reason).Inc()
	r.cfg.Log.Warn("relay repaired the stream: a new history from the store's revision", "reason", reason, "why", why, "epoch", epoch)
	return errResynced
}

// resync publishes a RESYNC at the store's current revision; the next pass
// follows the store from there.
func (r *Relay) resync(ctx context.Context, why string) error {
	if err := r.publishResync(ctx, r.epoch, false); err != nil {
		return err
	}
	r.cfg.Log.Info("relay published resync", "reason", why)
	return errResynced
}

// publishResync publishes a RESYNC at the store's current revision.
func (r *Relay) publishResync(ctx context.Context, epoch int64, restored bool) error {
	rev, err := r.cfg.Watcher.Revision(ctx)
	if err != nil {
		return err
	}
	ev := &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_RESYNC, Revision: rev, Epoch: epoch, Restored: restored}
	if _, err := r.cfg.Publisher.Publish(ctx, ev); err != nil {
		return err
	}
	r.m.resyncs.Inc()
	r.m.revision.Set(float64(rev))
	r.advanced()
	return nil
}

// errResynced ends a pass after a resync so the next pass resumes from it.
var errResynced = errors.New("relay: resynced")
