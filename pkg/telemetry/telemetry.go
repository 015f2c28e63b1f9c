package telemetry

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewLogger returns a structured logger writing to w at level ("debug",
// "info", "warn", "error") in format ("text" or "json").
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	lv := new(slog.LevelVar)
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("telemetry: log level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(leveled{slog.NewTextHandler(w, opts), lv}), nil
	case "json":
		return slog.New(leveled{slog.NewJSONHandler(w, opts), lv}), nil
	}
	return nil, fmt.Errorf("telemetry: log format %q: want text or json", format)
}

// leveled is a handler whose level can change while the process runs
// (LevelOf), whatever attributes or groups its loggers add.
type leveled struct {
	slog.Handler
	level *slog.LevelVar
}

func (h leveled) WithAttrs(attrs []slog.Attr) slog.Handler {
	return leveled{h.Handler.WithAttrs(attrs), h.level}
}

func (h leveled) WithGroup(name string) slog.Handler {
	return leveled{h.Handler.WithGroup(name), h.level}
}

// LevelOf returns the level of a logger NewLogger made, which changes the
// level of every logger derived from it; nil for another logger.
func LevelOf(log *slog.Logger) *slog.LevelVar {
	if log == nil {
		return nil
	}
	if h, ok := log.Handler().(leveled); ok {
		return h.level
	}
	return nil
}

// logLevel serves the level of the process's logs at /debug/loglevel: GET
// says it, PUT or POST with ?level=debug|info|warn|error changes it until
// the process ends (its flag, --log-level, gives it at the next start).
func logLevel(lv *slog.LevelVar, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet:
		case http.MethodPut, http.MethodPost:
			var next slog.Level
			if err := next.UnmarshalText([]byte(r.URL.Query().Get("level"))); err != nil {
				http.Error(w, fmt.Sprintf("loglevel: ?level=%q: want debug, info, warn or error", r.URL.Query().Get("level")), http.StatusBadRequest)
				return
			}
			if was := lv.Level(); was != next {
				lv.Set(next)
				log.Warn("log level changed at run time", "from", was.String(), "to", next.String(), "by", r.RemoteAddr)
			}
		default:
			w.Header().Set("Allow", "GET, PUT, POST")
			http.Error(w, "loglevel: GET, PUT or POST", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, "{\"level\":%q}\n", strings.ToLower(lv.Level().String()))
	})
}

// NewRegistry returns a Prometheus registry with the Go and process
// collectors, and those given (the build's information, which the
// commands know).
func NewRegistry(more ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(more...)
	return reg
}

// Readiness tracks named conditions that must all hold before a process is
// ready to serve.
type Readiness struct {
	mu     sync.Mutex
	checks map[string]func() bool
	// detail, when set, adds a line to /readyz (what the process leads).
	detail func() string
}

// Detail adds what detail returns to every /readyz answer.
func (r *Readiness) Detail(detail func() string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.detail = detail
}

// details returns the added line, if any.
func (r *Readiness) details() string {
	r.mu.Lock()
	detail := r.detail
	r.mu.Unlock()
	if detail == nil {
		return ""
	}
	if line := detail(); line != "" {
		return line + "\n"
	}
	return ""
}

// NewReadiness returns a Readiness waiting on the named conditions.
func NewReadiness(names ...string) *Readiness {
	r := &Readiness{checks: map[string]func() bool{}}
	for _, n := range names {
		r.Set(n, false)
	}
	return r
}

// Set records whether the named condition holds.
func (r *Readiness) Set(name string, ok bool) {
	r.Check(name, func() bool { return ok })
}

// Check makes the named condition hold whenever check returns true; check
// is called on every Ready and must be cheap and safe for concurrent use.
func (r *Readiness) Check(name string, check func() bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checks[name] = check
}

// Ready reports whether every condition holds, and the ones that do not.
func (r *Readiness) Ready() (bool, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var waiting []string
	for n, check := range r.checks {
		if !check() {
			waiting = append(waiting, n)
		}
	}
	slices.Sort(waiting)
	return len(waiting) == 0, waiting
}

