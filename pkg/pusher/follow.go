package pusher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// errReload ends a pass of follow so that the next one loads the store again.
var errReload = errors.New("pusher: reload requested")

// follow is the goroutine that reads: it loads the store, follows the
// change stream, and hands what it read, decoded, to the owner (arrival),
// pass after pass until ctx ends. A pass ends on an error, or when the
// owner, the store's check or a change of the namespaces served asks for a
// load again.
func (p *Pusher) follow(ctx context.Context) {
	loadedOnce := false
	for pass := uint64(1); ; pass++ {
		loaded, err := p.followOnce(ctx, pass)
		loadedOnce = loadedOnce || loaded
		if ctx.Err() != nil {
			return
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
		case !loadedOnce:
			// A clean start that comes before the store or the stream
			// (the relay makes the stream): nothing is lost yet.
			p.cfg.Log.Info("waiting for the store and the change stream", "err", err, "retry_in", p.cfg.RetryDelay)
		default:
			p.cfg.Log.Warn("lost the store or the change stream; serving the last config", "err", err, "retry_in", p.cfg.RetryDelay)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(p.cfg.RetryDelay):
		}
	}
}

// followOnce loads the store and follows the stream until an error, or
// until the pass is ended (its cause is returned), and whether it got as
// far as the load.
func (p *Pusher) followOnce(ctx context.Context, pass uint64) (bool, error) {
	// Take the stream position before the load: every event at or before
	// it is in the load, and later ones older than the load are skipped.
	seq, err := p.cfg.Feed.LastSeq(ctx)
	if err != nil {
		return false, err
	}
	items, rev, scope, sidecars, err := p.load(ctx)
	if err != nil {
		return false, err
	}
	// The owner, or the store's check, ends the pass with a cause: a
	// change that asks for a load again, a store restored.
	ctx, end := context.WithCancelCause(ctx)
	defer end(nil)
	p.m.scope.Set(float64(len(scope)))
	p.m.loads.Inc()
	p.cfg.Log.Info("mesh loaded from the store", "revision", rev, "objects", len(items), "stream_seq", seq, "namespaces", scope)
	if !p.send(ctx, arrival{pass: pass, at: time.Now(), seq: seq,
		load: &loaded{items: items, rev: rev, scope: scope, sidecars: sidecars, end: end}}) {
		return true, ctx.Err()
	}
	p.following.Store(true)
	defer func() {
		p.lostAt.Store(time.Now().UnixNano())
		p.following.Store(false)
	}()
	// The store is checked beside the stream: events that stop coming
	// while the store moves on, whatever the cause, are said (Stale), and
	// a store that went back (restored) is loaded again.
	var checker sync.WaitGroup
	if sw, ok := p.cfg.Loader.(StoreWatcher); ok && p.cfg.StoreCheck > 0 {
		checker.Go(func() { p.checkStore(ctx, sw, scope, end) })
	}
	checker.Go(func() {
		select {
		case <-ctx.Done():
		case <-p.served.reloads:
			end(fmt.Errorf("%w: the namespaces served changed", errReload))
		}
	})
	defer func() {
		end(nil)
		checker.Wait()
		p.behind.Store(0)
	}()
	r := reader{pass: pass, rev: rev}
	fn := func(n uint64, ev *meshv1.ChangeEvent) error { return p.read(ctx, &r, n, ev) }
	if scope != nil {
		err = p.cfg.Feed.(ScopedFeed).ConsumeNamespaces(ctx, seq+1, scope, fn)
	} else {
		err = p.cfg.Feed.Consume(ctx, seq+1, fn)
	}
	if cause := context.Cause(ctx); errors.Is(cause, errReload) {
		return true, cause
	}
	return true, err
}

// send hands an arrival to the owner; false when ctx ended first.
func (p *Pusher) send(ctx context.Context, a arrival) bool {
	select {
	case p.arrivals <- a:
		return true
	case <-ctx.Done():
		return false
	}
}

// StoreWatcher is a Loader that can tell, cheaply, whether the store holds
// changes after a revision (see store.Store.Ahead).
type StoreWatcher interface {
	Ahead(ctx context.Context, after int64, keep func(key string) bool, wait time.Duration) (first, current int64, err error)
}

// checkStore compares, every StoreCheck, what the pusher applied with what
// the store holds: a change of its scope that the stream has not brought
// by the next check makes the pusher behind the store (Stale, StaleReason)
// from when it was first seen, until it is applied. A store whose revision
// is below what the pusher applied, twice running, was restored from a
// snapshot: the pass ends (reload) so that the mesh is loaded again, as
// when the history no longer reaches what the pusher applied.
func (p *Pusher) checkStore(ctx context.Context, sw StoreWatcher, scope []string, reload context.CancelCauseFunc) {
	t := time.NewTicker(p.cfg.StoreCheck)
	defer t.Stop()
	keep := inScope(scope)
	var checked, pending int64 // nothing unapplied up to checked; a change found unapplied
	var foundAt time.Time
	backwards := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		applied := p.applied.Load()
		if pending != 0 && applied >= pending {
			pending = 0
			p.behind.Store(0)
		}
		first, current, err := sw.Ahead(ctx, max(applied, checked, pending-1), keep, min(p.cfg.StoreCheck/2, 2*time.Second))
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, model.ErrCompacted):
			reload(fmt.Errorf("%w: the store's history no longer reaches revision %d, the last applied: %v", errReload, applied, err))
			return
		case err != nil:
			continue // the store is out of reach: nothing to compare with
		case current < applied:
			if backwards++; backwards >= 2 {
				p.m.storeBack.Inc()
				reload(fmt.Errorf("%w: the store's revision went back from %d to %d (restored from a snapshot?)", errReload, applied, current))
				return
			}
			continue
		}
		backwards = 0
		switch {
		case first == 0:
			checked, pending = current, 0
			p.behind.Store(0)
		case pending == 0:
			pending, foundAt = first, time.Now() // confirmed, or not, at the next check
		default:
			if p.behind.Load() == 0 {
				p.cfg.Log.Warn("behind the store: a change the change stream has not brought", "revision", pending, "applied", applied, "store_revision", current, "since", foundAt)
			}
			p.behindRev.Store(pending)
			p.behind.Store(foundAt.UnixNano())
		}
	}
}

