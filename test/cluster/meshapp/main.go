// Command meshapp is the workload of the cluster test (make e2e-cluster):
// a proxyless grpc-go server, and a grpc-go client that resolves its target
// through the pushers' ADS (grpc-go's xDS resolver, the real proxy) and
// counts every RPC it makes.
//
//	meshapp server -addr :8080 -drain 5s
//	GRPC_XDS_BOOTSTRAP_CONFIG='{...}' meshapp client \
//	  -target xds:///echo.mesh.svc.cluster.local:8080 -rate 20 -stats :9090
//
// The server answers grpc.health.v1.Health/Check; on SIGTERM it says
// NOT_SERVING, keeps answering for -drain (while the change reaches the
// clients), then stops. The client reads grpc-go's xDS bootstrap as any
// proxyless application does (GRPC_XDS_BOOTSTRAP or
// GRPC_XDS_BOOTSTRAP_CONFIG: the pod's manifest writes it); GET /stats on
// -stats says how many RPCs succeeded, on which backend, and which failed
// and why.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and balancers
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: meshapp server|client [flags]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var err error
	switch os.Args[1] {
	case "server":
		err = server(ctx, os.Args[2:])
	case "client":
		err = client(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q: server or client", os.Args[1])
	}
	if err != nil {
		slog.Error("meshapp", "err", err)
		os.Exit(1)
	}
}

func server(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	addr := fs.String("addr", ":8080", "where to serve gRPC")
	drain := fs.Duration("drain", 5*time.Second, "how long to keep answering after SIGTERM")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	hs := health.NewServer()
	s := grpc.NewServer()
	healthpb.RegisterHealthServer(s, hs)
	go func() {
		<-ctx.Done()
		slog.Info("draining", "for", *drain)
		hs.Shutdown()
		time.Sleep(*drain)
		s.GracefulStop()
	}()
	slog.Info("serving", "addr", lis.Addr().String())
	return s.Serve(lis)
}

// stats is what the client has seen since it started.
type stats struct {
	mu sync.Mutex
	// OK counts the RPCs answered, by the backend address that answered.
	OK map[string]int64 `json:"ok"`
	// Failed counts the RPCs that failed after the first success; Startup
	// those before it (while the first configuration arrived).
	Failed  int64 `json:"failed"`
	Startup int64 `json:"startup"`
	// Errors are the last failures after the first success.
	Errors []string `json:"errors"`
	// StartupError is the last failure before the first success.
	StartupError string `json:"startupError,omitempty"`
	Since        string `json:"since"`
	ready        bool
}

func (s *stats) record(backend string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err == nil:
		s.OK[backend]++
		s.ready = true
	case !s.ready:
		s.Startup++
		s.StartupError = err.Error()
	default:
		s.Failed++
		s.Errors = append(s.Errors, time.Now().UTC().Format(time.RFC3339Nano)+" "+err.Error())
		if len(s.Errors) > 50 {
			s.Errors = s.Errors[len(s.Errors)-50:]
		}
	}
}

func client(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("client", flag.ContinueOnError)
	target := fs.String("target", "", "the xds:/// target to call")
	rate := fs.Float64("rate", 20, "RPCs per second")
	statsAddr := fs.String("stats", ":9090", "where to serve /stats and /ready")
	timeout := fs.Duration("timeout", 2*time.Second, "each RPC's deadline")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *target == "" || *rate <= 0 {
		return errors.New("client needs -target and a positive -rate")
	}
	if os.Getenv("GRPC_XDS_BOOTSTRAP") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" {
		return errors.New("client needs grpc-go's xDS bootstrap: GRPC_XDS_BOOTSTRAP (a file) or GRPC_XDS_BOOTSTRAP_CONFIG (its JSON)")
	}
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	st := &stats{OK: map[string]int64{}, Since: time.Now().UTC().Format(time.RFC3339)}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		st.mu.Lock()
		defer st.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("/ready", func(w http.ResponseWriter, _ *http.Request) {
		st.mu.Lock()
		ready := st.ready
		st.mu.Unlock()
		if !ready {
			http.Error(w, "no RPC answered yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	hsrv := &http.Server{Addr: *statsAddr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := hsrv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("stats server", "err", err)
		}
	}()
	defer hsrv.Close()
	hc := healthpb.NewHealthClient(conn)
	tick := time.NewTicker(time.Duration(float64(time.Second) / *rate))
	defer tick.Stop()
	slog.Info("calling", "target", *target, "rate", *rate)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, *timeout)
		var p peer.Peer
		_, err := hc.Check(rctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		backend := ""
		if p.Addr != nil {
			backend = p.Addr.String()
		}
		st.record(backend, err)
	}
}
