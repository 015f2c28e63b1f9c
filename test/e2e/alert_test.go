package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shardpilot/shardpilot/internal/testutil"
)

// startPrometheus runs Debian's Prometheus scraping target every two
// seconds (a pusher's scrape waits up to a second for NATS's answer while
// NATS is down) and evaluating rules every second, and returns its
// address once it has loaded the rules.
func startPrometheus(t *testing.T, target, rules string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("SHARDPILOT_REQUIRE_PROMETHEUS") != "" {
			t.Fatal("no prometheus on PATH (apt-get install prometheus)")
		}
		t.Skip("no prometheus on PATH: install Debian's prometheus package to run this test")
	}
	addr := testutil.FreeAddr(t)
	cfg := filepath.Join(t.TempDir(), "prometheus.yml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "global: {scrape_interval: 2s, scrape_timeout: 2s, evaluation_interval: 1s}\nrule_files: [%q]\n"+
		"scrape_configs:\n- job_name: shardpilot-pusher\n  static_configs: [{targets: [%q]}]\n", rules, target), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file", cfg, "--storage.tsdb.path", t.TempDir(), "--web.listen-address", addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testutil.Eventually(t, 60*time.Second, "Prometheus to load the rules", func() (bool, string) {
		resp, err := http.Get("http://" + addr + "/api/v1/rules")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return err == nil && strings.Contains(string(b), "ShardpilotPusherStale"), string(b)
	})
	return addr
}

// firing returns the alerts Prometheus says are firing.
func firing(prom string) ([]string, error) {
	resp, err := http.Get("http://" + prom + "/api/v1/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	var out []string
	for _, a := range body.Data.Alerts {
		if a.State == "firing" {
			out = append(out, a.Labels["alertname"])
		}
	}
	return out, nil
}

// TestStaleAlertFiresWhileNATSIsStopped: with the chart's alert rules
// evaluated by a real Prometheus (ShardpilotPusherStale's threshold and
// for shortened from 30 s and 1m to 2 s and 5 s, so that the test takes
// seconds), stopping NATS fires the outage alert, while the pusher serves
// a grpc-go client that connects meanwhile its last config; NATS back, the
// alert resolves.
func TestStaleAlertFiresWhileNATSIsStopped(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "helm", "shardpilot", "files", "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	const shipped = "(shardpilot_pusher_stale_seconds) > 30\n    for: 1m"
	if !strings.Contains(string(b), shipped) {
		t.Fatalf("alerts.yaml no longer holds %q: update the test", shipped)
	}
	rules := filepath.Join(t.TempDir(), "alerts.yaml")
	if err := os.WriteFile(rules, []byte(strings.Replace(string(b), shipped, "(shardpilot_pusher_stale_seconds) > 2\n    for: 5s", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	target := "xds:///greeter.demo.svc.cluster.local:50051"
	allOn(t, dialXDS(t, cp.ads, target), a.addr, "calls reach the greeter")
	metrics := httptest.NewServer(promhttp.HandlerFor(cp.reg, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)
	prom := startPrometheus(t, strings.TrimPrefix(metrics.URL, "http://"), rules)
	testutil.Eventually(t, 60*time.Second, "Prometheus to scrape the pusher, no alert about it firing", func() (bool, string) {
		alerts, err := firing(prom)
		return err == nil && !strings.Contains(fmt.Sprint(alerts), "ShardpilotPusherStale"), fmt.Sprint(alerts, err)
	})

	cp.stopNATS()
	stopped := time.Now()
	testutil.Eventually(t, 90*time.Second, "ShardpilotPusherStale fires", func() (bool, string) {
		alerts, err := firing(prom)
		return strings.Contains(fmt.Sprint(alerts), "ShardpilotPusherStale"), fmt.Sprint(alerts, err)
	})
	t.Logf("ShardpilotPusherStale fired %s after NATS stopped (threshold 2 s, for 5 s)", time.Since(stopped).Round(time.Second))
	allOn(t, dialXDS(t, cp.ads, target), a.addr, "a client connecting while NATS is stopped is served the last config")

	cp.startNATS(t)
	testutil.Eventually(t, 90*time.Second, "the alert resolves once NATS is back", func() (bool, string) {
		alerts, err := firing(prom)
		return err == nil && !strings.Contains(fmt.Sprint(alerts), "ShardpilotPusherStale"), fmt.Sprint(alerts, err)
	})
}
