// Command standalone runs all of shardpilot in one process: an embedded etcd
// and NATS JetStream, the ingester on a YAML directory with its relay, and a
// pusher serving ADS, plus the admin endpoints. It is the quickest way to
// try the product and what the end-to-end tests run.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/pki"
	"github.com/shardpilot/shardpilot/internal/version"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"golang.org/x/sync/errgroup"
)

type config struct {
	cli.Common
	meshDir, adsAddr, dataDir, domainSuffix string
	quiet, maxDelay, maxHold, linger        time.Duration
	secure                                  bool
}

func main() { cli.Main("standalone", run) }

func run(ctx context.Context, args []string) error {
	var c config
	fs := flag.NewFlagSet("standalone", flag.ContinueOnError)
	fs.StringVar(&c.meshDir, "mesh-dir", "examples/mesh", "directory of Istio YAML (ServiceEntry, WorkloadEntry, VirtualService, DestinationRule, Sidecar) to serve")
	fs.StringVar(&c.adsAddr, "ads-addr", ":15010", "address to serve ADS (gRPC) on")
	c.Register(fs, ":15014")
	fs.BoolVar(&c.secure, "secure", false, "the embedded etcd requires client certificates and the embedded NATS TLS and a password, as a production install would (a private CA and the credentials are made in the data directory; the standalone's own clients use them)")
	fs.StringVar(&c.dataDir, "data-dir", "", "directory for the embedded etcd and NATS data (default a temporary directory, removed on exit)")
	fs.StringVar(&c.domainSuffix, "domain-suffix", "cluster.local", "DNS suffix that completes short host names")
	fs.DurationVar(&c.quiet, "debounce-quiet", 10*time.Millisecond, "quiet period before changes are generated (streams coalesce what arrives while a response is in flight)")
	fs.DurationVar(&c.maxDelay, "debounce-max", time.Second, "longest a change waits for the quiet period")
	fs.DurationVar(&c.linger, "cluster-linger", 5*time.Second, "how long a cluster a proxy no longer has is still served, so that the routes that stop naming it arrive first (negative: removed at once)")
	fs.DurationVar(&c.maxHold, "debounce-max-hold", 5*time.Second, "longest a change waits while the last generation's pushes are still being written (under load, batches last as long as a wave of pushes)")
	if err := cli.Parse(fs, "shardpilot standalone: embedded etcd and NATS, the ingester and a pusher in one process.", args); err != nil {
		return err
	}
	if err := c.ApplyMemoryLimit(); err != nil {
		return err
	}
	log, err := telemetry.NewLogger(os.Stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return err
	}
	if st, err := os.Stat(c.meshDir); err != nil || !st.IsDir() {
		return fmt.Errorf("--mesh-dir %q is not a directory", c.meshDir)
	}
	return serve(ctx, c, log)
}

// startEmbedded starts etcd and NATS in the process, in c.dataDir (a
// temporary one, removed by stop, when it is empty), and connects to them;
// stop closes what it started, in reverse.
func startEmbedded(c *config, log *slog.Logger) (conns *app.Conns, stop func(), err error) {
	var undo []func()
	stop = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	if c.dataDir == "" {
		dir, err := os.MkdirTemp("", "shardpilot-")
		if err != nil {
			return nil, nil, err
		}
		undo = append(undo, func() { os.RemoveAll(dir) })
		c.dataDir = dir
	}
	var etcdOpts embedded.EtcdOptions
	var natsOpts embedded.NATSOptions
	var remote cli.Remote
	if c.secure {
		if remote, etcdOpts, natsOpts, err = secureEmbedded(c.dataDir); err != nil {
			return nil, nil, err
		}
	}
	etcd, err := embedded.StartEtcdWith(c.dataDir, etcdOpts)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, etcd.Close)
	nats, err := embedded.StartNATSWith(c.dataDir, 0, natsOpts)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, nats.Close)
	log.Info("embedded servers started", "etcd", etcd.Endpoint, "nats", nats.URL, "data_dir", c.dataDir, "secure", c.secure)
	remote.Etcd.Endpoints, remote.NATS.URL = etcd.Endpoint, nats.URL
	if conns, err = app.Connect(remote, "shardpilot-standalone", log); err != nil {
		return nil, nil, err
	}
	undo = append(undo, conns.Close)
	return conns, stop, nil
}