// inScope returns whether a store key is of a scope's objects (nil scope:
// every key); a key that does not parse is, as its event would be followed.
func inScope(scope []string) func(key string) bool {
	if scope == nil {
		return nil
	}
	return func(key string) bool {
		k, err := model.ParseKey(key)
		return err != nil || model.MeshWide(k.Kind) || slices.Contains(scope, k.Namespace)
	}
}

// revisionJump is how far past the last applied revision an event may be
// before the store is asked whether it has come that far: a forged event
// far in the future would otherwise hold its key until the store caught up.
const revisionJump = 1 << 20

// reader is a pass's reading of the change stream: rev is the highest
// revision handed to the owner, the revision its state reaches once it
// took them.
type reader struct {
	pass uint64
	rev  int64
}

// read checks and decodes a change event, reading the store where the
// event asks it to, and hands it to the owner. An error ends the pass.
func (p *Pusher) read(ctx context.Context, r *reader, seq uint64, ev *meshv1.ChangeEvent) error {
	if ev == nil {
		// Its change would be lost: read the store again instead.
		p.m.events.WithLabelValues("invalid").Inc()
		return fmt.Errorf("%w: an undecodable change event", errReload)
	}
	consumed := arrival{pass: r.pass, seq: seq} // read, nothing to apply
	if ev.Revision > r.rev+revisionJump {
		rev, err := p.cfg.Loader.Revision(ctx)
		if err != nil {
			return err
		}
		if ev.Revision > rev {
			p.m.events.WithLabelValues("invalid").Inc()
			p.cfg.Log.Warn("change event beyond the store's revision refused", "key", ev.Key, "revision", ev.Revision, "store_revision", rev)
			p.send(ctx, consumed)
			return nil
		}
	}
	if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC {
		switch {
		case ev.Restored:
			return fmt.Errorf("%w: resync at revision %d: the store's history is a new one (restored)", errReload, ev.Revision)
		case ev.Revision > r.rev:
			return fmt.Errorf("%w: resync at revision %d", errReload, ev.Revision)
		}
		p.send(ctx, consumed)
		return nil
	}
	k, err := model.ParseKey(ev.Key)
	if err != nil {
		// The store's List leaves it out too: reloading would not bring
		// it, and it would cost a load for each such key.
		p.m.events.WithLabelValues("invalid").Inc()
		p.cfg.Log.Warn("change event of a key that is not a mesh object's refused", "key", ev.Key, "revision", ev.Revision, "reason", err)
		p.send(ctx, consumed)
		return nil
	}
	if ev.ByReference {
		if ev, err = p.dereference(ctx, ev); err != nil {
			return err
		}
	}
	var obj model.Object
	if ev.Type == meshv1.ChangeEvent_TYPE_PUT {
		if obj, err = model.Decode(k, ev.Value); err != nil {
			// Its change would be lost: read the store again instead.
			p.m.events.WithLabelValues("invalid").Inc()
			return fmt.Errorf("%w: change event %s at revision %d: %v", errReload, ev.Key, ev.Revision, err)
		}
	}
	r.rev = max(r.rev, ev.Revision)
	p.send(ctx, arrival{pass: r.pass, at: time.Now(), seq: seq, key: k, event: ev, obj: obj})
	return nil
}

// A change observed at its source more than clockSkew after it arrived, or
// more than maxApplyLag before, was stamped by a clock that is off.
const (
	clockSkew   = 2 * time.Second
	maxApplyLag = 10 * time.Minute
)

// ValueReader reads a key's current value from the store, for the events
// the bus carries by reference (too large for it).
type ValueReader interface {
	Value(ctx context.Context, key string) (value []byte, modRev int64, err error)
}

// dereference returns the event an event carried by reference stands for:
// the key's value as the store holds it now, at its mod revision (a later
// one than the event's when the key changed since: its own event is then
// older than what the state holds and is skipped), or a DELETE at the
// event's revision when the key is gone.
func (p *Pusher) dereference(ctx context.Context, ev *meshv1.ChangeEvent) (*meshv1.ChangeEvent, error) {
	vr, ok := p.cfg.Loader.(ValueReader)
	if !ok {
		return nil, fmt.Errorf("%w: change event %s at revision %d is carried by reference, and the loader reads no values", errReload, ev.Key, ev.Revision)
	}
	value, modRev, err := vr.Value(ctx, ev.Key)
	if err != nil {
		return nil, err
	}
	if value == nil {
		return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_DELETE, Key: ev.Key, Revision: ev.Revision}, nil
	}
	p.m.byReference.Inc()
	return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: ev.Key, Revision: max(modRev, ev.Revision), Value: value}, nil
}
