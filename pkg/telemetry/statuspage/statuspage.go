// Package statuspage serves the status page of a shardpilot process on its
// admin port ("/"): one server-rendered HTML page, with no external assets,
// showing convergence p50 and p99 over the last minutes as inline SVG
// charts, the connected proxies and their sync state per type, the
// objects the sources rejected with their reasons, and the change
// stream's lag.
//
// The charts come from the process's own Prometheus registry, sampled
// every few seconds (Page.Run): each point is a quantile of the
// convergence histogram's observations over the minute before it, as
// histogram_quantile over rate(...[1m]) computes it. A Page is safe for
// concurrent use.
package statuspage

import (
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics the page reads.
const (
	convergenceMetric = "shardpilot_pusher_convergence_seconds"
	busLagMetric      = "shardpilot_pusher_bus_lag_messages"
	streamsMetric     = "shardpilot_pusher_xds_streams"
	rejectedMetric    = "shardpilot_ingest_rejected_objects_total"
)

// Rejected is an object a source rejected, and why.
type Rejected struct {
	Source, Location, Reason string
}

// Stream is a proxy's stream as the page lists it.
type Stream struct {
	Proxy, Class string
	Delta        bool
	Since        time.Time
	// Types is each type's state: SYNCED, STALE, NOT SENT or NACKED.
	Types map[string]TypeState
}

// TypeState is one type's state on a stream, and the message of the last
// NACK ("" when none).
type TypeState struct {
	State, LastNACK string
}

// Config says what a page shows.
type Config struct {
	// Title names the process ("pusher", "ingester", "standalone") and
	// Version the build.
	Title, Version string
	Gatherer       prometheus.Gatherer
	// Streams lists the proxies connected here; nil: no proxies section.
	Streams func() []Stream
	// Rejected lists what the sources rejected; nil: no such section.
	Rejected func() []Rejected
	// Stale, when set, says how long a pusher has not followed the store
	// (0 while it does): the page shows it as a state of its own.
	Stale func() time.Duration
	// StaleReason, when set, says why (shown beside Stale).
	StaleReason func() string
	// Every is how often the registry is sampled (default 5s), Window the
	// span each point's quantiles cover (default 1m) and Keep how far back
	// the charts go (default 15m).
	Every, Window, Keep time.Duration
	// Proxies is how many proxies are listed at most (default 200); the
	// page says how many more there are.
	Proxies int
}

// Page is the status page.
type Page struct {
	cfg     Config
	started time.Time
	mu      sync.Mutex
	samples []sample
}

// sample is what the registry said at a time.
type sample struct {
	at       time.Time
	buckets  []bucket // the convergence histogram, cumulative, summed over series
	busLag   float64
	streams  float64
	rejected float64
	has      map[string]bool
}

type bucket struct{ le, count float64 }

// New returns a page; Run samples its registry.
func New(cfg Config) *Page {
	cfg.Every = cmp.Or(cfg.Every, 5*time.Second)
	cfg.Window = cmp.Or(cfg.Window, time.Minute)
	cfg.Keep = cmp.Or(cfg.Keep, 15*time.Minute)
	cfg.Proxies = cmp.Or(cfg.Proxies, 200)
	return &Page{cfg: cfg, started: time.Now()}
}

// Run samples the registry until ctx is done.
func (p *Page) Run(ctx context.Context) error {
	t := time.NewTicker(p.cfg.Every)
	defer t.Stop()
	for {
		p.Sample()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample reads the registry now.
func (p *Page) Sample() {
	families, _ := p.cfg.Gatherer.Gather() // a partial gather still has the rest
	s := sample{at: time.Now(), has: map[string]bool{}}
	les := map[float64]float64{}
	for _, f := range families {
		name := f.GetName()
		for _, m := range f.GetMetric() {
			switch name {
			case convergenceMetric:
				for _, b := range m.GetHistogram().GetBucket() {
					if !math.IsInf(b.GetUpperBound(), 1) { // +Inf is the sample count
						les[b.GetUpperBound()] += float64(b.GetCumulativeCount())
					}
				}
				les[math.Inf(1)] += float64(m.GetHistogram().GetSampleCount())
			case busLagMetric:
				s.busLag += m.GetGauge().GetValue()
			case streamsMetric:
				s.streams += m.GetGauge().GetValue()
			case rejectedMetric:
				s.rejected += m.GetCounter().GetValue()
			default:
				continue
			}
			s.has[name] = true
		}
	}
	for le, n := range les {
		s.buckets = append(s.buckets, bucket{le, n})
	}
	slices.SortFunc(s.buckets, func(a, b bucket) int { return cmp.Compare(a.le, b.le) })
	p.mu.Lock()
	defer p.mu.Unlock()
	p.samples = append(p.samples, s)
	for len(p.samples) > 0 && s.at.Sub(p.samples[0].at) > p.cfg.Keep+p.cfg.Window {
		p.samples = p.samples[1:]
	}
}

// Point is one point of a chart: a time and a value per line (NaN: none).
type Point struct {
	At     time.Time
	Values []float64
}

// Convergence returns, per sample, the p50 and p99 of the convergence
// observed over the window before it (none where nothing was observed).
func (p *Page) Convergence() []Point {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Point
	for i, s := range p.samples {
		j := i // the earliest sample within the window before s
		for j > 0 && s.at.Sub(p.samples[j-1].at) <= p.cfg.Window {
			j--
		}
		if j == i || !s.has[convergenceMetric] {
			continue
		}
		delta := increase(p.samples[j].buckets, s.buckets)
		out = append(out, Point{At: s.at, Values: []float64{quantile(0.5, delta), quantile(0.99, delta)}})
	}
	return out
}

// series returns a gauge or counter over time.
func (p *Page) series(metric string, value func(sample) float64) []Point {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []Point
	for _, s := range p.samples {
		if s.has[metric] {
			out = append(out, Point{At: s.at, Values: []float64{value(s)}})
		}
	}
	return out
}

// increase returns the observations between two cumulative histograms.
func increase(from, to []bucket) []bucket {
	before := map[float64]float64{}
	for _, b := range from {
		before[b.le] = b.count
	}
	out := make([]bucket, len(to))
	for i, b := range to {
		out[i] = bucket{b.le, max(b.count-before[b.le], 0)}
	}
	return out
}

// quantile estimates a quantile from cumulative buckets sorted by upper
// bound, the last +Inf, as Prometheus's histogram_quantile does: linear
// within the bucket it falls in. NaN when there are no observations.
func quantile(q float64, bs []bucket) float64 {
	if len(bs) < 2 || bs[len(bs)-1].count == 0 {
		return math.NaN()
	}
	rank := q * bs[len(bs)-1].count
	i, _ := slices.BinarySearchFunc(bs, rank, func(b bucket, r float64) int { return cmp.Compare(b.count, r) })
	if i == len(bs)-1 {
		return bs[len(bs)-2].le // in the +Inf bucket: the highest finite bound
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = bs[i-1].le, bs[i-1].count
	}
	in := bs[i].count - below
	if in == 0 {
		return bs[i].le
	}
	return lo + (bs[i].le-lo)*(rank-below)/in
}

//go:embed page.html
var pageHTML string

var page = template.Must(template.New("page").Parse(pageHTML))

// view is what the template renders.
type view struct {
	Title, Now    string
	Version       string
	Convergence   Chart
	Latest        []string // p50, p99 now
	BusLag        *Chart
	Streams       string
	Proxies       []proxyRow
	More          int
	Types         []string
	States        map[string]int
	ShowProxies   bool
	ShowRejected  bool
	Rejected      []Rejected
	RejectedTotal string
	Stale         string
	StaleReason   string
}

type proxyRow struct {
	Proxy, Class, Kind, Since string
	States                    []state
	worst                     int // the least in sync of its types, by rank
}

type state struct{ Name, Class, Title string }

// ServeHTTP renders the page.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	v := view{Title: p.cfg.Title, Now: time.Now().UTC().Format(time.RFC3339), Version: p.cfg.Version}
	// The charts span the time since the start, from a minute to Keep.
	span := min(max(time.Since(p.started).Round(time.Minute)+time.Minute, time.Minute), p.cfg.Keep)
	conv := p.Convergence()
	v.Convergence = chart("convergence", "Convergence, source observed → proxy ACK (p50, p99 over the minute before)", conv, []string{"p50", "p99"}, fmtMS, span, 0.01)
	if n := len(conv); n > 0 {
		v.Latest = []string{fmtMS(conv[n-1].Values[0]), fmtMS(conv[n-1].Values[1])}
	}
	if lag := p.series(busLagMetric, func(s sample) float64 { return s.busLag }); len(lag) > 0 {
		c := chart("buslag", "Change stream lag (messages behind)", lag, []string{"lag"}, func(v float64) string { return fmt.Sprintf("%.3g", v) }, span, 4)
		v.BusLag = &c
	}
	if s := p.series(streamsMetric, func(s sample) float64 { return s.streams }); len(s) > 0 {
		v.Streams = fmt.Sprintf("%.0f", s[len(s)-1].Values[0])
	}
	if p.cfg.Stale != nil {
		if d := p.cfg.Stale(); d > 0 {
			v.Stale = d.Round(time.Second).String()
			v.StaleReason = "stale: not following the store, serving the last config"
			if p.cfg.StaleReason != nil {
				v.StaleReason = p.cfg.StaleReason()
			}
		}
	}
	if p.cfg.Streams != nil {
		v.ShowProxies = true
		v.Proxies, v.More, v.Types, v.States = p.proxies()
	}
	if p.cfg.Rejected != nil {
		v.ShowRejected = true
		v.Rejected = p.cfg.Rejected()
		slices.SortFunc(v.Rejected, func(a, b Rejected) int {
			return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Location, b.Location))
		})
		if r := p.series(rejectedMetric, func(s sample) float64 { return s.rejected }); len(r) > 0 {
			v.RejectedTotal = fmt.Sprintf("%.0f", r[len(r)-1].Values[0])
		}
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	if err := page.Execute(w, v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// proxies lists the proxies with the least in sync first, at most
// cfg.Proxies of them, and counts the states per type.
func (p *Page) proxies() ([]proxyRow, int, []string, map[string]int) {
	streams := p.cfg.Streams()
	typeSet := map[string]bool{}
	for _, s := range streams {
		for t := range s.Types {
			typeSet[t] = true
		}
	}
	types := slices.Sorted(maps.Keys(typeSet))
	rank := map[string]int{"NACKED": 0, "STALE": 1, "NOT SENT": 2, "SYNCED": 3, "-": 4}
	counts := map[string]int{}
	rows := make([]proxyRow, 0, len(streams))
	for _, s := range streams {
		kind := "SotW"
		if s.Delta {
			kind = "Delta"
		}
		row := proxyRow{Proxy: s.Proxy, Class: s.Class, Kind: kind, Since: time.Since(s.Since).Round(time.Second).String(), worst: rank["-"]}
		for _, t := range types {
			st := state{Name: "-", Class: "none"}
			if ts, ok := s.Types[t]; ok {
				st = state{Name: ts.State, Class: strings.ToLower(strings.ReplaceAll(ts.State, " ", "-"))}
				if ts.LastNACK != "" {
					st.Title = "last NACK: " + ts.LastNACK
				}
				counts[st.Name]++
			}
			row.States = append(row.States, st)
			row.worst = min(row.worst, rank[st.Name])
		}
		rows = append(rows, row)
	}
	slices.SortStableFunc(rows, func(a, b proxyRow) int { return cmp.Compare(a.worst, b.worst) })
	shown := min(len(rows), p.cfg.Proxies)
	return rows[:shown], len(rows) - shown, types, counts
}

func fmtMS(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 10:
		return fmt.Sprintf("%.1f s", v)
	case v >= 1:
		return fmt.Sprintf("%.2f s", v)
	}
	return fmt.Sprintf("%.0f ms", v*1000)
}
