package debounce

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Config configures a Debouncer.
type Config[T any] struct {
	// Quiet is how long no value must arrive before the merged value is
	// handed on.
	Quiet time.Duration
	// MaxDelay bounds how long the first pending value waits.
	MaxDelay time.Duration
	// Merge folds a newly added value into the pending one.
	Merge func(pending, added T) T
	// Hold, when set, keeps a settled value back while it returns true:
	// the consumer is still busy with the last one. The batches then last
	// as long as the consumer takes, which under load is what keeps it
	// from falling behind.
	Hold func() bool
	// MaxHold bounds how long Hold keeps the first pending value back.
	// Default MaxDelay.
	MaxHold time.Duration
	// Clock defaults to the real clock.
	Clock Clock
}

// Validate checks the configuration and fills in defaults.
func (c *Config[T]) Validate() error {
	if c.Quiet <= 0 || c.MaxDelay <= 0 {
		return errors.New("debounce: quiet period and maximum delay must be positive")
	}
	if c.MaxDelay < c.Quiet {
		return errors.New("debounce: maximum delay is shorter than the quiet period")
	}
	if c.Merge == nil {
		return errors.New("debounce: a merge function is required")
	}
	if c.MaxHold == 0 {
		c.MaxHold = c.MaxDelay
	}
	if c.MaxHold < 0 {
		return errors.New("debounce: the maximum hold must not be negative")
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return nil
}

// Debouncer merges values until they settle.
type Debouncer[T any] struct {
	cfg    Config[T]
	signal chan struct{}

	mu      sync.Mutex
	pending T
	has     bool
	first   time.Time // when the first pending value arrived
	last    time.Time // when the latest value arrived
}

// New returns a Debouncer.
func New[T any](cfg Config[T]) (*Debouncer[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Debouncer[T]{cfg: cfg, signal: make(chan struct{}, 1)}, nil
}

// Add merges v into the pending value.
func (d *Debouncer[T]) Add(v T) {
	now := d.cfg.Clock.Now()
	d.mu.Lock()
	if d.has {
		d.pending = d.cfg.Merge(d.pending, v)
	} else {
		d.pending, d.has, d.first = v, true, now
	}
	d.last = now
	d.mu.Unlock()
	select {
	case d.signal <- struct{}{}:
	default:
	}
}

// Take hands over at once the part of the pending value that split takes,
// whether it settled or not: split returns what it takes, what stays
// pending, whether it took anything and whether anything stays. What stays
// keeps its place (when its first value arrived).
func (d *Debouncer[T]) Take(split func(pending T) (taken, rest T, took, left bool)) (T, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var zero T
	if !d.has {
		return zero, false
	}
	taken, rest, took, left := split(d.pending)
	if !took {
		return zero, false
	}
	d.pending, d.has = rest, left
	if !left {
		d.pending = zero
	}
	return taken, true
}

// Run hands each settled value to fn until ctx is done.
func (d *Debouncer[T]) Run(ctx context.Context, fn func(T)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.signal:
		}
		for {
			wait, ready := d.due()
			if ready {
				break
			}
			select {
			case <-ctx.Done():
				return nil
			case <-d.signal:
			case <-d.cfg.Clock.After(wait):
			}
		}
		d.mu.Lock()
		v, has := d.pending, d.has
		var zero T
		d.pending, d.has = zero, false
		d.mu.Unlock()
		if has {
			fn(v)
		}
	}
}

// due reports whether the pending value should be handed on, and otherwise
// how long until it should.
func (d *Debouncer[T]) due() (time.Duration, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.has {
		return 0, true
	}
	now := d.cfg.Clock.Now()
	quiet := d.last.Add(d.cfg.Quiet).Sub(now)
	limit := d.first.Add(d.cfg.MaxDelay).Sub(now)
	wait := min(quiet, limit)
	if hold := d.first.Add(d.cfg.MaxHold).Sub(now); wait <= 0 && hold > 0 && d.cfg.Hold != nil && d.cfg.Hold() {
		// Due, but held: look again a quiet period later.
		return min(d.cfg.Quiet, hold), false
	}
	return wait, wait <= 0
}
