package main

import (
	"bufio"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/report"
)

// stage is one step of a change's way to the proxies, as a histogram one
// of the control plane's processes exports.
type stage struct {
	name, metric string
	ingester     bool // exported by the ingester, else by the pushers
}

// stages are the steps of convergence, in order. Each is measured by the
// process that does it, so together they show where the time goes.
var stages = []stage{
	{"source observed → store commit", "shardpilot_ingest_commit_lag_seconds", true},
	{"source observed → applied by the pusher", "shardpilot_pusher_apply_lag_seconds", false},
	{"batch wait in the pusher", "shardpilot_pusher_debounce_seconds", false},
	{"generation", "shardpilot_pusher_generation_seconds", false},
	{"wait for a push slot", "shardpilot_pusher_xds_push_queue_seconds", false},
	{"response write", "shardpilot_pusher_xds_send_seconds", false},
	{"source observed → proxy ACK", "shardpilot_pusher_convergence_seconds", false},
}

// buckets are a histogram's cumulative counts by upper bound, summed over
// label sets and processes.
type buckets map[float64]float64

// scrapeStages reads every stage's histogram from the processes' /metrics.
func scrapeStages(ingester *proc, pushers []*proc) []buckets {
	out := make([]buckets, len(stages))
	for i := range out {
		out[i] = buckets{}
	}
	read := func(p *proc, ingest bool) {
		if p == nil || p.admin == "" {
			return
		}
		c := http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get("http://" + p.admin + "/metrics")
		if err != nil {
			return
		}
		defer resp.Body.Close()
		parseBuckets(resp.Body, func(metric string, le, count float64) {
			for i, s := range stages {
				if s.ingester == ingest && s.metric == metric {
					out[i][le] += count
				}
			}
		})
	}
	read(ingester, true)
	for _, p := range pushers {
		read(p, false)
	}
	return out
}

// parseBuckets calls fn for every histogram bucket line of the Prometheus
// text format ("<metric>_bucket{...,le="0.5"} 12").
func parseBuckets(r io.Reader, fn func(metric string, le, count float64)) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "_bucket{")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		_, after, ok := strings.Cut(rest, `le="`)
		if !ok {
			continue
		}
		leText, after, ok := strings.Cut(after, `"`)
		if !ok {
			continue
		}
		fields := strings.Fields(after)
		if len(fields) == 0 {
			continue
		}
		le, err1 := strconv.ParseFloat(leText, 64)
		count, err2 := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err1 == nil && err2 == nil {
			fn(name, le, count)
		}
	}
}

// stageSummaries turns the histograms' growth between two scrapes into
// quantiles per stage (interpolated within buckets, as Prometheus's
// histogram_quantile does).
func stageSummaries(before, after []buckets) []report.Stage {
	var out []report.Stage
	for i, s := range stages {
		var les []float64
		for le := range after[i] {
			les = append(les, le)
		}
		slices.Sort(les)
		cum := make([]float64, len(les))
		for j, le := range les {
			cum[j] = after[i][le] - before[i][le]
		}
		if len(cum) == 0 || cum[len(cum)-1] <= 0 {
			continue
		}
		total := cum[len(cum)-1]
		q := func(q float64) float64 {
			rank := q * total
			for j, c := range cum {
				if c < rank {
					continue
				}
				lo, below := 0.0, 0.0
				if j > 0 {
					lo, below = les[j-1], cum[j-1]
				}
				hi := les[j]
				if math.IsInf(hi, 1) {
					return lo
				}
				if c == below {
					return hi
				}
				return lo + (hi-lo)*(rank-below)/(c-below)
			}
			return les[len(les)-1]
		}
		out = append(out, report.Stage{Name: s.name, N: int(total), P50: q(0.5), P99: q(0.99)})
	}
	return out
}

// counterOf sums a counter's series on a process's /metrics (0 when it
// cannot be read).
func counterOf(p *proc, metric string) float64 {
	if p == nil || p.admin == "" {
		return 0
	}
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") && !strings.HasPrefix(line, metric+" ") {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum += v
		}
	}
	return sum
}
