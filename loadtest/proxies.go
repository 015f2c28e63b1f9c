package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/baseline"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
)

// runProxies runs simulated proxies against running control planes until
// interrupted, printing progress, then their figures as JSON.
func runProxies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg sim.Config
	var addrs, shard, level string
	var duration time.Duration
	fs := flag.NewFlagSet("proxies", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&addrs, "addrs", "127.0.0.1:15010", "comma-separated ADS addresses")
	fs.IntVar(&cfg.Proxies, "proxies", 1000, "simulated Envoys across all shards")
	fs.StringVar(&shard, "shard", "0/1", "this process's shard, i/n: it runs the proxies whose index modulo n is i")
	fs.Float64Var(&cfg.Delta, "delta", 0.5, "share of proxies that speak Delta xDS")
	fs.IntVar(&cfg.PerConn, "per-conn", 1, "proxies sharing one gRPC connection (1: one connection per proxy, as real Envoys)")
	fs.Float64Var(&cfg.NACKRate, "nack-rate", 0, "share of responses the proxies reject")
	fs.IntVar(&cfg.Namespaces, "namespaces", 10, "namespaces the proxies spread over")
	fs.DurationVar(&duration, "duration", 0, "stop after this long (0: on interrupt)")
	fs.StringVar(&level, "log-level", "warn", "log level")
	if err := parse(fs, "Run simulated Envoys against running control planes.", args); err != nil {
		return err
	}
	i, n, ok := strings.Cut(shard, "/")
	var err1, err2 error
	cfg.Shard, err1 = strconv.Atoi(i)
	cfg.Shards, err2 = strconv.Atoi(n)
	if !ok || err1 != nil || err2 != nil {
		return fmt.Errorf("--shard %q: want i/n", shard)
	}
	cfg.Addrs = strings.Split(addrs, ",")
	log, err := telemetry.NewLogger(stderr, level, "text")
	if err != nil {
		return err
	}
	cfg.Log = log
	fleet, err := sim.New(cfg)
	if err != nil {
		return err
	}
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	done := make(chan error, 1)
	go func() { done <- fleet.Run(ctx) }()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for loop := true; loop; {
		select {
		case err := <-done:
			done <- err
			loop = false
		case <-t.C:
			st := fleet.Stats()
			fmt.Fprintf(stderr, "\r%d/%d proxies hold a full config; %d NACKs, %d stream errors   ", fleet.Full(), fleet.Size(), st.NACKs, st.Errors)
		}
	}
	if err := <-done; err != nil {
		return err
	}
	fmt.Fprintln(stderr)
	st := fleet.Stats()
	var first []time.Duration
	for _, d := range st.FirstFull {
		if d > 0 {
			first = append(first, d)
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(map[string]any{"proxies": st.Proxies, "delta": st.Delta, "first_config": report.Summarise(first), "nacks": st.NACKs, "stream_errors": st.Errors})
}

// runBaseline serves the baseline control plane until interrupted.
func runBaseline(ctx context.Context, args []string, stderr io.Writer) error {
	var dir, addr, adminAddr, level string
	fs := flag.NewFlagSet("baseline", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&dir, "mesh-dir", "", "directory of Istio YAML to serve")
	fs.StringVar(&addr, "ads-addr", "127.0.0.1:15010", "address to serve ADS on")
	fs.StringVar(&adminAddr, "admin-addr", "", "address to serve Go's profiles on (/debug/pprof/), empty for none")
	fs.StringVar(&level, "log-level", "warn", "log level")
	if err := parse(fs, "Serve a mesh with go-control-plane's snapshot cache, one snapshot per node.", args); err != nil {
		return err
	}
	log, err := telemetry.NewLogger(stderr, level, "text")
	if err != nil {
		return err
	}
	srv, err := baseline.New(baseline.Config{Dir: dir, Log: log})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--ads-addr %s: %w", addr, err)
	}
	if adminAddr != "" {
		admin, err := net.Listen("tcp", adminAddr)
		if err != nil {
			lis.Close()
			return fmt.Errorf("--admin-addr %s: %w", adminAddr, err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		hs := &http.Server{Handler: mux}
		go func() { _ = hs.Serve(admin) }()
		defer hs.Close()
	}
	return srv.Run(ctx, lis)
}
