package ingest

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/model"
)

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

// Report is what the syncers of a process report: the ingest metrics,
// labelled by source, and each source's current problems (for the status
// page and the problems endpoint).
type Report struct {
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
func (m *Report) Problems() map[string][]Problem {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.current)
}

// Forget drops a source's problems, when this process stops syncing it
// (it lost the source's leadership): the new leader reports them. A nil
// Report forgets nothing.
func (m *Report) Forget(source string) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.current, source)
}

func (m *Report) setProblems(source string, problems []Problem) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.current == nil {
		m.current = map[string][]Problem{}
	}
	m.current[source] = slices.Clone(problems)
}

// NewReport creates a report and registers its metrics on reg (nil
// registers nothing).
func NewReport(reg prometheus.Registerer) (*Report, error) {
	m := &Report{
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_rejected_objects_total",
			Help: "Inputs rejected as invalid (normalization and validation errors), by source."}, []string{"source"}),
		warnings: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_ignored_fields_total",
			Help: "Inputs applied with a field that has no effect yet (said, never dropped in silence), by source."}, []string{"source"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_store_writes_total",
			Help: "Store writes by source, kind and operation (put, delete)."}, []string{"source", "kind", "op"}),
		objects: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "shardpilot_ingest_objects",
			Help: "Objects a source holds in the store, by kind."}, []string{"source", "kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "shardpilot_ingest_store_write_seconds",
			Help: "Latency of one guarded store transaction (a put or delete, or up to 64 of them at once), by source.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"source"}),
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