func serve(ctx context.Context, c config, log *slog.Logger) (err error) {
	adminToken, err := c.AdminTokens(log)
	if err != nil {
		return err
	}
	conns, stop, err := startEmbedded(&c, log)
	if err != nil {
		return err
	}
	defer stop()
	etcdCli, nc := conns.Etcd, conns.NATS

	adsLis, adminLis, adminTLSLis, adminTLS, err := c.ListenWithADS(log, c.adsAddr)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil { // the servers close them once they run
			cli.CloseAll(adsLis, adminLis, adminTLSLis)
		}
	}()

	reg := telemetry.NewRegistry(version.Collector())
	status := server.NewStreams()
	busCfg := bus.Config{}
	rl, err := app.Relay{Etcd: etcdCli, NATS: nc, Bus: busCfg, Log: log, Registerer: reg}.Build()
	if err != nil {
		return err
	}
	built, err := app.Pusher{Etcd: etcdCli, NATS: nc, Bus: busCfg, ADS: adsLis, Quiet: c.quiet, MaxDelay: c.maxDelay, MaxHold: c.maxHold, ClusterLinger: c.linger,
		Log: log, Registerer: reg, Streams: status}.Build()
	if err != nil {
		return err
	}
	ps := built.Pusher
	ready := telemetry.NewReadiness()
	// Ready once the pusher serves a generation that includes the first
	// sync of the mesh directory.
	var synced atomic.Bool
	var syncedRev atomic.Int64
	ready.Check("mesh loaded", func() bool {
		return synced.Load() && ps.GeneratedRevision() > 0 && ps.GeneratedRevision() >= syncedRev.Load()
	})
	// Ready it stays through an outage of etcd or NATS, serving its last
	// config (stale is a metric and a state of the status page).

	ingestReport, err := ingest.NewReport(reg)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return app.Source{Etcd: etcdCli, MeshDir: c.meshDir, DomainSuffix: c.domainSuffix, Log: log, Report: ingestReport,
			OnSynced: func(r ingest.Result) {
				if !synced.Load() {
					syncedRev.Store(r.Revision)
					synced.Store(true)
				}
			}}.Run(ctx)
	})
	g.Go(func() error { return rl.Run(ctx) })
	g.Go(func() error { return built.Run(ctx) })
	host, _ := os.Hostname()
	// A pusher and an ingester, at the same admin port.
	for _, m := range []store.Member{c.Member("pusher", host, adsLis, adminLis, adminTLSLis), c.Member("ingester", host, nil, adminLis, adminTLSLis)} {
		g.Go(func() error { return store.Announce(ctx, etcdCli, m, 0, log) })
	}
	log.Info("status page", "url", "http://"+adminLis.Addr().String()+"/")
	page := statuspage.New(statuspage.Config{Title: "standalone", Version: version.String(), Gatherer: reg, Streams: app.PageStreams(status), Stale: ps.Stale, Rejected: app.Rejections(ingestReport)})
	g.Go(func() error { return page.Run(ctx) })
	admin := &telemetry.Admin{Listener: adminLis, TLSListener: adminTLSLis, TLS: adminTLS, Gatherer: reg, Ready: ready, Log: log, DebugToken: adminToken,
		TokenOnLoopback: c.AdminTokenOnLoopback, Page: page,
		Debug: map[string]http.Handler{"/debug/syncz": status, "/debug/config_dump": built.Dump, "/debug/problems": app.ProblemsHandler(ingestReport)}}
	g.Go(func() error { return admin.Run(ctx) })
	err = g.Wait()
	log.Info("stopped")
	return err
}

// secureEmbedded makes a private CA in the data directory, certificates
// for the embedded etcd and NATS and for the standalone's own clients, and
// a NATS password; it returns how the servers require them and how the
// clients present them.
func secureEmbedded(dataDir string) (cli.Remote, embedded.EtcdOptions, embedded.NATSOptions, error) {
	var remote cli.Remote
	dir := filepath.Join(dataDir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return remote, embedded.EtcdOptions{}, embedded.NATSOptions{}, err
	}
	authority, err := pki.NewCA(dir, "shardpilot standalone", 10*365*24*time.Hour)
	if err != nil {
		return remote, embedded.EtcdOptions{}, embedded.NATSOptions{}, err
	}
	var files [6]string
	for i, name := range []string{"etcd", "nats", "standalone"} {
		if files[2*i], files[2*i+1], err = authority.Issue(name); err != nil {
			return remote, embedded.EtcdOptions{}, embedded.NATSOptions{}, err
		}
	}
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return remote, embedded.EtcdOptions{}, embedded.NATSOptions{}, err
	}
	password := hex.EncodeToString(secret)
	passwordFile := filepath.Join(dir, "nats-password")
	if err := os.WriteFile(passwordFile, []byte(password), 0o600); err != nil {
		return remote, embedded.EtcdOptions{}, embedded.NATSOptions{}, err
	}
	remote.Etcd = cli.Etcd{CAFile: authority.CertFile, CertFile: files[4], KeyFile: files[5]}
	remote.NATS = cli.NATS{CAFile: authority.CertFile, User: "shardpilot", PasswordFile: passwordFile}
	return remote,
		embedded.EtcdOptions{TLS: &embedded.TLS{CertFile: files[0], KeyFile: files[1], ClientCAFile: authority.CertFile}},
		embedded.NATSOptions{TLS: &embedded.TLS{CertFile: files[2], KeyFile: files[3]},
			Users: []*natsserver.User{{Username: "shardpilot", Password: password}}},
		nil
}
