package debounce

import (
	"errors"
	"time"
)

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
	return nil
}

// Debouncer merges values until they settle. It is not safe for
// concurrent use: one goroutine owns it.
type Debouncer[T any] struct {
	cfg     Config[T]
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
	return &Debouncer[T]{cfg: cfg}, nil
}

// Add merges v, which arrived at at, into the pending value.
func (d *Debouncer[T]) Add(v T, at time.Time) {
	if d.has {
		d.pending = d.cfg.Merge(d.pending, v)
	} else {
		d.pending, d.has, d.first = v, true, at
	}
	if at.After(d.last) {
		d.last = at
	}
}

// Take hands over at once the part of the pending value that split takes,
// whether it settled or not: split returns what it takes, what stays
// pending, whether it took anything and whether anything stays. What stays
// keeps its place (when its first value arrived).
func (d *Debouncer[T]) Take(split func(pending T) (taken, rest T, took, left bool)) (T, bool) {
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

// Poll hands over the pending value when it is due at now (ready).
// Otherwise wait says how long until it may be (a value held by Hold is
// asked about again a quiet period later), or is 0 when nothing is
// pending.
func (d *Debouncer[T]) Poll(now time.Time) (v T, ready bool, wait time.Duration) {
	if !d.has {
		return v, false, 0
	}
	quiet := d.last.Add(d.cfg.Quiet).Sub(now)
	limit := d.first.Add(d.cfg.MaxDelay).Sub(now)
	wait = min(quiet, limit)
	if hold := d.first.Add(d.cfg.MaxHold).Sub(now); wait <= 0 && hold > 0 && d.cfg.Hold != nil && d.cfg.Hold() {
		// Due, but held: look again a quiet period later.
		return v, false, min(d.cfg.Quiet, hold)
	}
	if wait > 0 {
		return v, false, wait
	}
	v = d.pending
	var zero T
	d.pending, d.has = zero, false
	return v, true, 0
}
