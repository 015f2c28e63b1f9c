package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSeparateProcesses runs the ingester binary and a pusher as separate
// parts against etcd and NATS servers of their own, as in production: the
// pusher serves the example mesh that only the ingester read.
func TestSeparateProcesses(t *testing.T) {
	etcd, _ := testutil.Etcd(t)
	nats, _ := testutil.NATS(t)
	bin := filepath.Join(t.TempDir(), "ingester")
	build := exec.Command("go", "build", "-o", bin, "../ingester")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the ingester: %v\n%s", err, out)
	}
	ingesterAdmin := testutil.FreeAddr(t)
	ingester := exec.Command(bin, "--mesh-dir", "../../examples/mesh")
	ingester.Env = append(os.Environ(),
		"SHARDPILOT_ETCD_ENDPOINTS="+etcd.Endpoint,
		"SHARDPILOT_NATS_URL="+nats.URL,
		"SHARDPILOT_ADMIN_ADDR="+ingesterAdmin)
	if testing.Verbose() {
		ingester.Stderr = os.Stderr
	} else {
		ingester.Stderr = io.Discard
	}
	if err := ingester.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = ingester.Process.Signal(os.Interrupt)
		_ = ingester.Wait()
	}()

	admin := testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--etcd-endpoints", etcd.Endpoint, "--nats-url", nats.URL,
			"--ads-plaintext", "--ads-addr", "127.0.0.1:0", "--admin-addr", admin, "--log-level", "warn"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pusher: %v", err)
		}
	}()

	testutil.Eventually(t, 30*time.Second, "the ingester is ready", func() (bool, string) {
		code, body := get("http://" + ingesterAdmin + "/readyz")
		return code == http.StatusOK, fmt.Sprint(code, body)
	})
	testutil.Eventually(t, 30*time.Second, "the pusher serves the example mesh", func() (bool, string) {
		_, body := get("http://" + admin + "/metrics")
		// The example has the reviews service with two subsets and the
		// greeter: 3 + 1 load assignments.
		want := `shardpilot_pusher_resources{type="ClusterLoadAssignment"} 4`
		return strings.Contains(body, want), want + " not in /metrics"
	})
	if code, body := get("http://" + admin + "/"); code != http.StatusOK || !strings.Contains(body, "shardpilot pusher") || !strings.Contains(body, `<svg id="convergence"`) {
		t.Errorf("status page: %d %.200s", code, body)
	}
	if code, body := get("http://" + ingesterAdmin + "/"); code != http.StatusOK || !strings.Contains(body, "shardpilot ingester") || !strings.Contains(body, "Rejected objects") {
		t.Errorf("ingester's status page: %d %.200s", code, body)
	}

	// NATS goes: the pusher serves its last config and stays in its
	// Service (ready); it says it is stale.
	nats.Close()
	testutil.Eventually(t, 60*time.Second, "the pusher to say it is stale", func() (bool, string) {
		_, body := get("http://" + admin + "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, "shardpilot_pusher_stale_seconds "); ok {
				return v != "0", line
			}
		}
		return false, "no shardpilot_pusher_stale_seconds"
	})
	if code, body := get("http://" + admin + "/readyz"); code != http.StatusOK {
		t.Errorf("the pusher without NATS: /readyz %d %s, want it ready, serving its last config", code, body)
	}
	if _, body := get("http://" + admin + "/"); !strings.Contains(body, "stale: not following the store") {
		t.Errorf("the status page does not say the pusher is stale: %.300s", body)
	}
}

// TestADSNeedsTLSOrConsent: ADS is TLS unless plaintext is asked for, and
// the flags that contradict each other are refused before anything starts.
func TestADSNeedsTLSOrConsent(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"+
		"contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {token: t}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := []string{"--ads-cert-file", "c.pem", "--ads-key-file", "k.pem", "--ads-client-ca-file", "ca.pem", "--ca-seal-key-file", "seal", "--ads-tokens", "--kubeconfig", kubeconfig}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give --ads-cert-file and --ads-key-file"},
		{[]string{"--ads-cert-file", "c.pem"}, "give --ads-cert-file and --ads-key-file"},
		{[]string{"--ads-plaintext", "--ads-client-ca-file", "ca.pem"}, "alternatives"},
		{[]string{"--ads-cert-file", "/nonexistent.pem", "--ads-key-file", "/nonexistent-key.pem"}, "--ads-cert-file"},
		{[]string{"--ads-plaintext", "--kubeconfig", "in-cluster"}, "--kubeconfig: gateway credentials are served to authenticated proxies only"},
		{[]string{"--ads-plaintext", "--outbound-traffic-policy", "DENY"}, `--outbound-traffic-policy "DENY"`},
		{[]string{"--ads-plaintext", "--ads-tokens"}, "--ads-tokens: tokens are reviewed by the API server of --kubeconfig"},
		{[]string{"--ads-cert-file", "c.pem", "--ads-key-file", "k.pem", "--ads-client-ca-file", "ca.pem"}, "which need a CA: give --ca-cert-file and --ca-key-file"},
		{[]string{"--ads-cert-file", "c.pem", "--ads-key-file", "k.pem", "--ads-client-ca-file", "ca.pem", "--ca-cert-file", "r.pem", "--ca-key-file", "r-key.pem", "--ca-seal-key-file", "seal"}, "--ca-cert-file and --ca-seal-key-file are alternatives"},
		{[]string{"--ads-plaintext", "--ca-seal-key-file", "seal"}, "workload certificates are served to authenticated proxies only"},
		{[]string{"--ads-plaintext", "--token-review-clusters", "east=" + kubeconfig}, "--token-review-clusters: give --ads-tokens too"},
		{append([]string{"--token-review-clusters", "east"}, tokens...), `"east": want <cluster ID>=<kubeconfig path>`},
		{append([]string{"--token-review-clusters", "Kubernetes=" + kubeconfig}, tokens...), `cluster "Kubernetes" is given twice`},
		{append([]string{"--token-review-clusters", "east=/nonexistent"}, tokens...), "--token-review-clusters: cluster east"},
		{append([]string{"--cluster-id", ""}, tokens...), "--cluster-id: want the ID"},
	} {
		err := run(context.Background(), append(c.args, "--etcd-endpoints", "http://127.0.0.1:1", "--log-level", "error"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("pusher %q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}
