package debounce

import (
	"testing"
	"time"
)

// got is a value handed on, and when.
type got struct {
	at time.Duration
	n  int
}

// drive runs an owner's loop over d in virtual time: it adds 1 at each of
// adds (offsets from the start, in order), calls busy before each poll to
// say what Hold will read, polls when nothing else happens first, as the
// pusher's owner does, and returns what was handed on until end.
func drive(d *Debouncer[int], adds []time.Duration, end time.Duration) []got {
	start := time.Unix(1_000_000, 0)
	var out []got
	now := time.Duration(0)
	for now <= end {
		v, ready, wait := d.Poll(start.Add(now))
		if ready {
			out = append(out, got{now, v})
			continue
		}
		next := end + 1
		if wait > 0 {
			next = now + wait
		}
		if len(adds) > 0 && adds[0] <= next {
			now = adds[0]
			d.Add(1, start.Add(now))
			adds = adds[1:]
			continue
		}
		now = next
	}
	return out
}

func TestDebounce(t *testing.T) {
	tests := map[string]struct {
		adds []time.Duration // offsets of Add calls from the start
		want []got
	}{
		"single value waits the quiet period": {
			adds: []time.Duration{0},
			want: []got{{100 * time.Millisecond, 1}},
		},
		"burst merges and settles after the last add": {
			adds: []time.Duration{0, 50 * time.Millisecond, 90 * time.Millisecond},
			want: []got{{190 * time.Millisecond, 3}},
		},
		"a steady stream is cut at the maximum delay": {
			adds: func() []time.Duration {
				var d []time.Duration
				for i := range 30 {
					d = append(d, time.Duration(i)*45*time.Millisecond)
				}
				return d
			}(),
			want: []got{{time.Second, 23}, {1405 * time.Millisecond, 7}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			d, err := New(Config[int]{Quiet: 100 * time.Millisecond, MaxDelay: time.Second,
				Merge: func(a, b int) int { return a + b }})
			if err != nil {
				t.Fatal(err)
			}
			gots := drive(d, tc.adds, 5*time.Second)
			if len(gots) != len(tc.want) {
				t.Fatalf("got %d hand-offs %v, want %d", len(gots), gots, len(tc.want))
			}
			for i, w := range tc.want {
				if gots[i] != w {
					t.Errorf("hand-off %d: got %v after %s, want %d after %s", i, gots[i].n, gots[i].at, w.n, w.at)
				}
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	merge := func(a, b int) int { return a }
	for name, c := range map[string]Config[int]{
		"zero quiet":        {MaxDelay: time.Second, Merge: merge},
		"max below quiet":   {Quiet: time.Second, MaxDelay: time.Millisecond, Merge: merge},
		"no merge function": {Quiet: time.Millisecond, MaxDelay: time.Second},
		"negative hold":     {Quiet: time.Millisecond, MaxDelay: time.Second, MaxHold: -1, Merge: merge},
	} {
		if _, err := New(c); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

// TestHoldWaitsForTheConsumer: a settled value is held while Hold says the
// consumer is busy, at most until the maximum hold, and goes at once
// (after the quiet period) when it is not.
func TestHoldWaitsForTheConsumer(t *testing.T) {
	var busyUntil time.Duration // Hold reads true before it
	var now time.Duration
	d, err := New(Config[int]{Quiet: 10 * time.Millisecond, MaxDelay: time.Second, MaxHold: 3 * time.Second,
		Merge: func(a, b int) int { return a + b }, Hold: func() bool { return now < busyUntil }})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Unix(1_000_000, 0)
	// poll is the owner's loop from now until a value is handed on, with
	// the adds at the offsets given.
	poll := func(adds ...time.Duration) got {
		for {
			v, ready, wait := d.Poll(start.Add(now))
			if ready {
				return got{now, v}
			}
			if wait == 0 {
				t.Fatalf("at %s: nothing pending", now)
			}
			if len(adds) > 0 && adds[0] <= now+wait {
				now = adds[0]
				d.Add(1, start.Add(now))
				adds = adds[1:]
				continue
			}
			now += wait
		}
	}
	d.Add(1, start) // idle: goes after the quiet period
	if g := poll(); g != (got{10 * time.Millisecond, 1}) {
		t.Errorf("idle: %+v, want 1 at 10ms", g)
	}
	busyUntil = 310 * time.Millisecond // busy: held, merging what comes, until busy ends
	d.Add(1, start.Add(now))
	if g := poll(now + 200*time.Millisecond); g.n != 2 || g.at < 310*time.Millisecond || g.at > 330*time.Millisecond {
		t.Errorf("busy until 310ms: %+v, want 2 just after", g)
	}
	busyUntil = time.Hour // busy for good: cut at the maximum hold
	d.Add(1, start.Add(now))
	mark := now
	if g := poll(); g.n != 1 || g.at-mark != 3*time.Second {
		t.Errorf("always busy: %+v, want 1 three seconds after %s", g, mark)
	}
	// Changes that never settle, while busy: also held to the maximum hold.
	mark = now
	var adds []time.Duration
	for i := range 40 {
		adds = append(adds, mark+time.Duration(i)*100*time.Millisecond) // 30 before the maximum hold
	}
	d.Add(1, start.Add(adds[0]))
	if g := poll(adds[1:]...); g.n < 30 || g.n > 31 || g.at-mark != 3*time.Second {
		t.Errorf("never quiet, always busy: %+v, want 30 three seconds after %s", g, mark)
	}
}

// TestTake: a part of the pending value goes at once; the rest stays
// pending in its batch and settles as before; taking all leaves nothing.
func TestTake(t *testing.T) {
	d, err := New(Config[[]string]{Quiet: 100 * time.Millisecond, MaxDelay: time.Second,
		Merge: func(a, b []string) []string { return append(a, b...) }})
	if err != nil {
		t.Fatal(err)
	}
	split := func(want string) func([]string) ([]string, []string, bool, bool) {
		return func(pending []string) (taken, rest []string, took, left bool) {
			for _, v := range pending {
				if v == want {
					taken = append(taken, v)
				} else {
					rest = append(rest, v)
				}
			}
			return taken, rest, len(taken) > 0, len(rest) > 0
		}
	}
	start := time.Unix(1_000_000, 0)
	if _, ok := d.Take(split("eds")); ok {
		t.Error("took from nothing pending")
	}
	d.Add([]string{"full"}, start)
	d.Add([]string{"eds"}, start)
	if got, ok := d.Take(split("eds")); !ok || len(got) != 1 {
		t.Errorf("Take = %v, %v; want [eds]", got, ok)
	}
	if _, ok := d.Take(split("eds")); ok {
		t.Error("took the same value twice")
	}
	if _, ready, wait := d.Poll(start.Add(50 * time.Millisecond)); ready || wait != 50*time.Millisecond {
		t.Errorf("the rest: ready %v, wait %s; want its quiet period's end, 50ms on", ready, wait)
	}
	if v, ready, _ := d.Poll(start.Add(100 * time.Millisecond)); !ready || len(v) != 1 || v[0] != "full" {
		t.Errorf("handed on %v (%v), want [full]", v, ready)
	}
	d.Add([]string{"eds"}, start.Add(time.Second))
	if got, ok := d.Take(split("eds")); !ok || len(got) != 1 {
		t.Errorf("Take = %v, %v; want [eds]", got, ok)
	}
	if _, ready, wait := d.Poll(start.Add(2 * time.Second)); ready || wait != 0 {
		t.Errorf("after all was taken: ready %v, wait %s; want nothing pending", ready, wait)
	}
}
