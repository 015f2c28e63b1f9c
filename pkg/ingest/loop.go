package ingest

import (
	"context"
	"log/slog"
	"time"
)

// Loop runs a source's syncs: a full one at start, one after every burst
// of changes (once Changed has not been called for the quiet period), a
// full one every resync period to repair drift, a full one as soon as the
// store went back (restored from a snapshot: see Syncer.WentBack), and
// full retries after a failed sync. Changed never blocks and may be called
// from any goroutine; Run returns when its context is done.
type Loop struct {
	// Sync reads the source and syncs it into the store: all of it when
	// full, else what changed since the last sync.
	Sync func(ctx context.Context, full bool) error
	// Quiet is how long changes must stop before a sync: long enough to
	// take the events of one edit together, short enough not to add to
	// convergence. Zero syncs as soon as a change arrives (a sync in
	// progress batches what arrives meanwhile).
	Quiet time.Duration
	// MaxDelay bounds how long a change waits for the quiet period, so
	// that a source that never stops changing is still synced. Default 100ms.
	MaxDelay time.Duration
	// Resync syncs even without changes. Default 5m.
	Resync time.Duration
	// RetryDelay is the pause before retrying a failed sync. Default 1s.
	RetryDelay time.Duration
	// Writer, when set, is what Sync writes through: while a sync left
	// objects waiting for what other sources write, the Loop retries them
	// every PendingEvery (default 5s) until none wait.
	Writer       Writer
	PendingEvery time.Duration
	// StoreCheck is how often the Writer is asked whether the store went
	// back. Default 5s; negative: never.
	StoreCheck time.Duration
	Log        *slog.Logger

	changed chan struct{}
}

// NewLoop returns a Loop with the defaults filled in.
func NewLoop(l Loop) *Loop {
	if l.MaxDelay == 0 {
		l.MaxDelay = 100 * time.Millisecond
	}
	if l.Resync == 0 {
		l.Resync = 5 * time.Minute
	}
	if l.RetryDelay == 0 {
		l.RetryDelay = time.Second
	}
	if l.PendingEvery == 0 {
		l.PendingEvery = 5 * time.Second
	}
	if l.StoreCheck == 0 {
		l.StoreCheck = 5 * time.Second
	}
	if l.Log == nil {
		l.Log = slog.New(slog.DiscardHandler)
	}
	l.changed = make(chan struct{}, 1)
	return &l
}

// Changed says the source's input changed.
func (l *Loop) Changed() {
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// Run syncs until ctx is done.
func (l *Loop) Run(ctx context.Context) error {
	pending, full := true, true // a full sync at once
	var quiet <-chan time.Time
	var first time.Time // the oldest change waiting, zero when none
	resync := time.NewTicker(l.Resync)
	defer resync.Stop()
	var check <-chan time.Time
	if l.Writer != nil && l.StoreCheck > 0 {
		t := time.NewTicker(l.StoreCheck)
		defer t.Stop()
		check = t.C
	}
	var retry <-chan time.Time // set while objects are pending
	armRetry := func() {
		if retry == nil && l.Writer != nil && l.Writer.Pending() {
			retry = time.After(l.PendingEvery)
		}
	}
	for {
		if pending && quiet == nil {
			first = time.Time{}
			if err := l.Sync(ctx, full); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				l.Log.Warn("sync failed; retrying", "err", err, "retry_in", l.RetryDelay)
				quiet, full = time.After(l.RetryDelay), true
			} else {
				pending, full = false, false
				armRetry()
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-l.changed:
			if first.IsZero() {
				first = time.Now()
			}
			pending = true
			if l.Quiet <= 0 {
				continue // at once, or when the retry is due
			}
			wait := min(l.Quiet, max(l.MaxDelay-time.Since(first), 0))
			quiet = time.After(wait)
		case <-quiet:
			quiet = nil
		case <-resync.C:
			pending, full = true, true
		case <-check:
			went, err := l.Writer.WentBack(ctx)
			if err != nil {
				l.Log.Debug("cannot ask the store whether it went back", "err", err)
				continue
			}
			if went {
				l.Log.Error("the store's revision went back (etcd restored from a snapshot?): syncing everything again, to write what it lost")
				pending, full = true, true
			}
		case <-retry:
			retry = nil
			if _, err := l.Writer.RetryPending(ctx); err != nil && ctx.Err() == nil {
				l.Log.Warn("retrying the objects that wait for other sources failed", "err", err)
			}
			armRetry()
		}
	}
}
