package telemetry

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestAdminEndpoints(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ready := NewReadiness("store")
	var loaded atomic.Bool
	ready.Check("mesh", loaded.Load)
	a := &Admin{Listener: lis, Gatherer: NewRegistry(), Ready: ready}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + lis.Addr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "mesh, store") {
		t.Errorf("/readyz %d %q, want 503 naming both conditions", code, body)
	}
	ready.Set("store", true)
	loaded.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz %d once ready", code)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics %d", code)
	}
}

func TestNewLoggerRejectsBadSettings(t *testing.T) {
	if _, err := NewLogger(io.Discard, "loud", "text"); err == nil {
		t.Error("bad level accepted")
	}
	if _, err := NewLogger(io.Discard, "info", "xml"); err == nil {
		t.Error("bad format accepted")
	}
}

// TestDebugIsGuarded: /debug/ and the status page answer loopback, and
// other hosts only with the bearer token; health, readiness and metrics
// answer anyone.
func TestDebugIsGuarded(t *testing.T) {
	a := &Admin{Gatherer: prometheus.NewRegistry(), Ready: NewReadiness(), DebugToken: "0123456789abcdef-token",
		Debug: map[string]http.Handler{"/debug/syncz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "streams") })},
		Page:  http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "status") })}
	h := a.Handler()
	for _, c := range []struct {
		path, from, token string
		want              int
	}{
		{"/debug/syncz", "127.0.0.1:5000", "", http.StatusOK},
		{"/debug/syncz", "[::1]:5000", "", http.StatusOK},
		{"/debug/syncz", "10.1.2.3:5000", "", http.StatusUnauthorized},
		{"/debug/syncz", "10.1.2.3:5000", "wrong-token-0123456789", http.StatusUnauthorized},
		{"/debug/syncz", "10.1.2.3:5000", "0123456789abcdef-token", http.StatusOK},
		{"/debug/pprof/", "10.1.2.3:5000", "", http.StatusUnauthorized},
		{"/", "127.0.0.1:5000", "", http.StatusOK},
		{"/", "10.1.2.3:5000", "", http.StatusUnauthorized},
		{"/", "10.1.2.3:5000", "0123456789abcdef-token", http.StatusOK},
		{"/nothing", "127.0.0.1:5000", "", http.StatusNotFound},
		{"/metrics", "10.1.2.3:5000", "", http.StatusOK},
		{"/healthz", "10.1.2.3:5000", "", http.StatusOK},
	} {
		r := httptest.NewRequest(http.MethodGet, c.path, nil)
		r.RemoteAddr = c.from
		if c.token != "" {
			r.Header.Set("Authorization", "Bearer "+c.token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s from %s (token %q): %d, want %d", c.path, c.from, c.token, w.Code, c.want)
		}
	}
}
