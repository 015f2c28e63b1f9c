package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
)

// runStore runs etcd and NATS (JetStream) in a process of their own, as
// they would run beside a real control plane, so that the simulated
// proxies' CPU does not slow the store down, and writes their addresses
// to a file once both serve.
func runStore(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("store", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "directory for etcd's and NATS's data")
	out := fs.String("addresses", "", "file to write \"<etcd endpoint> <nats url> <metrics address>\" to once both serve")
	only := fs.String("only", "", `run only "etcd" or only "nats" (the other address is written as "-")`)
	natsPort := fs.Int("nats-port", 0, "NATS's port (0: any free one)")
	etcdPort := fs.Int("etcd-port", 0, "etcd's client port (0: any free one)")
	restore := fs.String("etcd-restore", "", "an etcd snapshot file: etcd's data is made anew from it before it starts (etcd restored)")
	if err := parse(fs, "Run etcd and NATS JetStream for a load test, until SIGTERM.", args); err != nil {
		return err
	}
	if *dir == "" || *out == "" {
		return errors.New("store: --dir and --addresses are required")
	}
	if *only != "" && *only != "etcd" && *only != "nats" {
		return fmt.Errorf("store: --only %q: want etcd or nats", *only)
	}
	etcdURL, natsURL := "-", "-"
	// Their traffic, for the work per change: etcd counts its gRPC bytes
	// and messages in the default registry; NATS's counts are read here.
	reg := prometheus.NewRegistry()
	if *only != "nats" {
		opts := embedded.EtcdOptions{ClientPort: *etcdPort}
		if *restore != "" {
			opts.Restore = func(dataDir, name, initialCluster string, peer url.URL) error {
				return snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{SnapshotPath: *restore, Name: name,
					OutputDataDir: dataDir, PeerURLs: []string{peer.String()}, InitialCluster: initialCluster, InitialClusterToken: "etcd-cluster"})
			}
		}
		etcd, err := embedded.StartEtcdWith(filepath.Join(*dir, "etcd-store"), opts)
		if err != nil {
			return err
		}
		defer etcd.Close()
		etcdURL = etcd.Endpoint
	}
	if *only != "etcd" {
		nats, err := embedded.StartNATS(filepath.Join(*dir, "nats-store"), *natsPort)
		if err != nil {
			return err
		}
		defer nats.Close()
		natsURL = nats.URL
		for i, name := range []string{"in_msgs", "in_bytes", "out_msgs", "out_bytes"} {
			reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "loadtest_nats_" + name + "_total",
				Help: "NATS traffic: " + name + " (in: from clients, out: to them)."}, func() float64 {
				in, inB, out, outB, err := nats.Traffic()
				if err != nil {
					return math.NaN()
				}
				return float64([]int64{in, inB, out, outB}[i])
			}))
		}
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("store: metrics: %w", err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(prometheus.Gatherers{prometheus.DefaultGatherer, reg}, promhttp.HandlerOpts{}),
		ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()
	// Written whole, then renamed: the reader never sees half of it.
	tmp := *out + ".tmp"
	if err := os.WriteFile(tmp, []byte(etcdURL+" "+natsURL+" "+lis.Addr().String()+"\n"), 0o644); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	<-ctx.Done()
	return nil
}

// startStore starts runStore in a child process and returns it with the
// etcd endpoint and the NATS URL ("-" for one not run); extra are more
// of its flags (--only etcd or nats, --nats-port). The process's admin
// address serves the store's metrics.
func startStore(ctx context.Context, out, name, work string, extra ...string) (*proc, string, string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, "", "", err
	}
	addrs := filepath.Join(work, name+"-addresses")
	args := append([]string{"store", "--dir", work, "--addresses", addrs}, extra...)
	p, err := start(out, name, self, args...)
	if err != nil {
		return nil, "", "", err
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(50 * time.Millisecond) {
		b, err := os.ReadFile(addrs)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) == 3 {
			p.admin = f[2]
			return p, f[0], f[1], nil
		}
	}
	p.stop()
	return nil, "", "", fmt.Errorf("etcd and NATS did not serve within a minute (see %s.log in the output directory)", name)
}
