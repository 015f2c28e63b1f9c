package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/rest"
)

// Options shape a test cluster. The zero value is one ingester and one
// pusher on an embedded etcd and NATS.
type Options struct {
	// Ingesters run the sources and the relay, elected among themselves
	// when there are several, as the ingester's replicas are. Default 1.
	Ingesters int
	// Pushers serve ADS, each on a port of its own. Default 1.
	Pushers int
	// XDS tunes each pusher's xDS server (TLS credentials, secrets).
	XDS server.Config
	// Policy identifies proxies and CSDS callers (see app.Pusher.Policy).
	Policy *identity.Policy
	// SharedGateways: see app.Pusher.SharedGatewayNamespaces.
	SharedGateways []string
	// ClientCA: see app.Pusher.ClientCA.
	ClientCA *identity.ClientCA
	// Certificates: see app.Pusher.Certificates.
	Certificates *ca.Service
	// Tune, when set, changes pusher i's configuration before it is built.
	Tune func(i int, p *app.Pusher)
	// Unloaded starts the cluster without waiting for the pushers to load
	// the mesh.
	Unloaded bool
}

// Cluster is a control plane under test: ingesters running sources and
// the relay, and pushers, on one etcd and one NATS, all in the test's
// process and built by the mains' own path (app.Pusher.Build, app.Relay).
// Its Replica is the first pusher, the one most tests talk to.
type Cluster struct {
	*Replica
	Pushers []*Replica
	etcd    *clientv3.Client
	nats    *nats.Conn
	// natsServer is the NATS server, which a test may stop (and start
	// again on its port, with what it held in natsDir).
	natsServer *embedded.NATS
	natsDir    string
	natsPort   int
	// relay is the first ingester's relay.
	relay  *relay.Relay
	ctx    context.Context
	cancel context.CancelFunc
	g      *errgroup.Group
}

// Replica is one pusher of a cluster.
type Replica struct {
	ads    string
	reg    *prometheus.Registry
	status *server.Streams
	dump   *app.ConfigDump
	etcd   *clientv3.Client
	pusher *pusher.Pusher
	cache  *cache.Cache
	cancel context.CancelFunc
	done   chan error
}

// ingester is what a source runs with: the store, the ingester's
// election and its log.
type ingester struct {
	etcd     *clientv3.Client
	nats     *nats.Conn
	election app.Election
	log      *slog.Logger
}

// source runs one ingest source of an ingester.
type source func(ctx context.Context, in ingester) error

func yamlSource(dir string) source {
	return func(ctx context.Context, in ingester) error {
		return app.Source{Etcd: in.etcd, MeshDir: dir, Election: in.election, Log: in.log}.Run(ctx)
	}
}

func kubeSource(cluster string, cfg *rest.Config) source {
	return func(ctx context.Context, in ingester) error {
		return app.KubeSource{Etcd: in.etcd, Cluster: cluster, Kube: cfg, Election: in.election, Log: in.log}.Run(ctx)
	}
}

// NewCluster starts a cluster whose ingesters run sources, and waits until
// its pushers have loaded the mesh (a pusher refuses proxies until then;
// a proxy retries, and the tests start once it would be served). The
// cluster stops when the test ends.
func NewCluster(t testing.TB, o Options, sources ...source) *Cluster {
	t.Helper()
	_, cli := testutil.Etcd(t)
	natsDir := t.TempDir()
	natsServer, err := embedded.StartNATS(natsDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { natsServer.Close() })
	nc := testutil.Connect(t, natsServer.URL)
	log := testutil.Log(t)
	ctx, cancel := context.WithCancel(context.Background())
	g, ctx := errgroup.WithContext(ctx)
	c := &Cluster{etcd: cli, nats: nc, natsServer: natsServer, natsDir: natsDir, natsPort: natsServer.Port(), ctx: ctx, cancel: cancel, g: g}
	t.Cleanup(c.stop)
	for i := range max(o.Ingesters, 1) {
		in := ingester{etcd: cli, nats: nc, log: log.With("ingester", i)}
		if o.Ingesters > 1 {
			in.election = app.Election{ID: fmt.Sprintf("ingester-%d", i), TTL: 2 * time.Second}
		}
		for _, src := range sources {
			g.Go(func() error { return src(ctx, in) })
		}
		rl, err := app.Relay{Etcd: cli, NATS: nc, Bus: bus.Config{}, Election: in.election, Log: in.log}.Build()
		if err != nil {
			t.Fatal(err)
		}
		if c.relay == nil {
			c.relay = rl.Relay
		}
		g.Go(func() error { return rl.Run(ctx) })
	}
	for i := range max(o.Pushers, 1) {
		c.Pushers = append(c.Pushers, c.startPusher(t, o, i))
	}
	c.Replica = c.Pushers[0]
	if !o.Unloaded {
		for _, r := range c.Pushers {
			testutil.Eventually(t, 20*time.Second, "the pusher to load the mesh", func() (bool, string) {
				return r.pusher.GeneratedRevision() > 0, "not loaded"
			})
		}
	}
	return c
}

// startPusher builds and runs pusher i.
func (c *Cluster) startPusher(t testing.TB, o Options, i int) *Replica {
	t.Helper()
	return c.AddPusher(t, func(p *app.Pusher) {
		p.XDS, p.Policy, p.SharedGatewayNamespaces, p.ClientCA, p.Certificates = o.XDS, o.Policy, o.SharedGateways, o.ClientCA, o.Certificates
		if o.Tune != nil {
			o.Tune(i, p)
		}
	})
}

// AddPusher builds and runs one more pusher, configured by tune when
// given; its metrics go to a registry of its own. It stops with the
// cluster, or before with stop.
func (c *Cluster) AddPusher(t testing.TB, tune func(*app.Pusher)) *Replica {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &Replica{ads: lis.Addr().String(), reg: prometheus.NewRegistry(), status: server.NewStreams(), etcd: c.etcd, done: make(chan error, 1)}
	cfg := app.Pusher{Etcd: c.etcd, NATS: c.nats, ADS: lis, Log: testutil.Log(t).With("pusher", r.ads), Streams: r.status, Registerer: r.reg}
	if tune != nil {
		tune(&cfg)
	}
	built, err := cfg.Build()
	if err != nil {
		t.Fatalf("the pusher did not start: %v", err)
	}
	r.dump, r.pusher, r.cache = built.Dump, built.Pusher, built.Cache
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(c.ctx)
	go func() { r.done <- built.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

// stop stops the pusher and waits for it; a second stop returns at once.
func (r *Replica) stop() {
	r.cancel()
	<-r.done
	r.done <- nil
}

// stopNATS stops the bus; startNATS starts it again on its port, with
// the streams it held.
func (c *Cluster) stopNATS() { c.natsServer.Close() }

func (c *Cluster) startNATS(t testing.TB) {
	t.Helper()
	ns, err := embedded.StartNATS(c.natsDir, c.natsPort)
	if err != nil {
		t.Fatal(err)
	}
	c.natsServer = ns
	t.Cleanup(ns.Close)
}

func (c *Cluster) stop() {
	for _, r := range c.Pushers {
		r.stop()
	}
	c.cancel()
	_ = c.g.Wait()
}
