package telemetry

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"

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
	ready.Detail(func() string { return "leads: relay" })
	if code, body := get("/readyz"); code != 200 || body != "ok\nleads: relay\n" {
		t.Errorf("/readyz %d %q, want ok and what it leads", code, body)
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
	a := &Admin{Gatherer: prometheus.NewRegistry(), Ready: NewReadiness(), DebugToken: StaticToken(goodToken),
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
		{"/debug/syncz", "10.1.2.3:5000", goodToken, http.StatusOK},
		// Only this host's own addresses are loopback: 127.0.0.6 is where
		// Istio's inbound redirection comes from.
		{"/debug/syncz", "127.0.0.6:5000", "", http.StatusUnauthorized},
		{"/debug/syncz", "[::ffff:127.0.0.1]:5000", "", http.StatusUnauthorized},
		{"/debug/syncz", "127.1.2.3:5000", "", http.StatusUnauthorized},
		{"/debug/pprof/", "10.1.2.3:5000", "", http.StatusUnauthorized},
		{"/", "127.0.0.1:5000", "", http.StatusOK},
		{"/", "10.1.2.3:5000", "", http.StatusUnauthorized},
		{"/", "10.1.2.3:5000", goodToken, http.StatusOK},
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

// TestTokenOnLoopback: with TokenOnLoopback (the chart's pods, where
// kubectl port-forward arrives from loopback), loopback callers need the
// token as any other; a loopback caller's token is taken in the clear even
// beside a TLS port (a port-forward carries it inside the API server's TLS).
func TestTokenOnLoopback(t *testing.T) {
	tlsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tlsLis.Close()
	for _, withTLS := range []bool{false, true} {
		a := &Admin{Gatherer: prometheus.NewRegistry(), Ready: NewReadiness(), DebugToken: StaticToken(goodToken), TokenOnLoopback: true,
			Debug: map[string]http.Handler{"/debug/syncz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "streams") })}}
		if withTLS {
			a.TLSListener = tlsLis
		}
		h := a.Handler()
		for _, c := range []struct {
			from, token string
			want        int
		}{
			{"127.0.0.1:5000", "", http.StatusUnauthorized},
			{"[::1]:5000", "", http.StatusUnauthorized},
			{"127.0.0.1:5000", "wrong-token-0123456789", http.StatusUnauthorized},
			{"127.0.0.1:5000", goodToken, http.StatusOK},
			{"10.1.2.3:5000", "", http.StatusUnauthorized},
		} {
			r := httptest.NewRequest(http.MethodGet, "/debug/syncz", nil)
			r.RemoteAddr = c.from
			if c.token != "" {
				r.Header.Set("Authorization", "Bearer "+c.token)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.want {
				t.Errorf("TLS port %v: from %s (token %q): %d, want %d", withTLS, c.from, c.token, w.Code, c.want)
			}
		}
	}
}

const goodToken = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

// TestCheckToken: short and repetitive tokens are refused.
func TestCheckToken(t *testing.T) {
	for tok, ok := range map[string]bool{
		goodToken:                              true,
		"Qm9vdHN0cmFwIHRva2VuIGZvciB0ZXN0cw==": true,
		"aaaaaaaaaaaaaaaa":                     false,
		strings.Repeat("a", 64):                false,
		strings.Repeat("ab", 32):               false,
		"0123456789abcdef-token":               false,
	} {
		if err := CheckToken(tok); (err == nil) != ok {
			t.Errorf("CheckToken(%q) = %v, want ok=%v", tok, err, ok)
		}
	}
}

// TestTokenFileReloads: a changed file's token replaces the last one; a
// weak or missing one keeps it.
func TestTokenFileReloads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	write := func(tok string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("weak")
	if _, err := NewTokenFile(path, nil); err == nil {
		t.Fatal("a weak first token was taken")
	}
	write(goodToken)
	f, err := NewTokenFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	next := strings.ToUpper(goodToken[:40]) + goodToken[40:]
	write(next)
	// The file is looked at again once TokenRecheck has passed.
	f.checked = time.Time{}
	if got := f.Token(); got != next {
		t.Errorf("after a change: %q, want %q", got, next)
	}
	write(strings.Repeat("a", 40))
	f.checked = time.Time{}
	if got := f.Token(); got != next {
		t.Errorf("after a weak change: %q, want the last good %q", got, next)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	f.checked = time.Time{}
	if got := f.Token(); got != next {
		t.Errorf("after removal: %q, want the last good %q", got, next)
	}
}

// TestTokenOverTLSOnly: with a TLS port, a token sent in the clear opens
// nothing; over TLS it does.
func TestTokenOverTLSOnly(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	a := &Admin{Gatherer: prometheus.NewRegistry(), Ready: NewReadiness(), DebugToken: StaticToken(goodToken), TLSListener: lis,
		Debug: map[string]http.Handler{"/debug/syncz": http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "streams") })}}
	h := a.Handler()
	for _, overTLS := range []bool{false, true} {
		r := httptest.NewRequest(http.MethodGet, "/debug/syncz", nil)
		r.RemoteAddr = "10.1.2.3:5000"
		r.Header.Set("Authorization", "Bearer "+goodToken)
		if !overTLS {
			r.TLS = nil
		} else {
			r.TLS = &tls.ConnectionState{HandshakeComplete: true}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if want := map[bool]int{false: http.StatusUnauthorized, true: http.StatusOK}[overTLS]; w.Code != want {
			t.Errorf("token over TLS %v: %d, want %d", overTLS, w.Code, want)
		}
	}
}

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

// TestLogLevelAtRunTime: /debug/loglevel says the level of the process's
// logs and changes it for every logger derived from it; a level that is
// none is refused with the reason.
func TestLogLevelAtRunTime(t *testing.T) {
	var out strings.Builder
	log, err := NewLogger(&out, "info", "text")
	if err != nil {
		t.Fatal(err)
	}
	part := log.With("part", "pusher")
	h := (&Admin{Gatherer: NewRegistry(), Ready: NewReadiness(), Log: log}).Handler()
	ask := func(method, query string) (int, string) {
		r := httptest.NewRequest(method, "/debug/loglevel"+query, nil)
		r.RemoteAddr = "127.0.0.1:5000"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, strings.TrimSpace(w.Body.String())
	}
	if code, body := ask(http.MethodGet, ""); code != 200 || body != `{"level":"info"}` {
		t.Errorf("GET: %d %s, want info", code, body)
	}
	part.Debug("before")
	if code, body := ask(http.MethodPut, "?level=debug"); code != 200 || body != `{"level":"debug"}` {
		t.Errorf("PUT debug: %d %s", code, body)
	}
	part.Debug("after")
	if code, body := ask(http.MethodPut, "?level=loud"); code != 400 || !strings.Contains(body, "want debug, info, warn or error") {
		t.Errorf("PUT loud: %d %s, want it refused", code, body)
	}
	logged := out.String()
	if strings.Contains(logged, "before") || !strings.Contains(logged, "after") || !strings.Contains(logged, "log level changed") {
		t.Errorf("logged:\n%s\nwant the debug line after the change alone, and the change", logged)
	}
	if LevelOf(slog.New(slog.DiscardHandler)) != nil {
		t.Error("a logger NewLogger did not make has a level to change")
	}
}