// Admin serves the operational HTTP endpoints.
type Admin struct {
	// Listener is where to serve; the caller creates it so it can print the
	// bound address.
	Listener net.Listener
	Gatherer prometheus.Gatherer
	Ready    *Readiness
	// Debug adds handlers under their paths, for example "/debug/syncz".
	Debug map[string]http.Handler
	// DebugToken, when set, gives the token that opens /debug/ to requests
	// from other hosts that carry it as a bearer token; /debug/ always
	// answers loopback (127.0.0.1 and ::1 alone). The rest (health,
	// readiness, metrics) answers anyone.
	DebugToken TokenSource
	// TokenOnLoopback asks loopback callers for the token too: in a pod,
	// kubectl port-forward arrives from loopback, so there loopback is
	// anyone allowed to forward a port to the pod.
	TokenOnLoopback bool
	// Page, when set, is the status page at "/", guarded as /debug/ is.
	Page http.Handler
	Log  *slog.Logger
	// TLSListener and TLS, when set, serve the same endpoints over TLS
	// too; the token is then honoured there alone, never in the clear.
	TLSListener net.Listener
	TLS         *tls.Config
}

// Handler returns the admin HTTP handler.
func (a *Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, waiting := a.Ready.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = fmt.Fprintf(w, "not ready: waiting for %s\n%s", strings.Join(waiting, ", "), a.Ready.details())
			return
		}
		_, _ = io.WriteString(w, "ok\n"+a.Ready.details())
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.Gatherer, promhttp.HandlerOpts{}))
	// Go's profiles, for a look at a busy process (the load test reads the
	// heap after a collection from /debug/pprof/heap?gc=1&debug=1).
	debug := http.NewServeMux()
	debug.HandleFunc("/debug/pprof/", pprof.Index)
	debug.HandleFunc("/debug/pprof/profile", pprof.Profile)
	debug.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if lv := LevelOf(a.Log); lv != nil {
		debug.Handle("/debug/loglevel", logLevel(lv, a.Log))
	}
	for path, h := range a.Debug {
		debug.Handle(path, h)
	}
	mux.Handle("/debug/", a.guard(debug))
	if a.Page != nil {
		mux.Handle("/{$}", a.guard(a.Page))
	}
	return mux
}

// guard lets through requests from loopback, and from elsewhere those that
// carry the debug token (for /debug/ and the status page).
func (a *Admin) guard(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil && loopback(host) && !a.TokenOnLoopback {
			h.ServeHTTP(w, r)
			return
		}
		// With a TLS port, a token sent in the clear is not taken: whoever
		// sent it has just shown it to the network.
		// A loopback caller's token is not on the network even in the
		// clear (a port-forward's travels inside the API server's TLS).
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if a.DebugToken != nil && (r.TLS != nil || a.TLSListener == nil || loopback(host)) {
			want := a.DebugToken.Token()
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if ok && want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1 {
				h.ServeHTTP(w, r)
				return
			}
		}
		w.Header().Set("WWW-Authenticate", "Bearer")
		if a.TokenOnLoopback {
			http.Error(w, "the status page and /debug/ answer a bearer token alone (--admin-token-file; the chart's Secret <release>-admin-token)", http.StatusUnauthorized)
			return
		}
		http.Error(w, "the status page and /debug/ answer loopback, or a bearer token (--admin-token-file)", http.StatusUnauthorized)
	})
}

// loopback reports whether a peer address is this host's own: 127.0.0.1
// or ::1 alone. The rest of 127.0.0.0/8 is not: 127.0.0.6 is the source
// address of Istio's inbound redirection, so in a pod whose traffic a
// sidecar captures, a request from anywhere in the mesh arrives from it.
func loopback(host string) bool { return host == "127.0.0.1" || host == "::1" }

// Run serves until ctx is done, then shuts the servers down gracefully.
func (a *Admin) Run(ctx context.Context) error {
	h := a.Handler()
	srvs := []*http.Server{{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	lis := []net.Listener{a.Listener}
	if a.TLSListener != nil {
		if a.TLS == nil {
			return errors.New("telemetry: an admin TLS listener without a TLS configuration")
		}
		log := a.Log
		if log == nil {
			log = slog.New(slog.DiscardHandler)
		}
		srvs = append(srvs, &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, TLSConfig: a.TLS,
			// Failed handshakes (a client without the CA) are the client's news.
			ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)})
		lis = append(lis, tls.NewListener(a.TLSListener, a.TLS))
	}
	errc := make(chan error, len(srvs))
	for i, srv := range srvs {
		go func() { errc <- srv.Serve(lis[i]) }()
	}
	var err error
	received := 0
	select {
	case serr := <-errc:
		received++
		err = fmt.Errorf("telemetry: admin server: %w", serr)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	for _, srv := range srvs {
		if serr := srv.Shutdown(sctx); serr != nil && err == nil {
			err = fmt.Errorf("telemetry: admin shutdown: %w", serr)
		}
	}
	// Every server's Serve has returned before Run does.
	for ; received < len(srvs); received++ {
		if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
			err = fmt.Errorf("telemetry: admin server: %w", serr)
		}
	}
	return err
}
