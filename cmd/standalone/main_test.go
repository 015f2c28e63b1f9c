package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// syncBuffer is a log sink the test can read while the process writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs the standalone mode on examples/mesh with c's other
// settings, logging into logs, until the test ends; it returns the admin
// address.
func startServe(t *testing.T, c config, logs *syncBuffer) string {
	t.Helper()
	log, err := telemetry.NewLogger(logs, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	c.meshDir, c.adsAddr, c.quiet, c.maxDelay, c.domainSuffix = "../../examples/mesh", "127.0.0.1:0", 100*time.Millisecond, time.Second, "cluster.local"
	c.AdminAddr = testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, c, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return c.AdminAddr
}

// TestServeExampleMesh runs the standalone mode on examples/mesh, as
// `make run` does: it says where ADS and the admin port listen, and /readyz
// turns 200 once the example mesh is loaded.
func TestServeExampleMesh(t *testing.T) {
	var logs syncBuffer
	admin := startServe(t, config{}, &logs)

	var body string
	testutil.Eventually(t, 30*time.Second, "/readyz answers 200", func() (bool, string) {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, b)
	})
	for _, want := range []string{`msg="ADS listening" addr=127.0.0.1:`, `msg="admin listening" addr=` + admin} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %s:\n%s", want, logs.String())
		}
	}
	if code := func() int {
		r, err := http.Get("http://" + admin + "/debug/syncz")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.StatusCode
	}(); code != http.StatusOK {
		t.Errorf("/debug/syncz answered %d", code)
	}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(metrics), `shardpilot_ingest_objects{kind="services",source="yaml"} 2`) {
		t.Errorf("metrics do not count the example's two services; /readyz said %q", body)
	}
}

func TestFlags(t *testing.T) {
	tests := map[string]struct {
		args    []string
		env     map[string]string
		wantErr string
	}{
		"help":                   {args: []string{"--help"}, wantErr: flag.ErrHelp.Error()},
		"mesh dir missing":       {args: []string{"--mesh-dir", "/does/not/exist"}, wantErr: `--mesh-dir "/does/not/exist" is not a directory`},
		"bad duration from env":  {env: map[string]string{"SHARDPILOT_DEBOUNCE_QUIET": "soon"}, wantErr: "$SHARDPILOT_DEBOUNCE_QUIET (twin of --debounce-quiet)"},
		"bad log level":          {args: []string{"--log-level", "loud"}, wantErr: `log level "loud"`},
		"stray argument":         {args: []string{"extra"}, wantErr: "unexpected arguments: extra"},
		"env twin of a bad path": {env: map[string]string{"SHARDPILOT_MESH_DIR": "/nope"}, wantErr: `--mesh-dir "/nope"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			err := run(context.Background(), tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to say %q", err, tc.wantErr)
			}
			if tc.wantErr == flag.ErrHelp.Error() && !errors.Is(err, flag.ErrHelp) {
				t.Fatal("want flag.ErrHelp")
			}
		})
	}
}

// TestServeSecured: with --secure the embedded etcd takes client
// certificates only and the embedded NATS TLS and a password only; the
// standalone itself serves the example mesh through them, and a client
// without them is refused by each.
func TestServeSecured(t *testing.T) {
	var logs syncBuffer
	c := config{dataDir: t.TempDir(), secure: true}
	admin := startServe(t, c, &logs)
	testutil.Eventually(t, 30*time.Second, "/readyz answers 200 over the secured servers", func() (bool, string) {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, fmt.Sprintf("%d %s", resp.StatusCode, b)
	})
	m := regexp.MustCompile(`etcd=(https://\S+) nats=(tls://\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("the log names no https etcd and nats endpoints:\n%s", logs.String())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m[1]}, DialTimeout: 2 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{InsecureSkipVerify: true}})
	if err == nil {
		gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = cli.Get(gctx, "/mesh/v1/", clientv3.WithCountOnly())
		gcancel()
		cli.Close()
	}
	if err == nil {
		t.Error("the embedded etcd answered a client without a certificate")
	}
	if nc, err := nats.Connect(m[2], nats.Secure(&tls.Config{InsecureSkipVerify: true})); err == nil {
		nc.Close()
		t.Error("the embedded NATS took a client without a password")
	}
}
