package statuspage_test

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
)

// The page shows the convergence of the minute before each sample, the
// proxies with the one that NACKed first, and the rejected objects.
func TestPage(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_convergence_seconds", Buckets: prometheus.ExponentialBuckets(0.005, 1.15, 69)})
	streams := prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_xds_streams"})
	reg.MustRegister(h, streams)
	streams.Set(2)
	now := time.Now()
	page := statuspage.New(statuspage.Config{Title: "pusher", Gatherer: reg,
		Streams: func() []statuspage.Stream {
			return []statuspage.Stream{
				{Proxy: "sidecar~10.0.0.1~good.demo~demo.svc.cluster.local", Since: now, Types: map[string]statuspage.TypeState{"CDS": {State: "SYNCED"}}},
				{Proxy: "sidecar~10.0.0.2~bad.demo~demo.svc.cluster.local", Delta: true, Since: now,
					Types: map[string]statuspage.TypeState{"CDS": {State: "NACKED", LastNACK: "bad cluster"}}},
			}
		},
		Rejected: func() []statuspage.Rejected {
			return []statuspage.Rejected{{Source: "yaml", Location: "a.yaml document 2", Reason: "spec.http[0]: no route"}}
		}})
	page.Sample()
	for range 100 {
		h.Observe(0.05)
	}
	page.Sample()
	conv := page.Convergence()
	if len(conv) != 1 || conv[0].Values[1] < 0.045 || conv[0].Values[1] > 0.055 {
		t.Fatalf("convergence points %v; want one, p99 near 50 ms", conv)
	}
	w := httptest.NewRecorder()
	page.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	body := w.Body.String()
	for _, want := range []string{`<svg id="convergence"`, `<polyline class="s1" data-series="p99"`, "connected proxies",
		"bad cluster", "spec.http[0]: no route", "a.yaml document 2"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if bad, good := strings.Index(body, "bad.demo"), strings.Index(body, "good.demo"); bad < 0 || good < 0 || bad > good {
		t.Errorf("the proxy that NACKed is not listed first (at %d, the synced one at %d)", bad, good)
	}
	if !strings.Contains(body, `class="nacked"`) {
		t.Error("no NACKED state shown")
	}
}
