package app

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Election makes a part run only while this process leads the part's
// election in etcd, so that replicas of the ingester take turns; the zero
// value runs the part unelected.
type Election struct {
	// ID names this replica (the pod name, say); empty disables elections.
	ID string
	// TTL is how long a crashed leader keeps its leadership. Default 10s.
	TTL time.Duration
	// Share, when set, spreads the elections over the replicas alive.
	Share *Share
}

// Share spreads the elections a replica runs (its sources, the relay)
// over the replicas alive, so that ingest scales past one leader: a
// replica leading more than its fair share (its elections over the
// replicas announced in etcd, rounded up) gives one up, one at a time,
// when another replica is waiting for it.
type Share struct {
	Etcd *clientv3.Client
	// Role is the role the replicas are announced under ("ingester").
	Role string
	// Every is how often a leader checks its share. Default 5s.
	Every time.Duration
	Log   *slog.Logger

	mu        sync.Mutex
	elections int
	leading   int
	led       map[string]bool // the elections led now
	runs      map[string]bool // every election this replica runs
	yielded   time.Time
}

// Runs returns every election this replica runs, each with whether it
// leads it now.
func (s *Share) Runs() map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]bool, len(s.runs))
	for name := range s.runs {
		out[name] = s.led[name]
	}
	return out
}

// running records that this replica runs an election (led says it leads
// it now, as an unelected replica leads everything it runs), until the
// returned func is called.
func (s *Share) running(name string, led bool) (stop func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runs == nil {
		s.runs = map[string]bool{}
	}
	if s.led == nil {
		s.led = map[string]bool{}
	}
	s.runs[name] = true
	if led {
		s.led[name] = true
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.runs, name)
		if led {
			delete(s.led, name)
		}
	}
}

// Leading returns the elections this replica leads now, in order.
func (s *Share) Leading() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.led))
}

// errYielded ends a term given up for another replica.
var errYielded = errors.New("app: leadership given up to another replica (fair share)")

// lead runs run for one term of an election, giving the term up when this
// replica leads more than its share and another replica waits for it.
func (s *Share) lead(ctx context.Context, election string, run func(context.Context) error) error {
	every := cmp.Or(s.Every, 5*time.Second)
	s.mu.Lock()
	s.leading++
	if s.led == nil {
		s.led = map[string]bool{}
	}
	s.led[election] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.leading--
		delete(s.led, election)
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	var watching sync.WaitGroup
	defer watching.Wait() // the watcher does not outlive the lead
	defer cancel(nil)
	watching.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if s.over(ctx, election, every) {
					cancel(errYielded)
					return
				}
			}
		}
	})
	err := run(ctx)
	if errors.Is(context.Cause(ctx), errYielded) {
		return errYielded
	}
	return err
}

// over reports whether this replica should give up the election: it leads
// more than its share, gave up none for a while, and another replica
// campaigns for it.
func (s *Share) over(ctx context.Context, election string, every time.Duration) bool {
	members, err := store.Members(ctx, s.Etcd, s.Role)
	if err != nil || len(members) < 2 {
		return false
	}
	s.mu.Lock()
	fair := (s.elections + len(members) - 1) / len(members)
	if s.leading <= fair || time.Since(s.yielded) < 2*every {
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	resp, err := s.Etcd.Get(ctx, store.ElectionPrefix+election+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count < 2 {
		return false // nobody else campaigns for it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leading <= fair || time.Since(s.yielded) < 2*every {
		return false
	}
	s.yielded = time.Now()
	if s.Log != nil {
		s.Log.Info("giving up a leadership to another replica", "election", election, "leading", s.leading, "fair_share", fair, "replicas", len(members))
	}
	return true
}

// led runs run while this process leads the named election (or at once,
// unelected), pointing term, if given, at the store to write through:
// fenced by the leadership, so a deposed leader's writes are refused.
func led(ctx context.Context, etcd *clientv3.Client, e Election, name string, log *slog.Logger, term *termStore, run func(context.Context) error) error {
	if e.ID == "" {
		if term != nil {
			term.cur.Store(store.New(etcd))
		}
		if e.Share != nil {
			defer e.Share.running(name, true)()
		}
		return run(ctx)
	}
	el := &store.Elector{Client: etcd, Name: name, ID: e.ID, TTL: e.TTL, Log: log}
	if e.Share != nil {
		e.Share.mu.Lock()
		e.Share.elections++
		e.Share.mu.Unlock()
		defer e.Share.running(name, false)()
	}
	return el.Run(ctx, func(ctx context.Context, fenced *store.Store) error {
		if term != nil {
			term.cur.Store(fenced)
		}
		if e.Share != nil {
			return e.Share.lead(ctx, name, run)
		}
		return run(ctx)
	})
}

// forgetting runs a source for one leadership term, and forgets its
// problems when the term ends: a replica that no longer syncs a source
// does not list its problems (the leader does).
func forgetting(m *ingest.Report, source string, run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		defer m.Forget(source)
		return run(ctx)
	}
}

// leadsDesc describes the Share's per-election gauge.
var leadsDesc = prometheus.NewDesc("shardpilot_ingester_leads",
	"Each election (source/<name>, relay) this replica runs: 1 while it leads it (an unelected replica leads all it runs), 0 while it waits. "+
		"An election no replica leads (every one at 0) is a source nobody syncs, or the relay stopped.",
	[]string{"election"}, nil)

// Collector reports, for each election this replica runs, whether it
// leads it now (shardpilot_ingester_leads).
func (s *Share) Collector() prometheus.Collector { return leadsCollector{s} }

type leadsCollector struct{ s *Share }

func (c leadsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- leadsDesc }

func (c leadsCollector) Collect(ch chan<- prometheus.Metric) {
	for name, led := range c.s.Runs() {
		v := 0.0
		if led {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(leadsDesc, prometheus.GaugeValue, v, name)
	}
}
