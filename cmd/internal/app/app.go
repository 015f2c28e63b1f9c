// Package app wires the concrete adapters — etcd store, NATS bus, YAML
// source, relay, pusher, xDS cache and server — into the parts the commands
// run. Every Run blocks until its context is done and returns after
// everything it started has stopped.
package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/classify"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	securityv1 "istio.io/api/security/v1alpha1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Conns are a process's connections to etcd and NATS.
type Conns struct {
	Etcd *clientv3.Client
	NATS *nats.Conn
}

// Connect connects to etcd and to NATS as the flags of r say (TLS and
// credentials included); name identifies the process to NATS.
func Connect(r cli.Remote, name string, log *slog.Logger) (*Conns, error) {
	ecfg, err := r.Etcd.Config(5 * time.Second)
	if err != nil {
		return nil, err
	}
	nopts, err := r.NATS.Options()
	if err != nil {
		return nil, err
	}
	etcd, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("app: etcd %v: %w", ecfg.Endpoints, err)
	}
	nc, err := dialNATS(r.NATS.URL, name, log, nopts...)
	if err != nil {
		etcd.Close()
		return nil, err
	}
	return &Conns{Etcd: etcd, NATS: nc}, nil
}

// Close closes both connections.
func (c *Conns) Close() {
	c.NATS.Close()
	c.Etcd.Close()
}

// dialNATS connects to NATS and keeps reconnecting for as long as the
// connection is open.
func dialNATS(url, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", RedactURLs(c.ConnectedUrl())) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// A permissions violation, a slow consumer: said, not fatal.
			log.Warn("nats error", "err", err)
		}),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("app: nats %s: %w", RedactURLs(url), err)
	}
	return nc, nil
}

// RedactURLs returns a comma-separated list of URLs with their user
// information (a NATS token, a user and password) replaced, for logs and
// errors.
func RedactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "(unparsable URL)"
			continue
		}
		if u.User != nil {
			u.User = url.User("REDACTED")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// Election makes a part run only while this process leads the part's
// election in etcd, so that replicas of the ingester take turns; the zero
// value runs the part unelected.
type Election struct {
	// ID names this replica (the pod name, say); empty disables elections.
	ID string
	// TTL is how long a crashed leader keeps its leadership. Default 10s.
	TTL time.Duration
	// Share, when set, spreads the elections over the replicas alive.
	Share *Share
}

// Share spreads the elections a replica runs (its sources, the relay)
// over the replicas alive, so that ingest scales past one leader: a
// replica leading more than its fair share (its elections over the
// replicas announced in etcd, rounded up) gives one up, one at a time,
// when another replica is waiting for it.
type Share struct {
	Etcd *clientv3.Client
	// Role is the role the replicas are announced under ("ingester").
	Role string
	// Every is how often a leader checks its share. Default 5s.
	Every time.Duration
	Log   *slog.Logger

	mu        sync.Mutex
	elections int
	leading   int
	yielded   time.Time
}

// errYielded ends a term given up for another replica.
var errYielded = errors.New("app: leadership given up to another replica (fair share)")

// lead runs run for one term of an election, giving the term up when this
// replica leads more than its share and another replica waits for it.
func (s *Share) lead(ctx context.Context, election string, run func(context.Context) error) error {
	every := cmp.Or(s.Every, 5*time.Second)
	s.mu.Lock()
	s.leading++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.leading--
		s.mu.Unlock()
	}()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if s.over(ctx, election, every) {
					cancel(errYielded)
					return
				}
			}
		}
	}()
	err := run(ctx)
	if errors.Is(context.Cause(ctx), errYielded) {
		return errYielded
	}
	return err
}

// over reports whether this replica should give up the election: it leads
// more than its share, gave up none for a while, and another replica
// campaigns for it.
func (s *Share) over(ctx context.Context, election string, every time.Duration) bool {
	members, err := store.Members(ctx, s.Etcd, s.Role)
	if err != nil || len(members) < 2 {
		return false
	}
	s.mu.Lock()
	fair := (s.elections + len(members) - 1) / len(members)
	if s.leading <= fair || time.Since(s.yielded) < 2*every {
		s.mu.Unlock()
		return false
	}
	s.mu.Unlock()
	resp, err := s.Etcd.Get(ctx, store.ElectionPrefix+election+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count < 2 {
		return false // nobody else campaigns for it
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leading <= fair || time.Since(s.yielded) < 2*every {
		return false
	}
	s.yielded = time.Now()
	if s.Log != nil {
		s.Log.Info("giving up a leadership to another replica", "election", election, "leading", s.leading, "fair_share", fair, "replicas", len(members))
	}
	return true
}

// led runs run while this process leads the named election (or at once,
// unelected), pointing term, if given, at the store to write through:
// fenced by the leadership, so a deposed leader's writes are refused.
func led(ctx context.Context, etcd *clientv3.Client, e Election, name string, log *slog.Logger, term *termStore, run func(context.Context) error) error {
	if e.ID == "" {
		if term != nil {
			term.cur.Store(store.New(etcd))
		}
		return run(ctx)
	}
	el := &store.Elector{Client: etcd, Name: name, ID: e.ID, TTL: e.TTL, Log: log}
	if e.Share != nil {
		e.Share.mu.Lock()
		e.Share.elections++
		e.Share.mu.Unlock()
	}
	return el.Run(ctx, func(ctx context.Context, fenced *store.Store) error {
		if term != nil {
			term.cur.Store(fenced)
		}
		if e.Share != nil {
			return e.Share.lead(ctx, name, run)
		}
		return run(ctx)
	})
}

// forgetting runs a source for one leadership term, and forgets its
// problems when the term ends: a replica that no longer syncs a source
// does not list its problems (the leader does).
func forgetting(m *ingest.Metrics, source string, run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		defer m.Forget(source)
		return run(ctx)
	}
}

// termStore is the store of the current leadership term.
type termStore struct{ cur atomic.Pointer[store.Store] }

var _ ingest.Store = (*termStore)(nil)

func (t *termStore) PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (bool, int64, error) {
	return t.cur.Load().PutAt(ctx, k, o, modRev)
}

func (t *termStore) DeleteAt(ctx context.Context, k model.Key, modRev int64) (bool, int64, error) {
	return t.cur.Load().DeleteAt(ctx, k, modRev)
}

func (t *termStore) List(ctx context.Context) ([]model.Stored, int64, []error, error) {
	return t.cur.Load().List(ctx)
}

func (t *termStore) Revision(ctx context.Context) (int64, error) {
	return t.cur.Load().Revision(ctx)
}

// Source runs the YAML-directory source into the store.
type Source struct {
	Etcd         *clientv3.Client
	MeshDir      string
	DomainSuffix string
	// MeshNamespace is the namespace of the mesh's ConfigMap (see
	// istio.Options).
	MeshNamespace string
	// MaxDelay bounds how long a change waits for the directory to be
	// quiet (see ingest.Loop).
	MaxDelay time.Duration
	Election Election
	Log      *slog.Logger
	// Metrics may be nil (unregistered).
	Metrics *ingest.Metrics
	// OnSynced is called after every sync.
	OnSynced func(ingest.Result)
}

// Run runs the source until ctx is done.
func (s Source) Run(ctx context.Context) error {
	const name = "yaml"
	term := &termStore{}
	syncer, err := ingest.NewSyncer(ingest.Config{Source: name, Store: term, Log: s.Log, Metrics: s.Metrics})
	if err != nil {
		return err
	}
	src, err := yamldir.New(yamldir.Config{
		Dir:       s.MeshDir,
		Syncer:    syncer,
		Normalize: istio.Options{DomainSuffix: s.DomainSuffix, Shard: name, MeshNamespace: s.MeshNamespace},
		Log:       s.Log.With("source", name),
		OnSynced:  s.OnSynced,
		MaxDelay:  s.MaxDelay,
	})
	if err != nil {
		return err
	}
	return led(ctx, s.Etcd, s.Election, "source/"+name, s.Log, term, forgetting(s.Metrics, name, src.Run))
}

// KubeSource runs the Kubernetes source of one cluster into the store.
type KubeSource struct {
	Etcd *clientv3.Client
	// Cluster is the cluster ID; it names the endpoint shard.
	Cluster      string
	Kube         *rest.Config
	DomainSuffix string
	// MeshNamespace is the namespace of the mesh's ConfigMap (see
	// kube.Config).
	MeshNamespace string
	// MaxDelay bounds how long a change waits for the cluster to be quiet.
	MaxDelay          time.Duration
	NamespaceSelector labels.Selector
	// Parts, above 1, splits the cluster's namespaces into that many
	// parts (kube.PartOf), each a source and an election of its own, so
	// that several replicas share one cluster's ingest.
	Parts    int
	Election Election
	Log      *slog.Logger
	// Metrics may be nil (unregistered).
	Metrics     *ingest.Metrics
	KubeMetrics *kube.Metrics
	OnSynced    func(ingest.Result)
}

// Run watches the cluster until ctx is done.
func (k KubeSource) Run(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(k.Kube)
	if err != nil {
		return fmt.Errorf("app: cluster %s: %w", k.Cluster, err)
	}
	dyn, err := dynamic.NewForConfig(k.Kube)
	if err != nil {
		return fmt.Errorf("app: cluster %s: %w", k.Cluster, err)
	}
	parts := max(k.Parts, 1)
	// The parts this replica leads watch the cluster once.
	shared := kube.NewInformers(client, dyn)
	g, ctx := errgroup.WithContext(ctx)
	for part := range parts {
		name := kube.PartName(k.Cluster, part, parts)
		term := &termStore{}
		// A part owns what the cluster's other sources (its parts before
		// the number of parts changed) wrote in its namespaces.
		adopts := func(source string, key model.Key) bool {
			return source != name && kube.SameCluster(source, k.Cluster) && kube.PartOf(key.Namespace, parts) == part
		}
		syncer, err := ingest.NewSyncer(ingest.Config{Source: name, Adopts: adopts, Store: term, Log: k.Log, Metrics: k.Metrics})
		if err != nil {
			return err
		}
		src, err := kube.New(kube.Config{
			Cluster: k.Cluster, Client: client, Dynamic: dyn, Syncer: syncer, Part: part, Parts: parts, Informers: shared,
			DomainSuffix: k.DomainSuffix, MeshNamespace: k.MeshNamespace, NamespaceSelector: k.NamespaceSelector,
			Log: k.Log.With("source", name), Metrics: k.KubeMetrics, OnSynced: k.OnSynced, MaxDelay: k.MaxDelay,
		})
		if err != nil {
			return err
		}
		// Each part is an election of its own: the parts spread over the
		// replicas as the sources do.
		g.Go(func() error {
			return led(ctx, k.Etcd, k.Election, "source/"+name, k.Log, term, forgetting(k.Metrics, name, src.Run))
		})
	}
	return g.Wait()
}

// RootCerts publishes the mesh's roots in one cluster's namespaces (see
// kube.RootCerts), led by one replica.
type RootCerts struct {
	Etcd              *clientv3.Client
	Cluster           string
	Kube              *rest.Config
	NamespaceSelector labels.Selector
	Election          Election
	Log               *slog.Logger
}

// Run publishes until ctx is done.
func (r RootCerts) Run(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(r.Kube)
	if err != nil {
		return fmt.Errorf("app: cluster %s: %w", r.Cluster, err)
	}
	name := "rootcerts/" + r.Cluster
	return led(ctx, r.Etcd, r.Election, name, r.Log, nil, func(ctx context.Context) error {
		return (&kube.RootCerts{Client: client, Etcd: r.Etcd, NamespaceSelector: r.NamespaceSelector, Log: r.Log.With("part", name)}).Run(ctx)
	})
}

// ZooKeeperSource runs the ZooKeeper source of one ensemble into the store.
type ZooKeeperSource struct {
	Etcd *clientv3.Client
	// Config is the source's configuration; its Syncer and Log are set here.
	Config   zookeeper.Config
	Election Election
	Log      *slog.Logger
	// Metrics may be nil (unregistered).
	Metrics *ingest.Metrics
}

// Run watches the ensemble until ctx is done.
func (z ZooKeeperSource) Run(ctx context.Context) error {
	name := zookeeper.SourceName(z.Config.Ensemble)
	term := &termStore{}
	syncer, err := ingest.NewSyncer(ingest.Config{Source: name, Store: term, Log: z.Log, Metrics: z.Metrics})
	if err != nil {
		return err
	}
	cfg := z.Config
	cfg.Syncer, cfg.Log = syncer, z.Log.With("source", name)
	src, err := zookeeper.New(cfg)
	if err != nil {
		return err
	}
	return led(ctx, z.Etcd, z.Election, "source/"+name, z.Log, term, forgetting(z.Metrics, name, src.Run))
}

// Relay runs the relay from the store to the bus.
type Relay struct {
	Etcd       *clientv3.Client
	NATS       *nats.Conn
	Bus        bus.Config
	Election   Election
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Started, when set, receives the relay once it exists.
	Started func(*relay.Relay)
}

// Run relays until ctx is done.
func (r Relay) Run(ctx context.Context) error {
	b, err := bus.New(r.NATS, r.Bus)
	if err != nil {
		return err
	}
	rl, err := relay.New(relay.Config{Watcher: store.New(r.Etcd), Publisher: b, Log: r.Log.With("part", "relay"), Registerer: r.Registerer})
	if err != nil {
		return err
	}
	if r.Started != nil {
		r.Started(rl)
	}
	// The relay only reads the store; the election keeps one relay
	// publishing (a second would double nothing, only waste work).
	return led(ctx, r.Etcd, r.Election, "relay", r.Log, nil, rl.Run)
}

// Pusher serves xDS from the store and the bus.
type Pusher struct {
	Etcd *clientv3.Client
	NATS *nats.Conn
	Bus  bus.Config
	// ADS is where to serve ADS.
	ADS net.Listener
	// Quiet, MaxDelay and MaxHold batch changes; ClusterLinger keeps
	// removed clusters a while (see pusher.Config).
	Quiet, MaxDelay, MaxHold, ClusterLinger time.Duration
	Log                                     *slog.Logger
	Registerer                              prometheus.Registerer
	// Status, when set, records every proxy stream's versions (/debug/syncz).
	Status *server.Status
	// Dump, when set, serves the cache's content per proxy (/debug/config_dump).
	Dump *ConfigDump
	// XDS tunes the xDS server (connection age, stream rate, senders,
	// send timeout, class idle time, gRPC buffers): its cache, classifier,
	// log, registry, status and readiness are the pusher's own.
	XDS server.Config
	// Policy, when set, is how proxies are identified; CSDS callers are
	// identified and scoped the same way.
	Policy *identity.Policy
	// ClientCA, when set, is the client CA of the ADS TLS configuration:
	// when its file changes, the streams of proxies it no longer trusts end.
	ClientCA *identity.ClientCA
	// RootNamespace is the mesh's root namespace, whose security policies
	// apply everywhere (default istio-system).
	RootNamespace string
	// Namespaces, when set, are the namespaces whose proxies this pusher
	// serves: it holds only what they may see, and refuses proxies of
	// other namespaces (FailedPrecondition, naming its namespaces).
	Namespaces []string
	// NamespacesFile, when set, holds the namespaces served instead of
	// Namespaces (see ParseNamespaces): a shard's placement, which the
	// operator changes at run time (a ConfigMap mounted as a volume). It is
	// read every PlacementPoll (default 1s); on a change the pusher loads
	// what the new namespaces see and ends the streams of proxies of
	// namespaces it no longer serves, which reconnect to their new shard.
	NamespacesFile string
	PlacementPoll  time.Duration
	// ScopeByProxies serves the namespaces of the proxies connected (of
	// Namespaces, when set), each loaded when its first proxy comes and
	// released ScopeGrace after its last left (default 5m).
	ScopeByProxies bool
	ScopeGrace     time.Duration
	// Certificates, when set, is Istio's CA service, served on the ADS
	// port for Istio's agents.
	Certificates *ca.Service
	// MeshOverrides are settings that win over the mesh's MeshConfig (see
	// pusher.Config). Automatic mutual TLS is off anyway when Envoys can
	// get no workload certificate (no Secrets in XDS, no
	// AgentCertificates).
	MeshOverrides *meshv1.MeshConfig
	// TrustDomain is the mesh's SPIFFE trust domain.
	TrustDomain string
	// AgentCertificates says Envoys get their workload certificates from
	// Istio's agent beside them, not from the pushers (see pusher.Config).
	AgentCertificates bool
	// SharedGatewayNamespaces binds gateway proxies to their namespace's
	// Gateways, but for these namespaces' (see pusher.Config); nil: none
	// bound, as istiod.
	SharedGatewayNamespaces []string
	// Started, when set, receives the pusher and its cache once they exist,
	// so that the caller can watch what they serve.
	Started func(*pusher.Pusher, *cache.Cache)
}

// Run serves until ctx is done. The pusher only reads the stream (the
// relay makes it): until it exists, the pusher retries its load.
func (p Pusher) Run(ctx context.Context) error {
	b, err := bus.New(p.NATS, p.Bus)
	if err != nil {
		return err
	}
	// One straight line: the pusher fills the cache; the server answers
	// from the cache and asks the pusher for classes.
	c, err := cache.New(cache.Config{
		Classes: pusher.Classes, Types: pusher.ClassTypes, SharedTypes: pusher.SharedTypes, Log: p.Log, Registerer: p.Registerer,
	})
	if err != nil {
		return err
	}
	// The load assignments of each locality's proxies, mostly the shared
	// ones (whose encoding they reuse).
	lc, err := cache.New(cache.Config{Types: pusher.SharedTypes, Reuse: c, Log: p.Log})
	if err != nil {
		return err
	}
	namespaces := p.Namespaces
	var placement []byte
	if p.NamespacesFile != "" {
		if len(p.Namespaces) > 0 {
			return errors.New("pusher: the namespaces served come from a list or from a file, not both")
		}
		if placement, namespaces, err = readPlacement(p.NamespacesFile); err != nil {
			return err
		}
	}
	ps, err := pusher.New(pusher.Config{
		RootNamespace: p.RootNamespace, NoAutoMTLS: p.XDS.Secrets == nil && !p.AgentCertificates, MeshOverrides: p.MeshOverrides, TrustDomain: p.TrustDomain,
		AgentCertificates: p.AgentCertificates, SharedGatewayNamespaces: p.SharedGatewayNamespaces, Namespaces: namespaces, Placed: p.NamespacesFile != "", ScopeByProxies: p.ScopeByProxies, ScopeGrace: p.ScopeGrace, Loader: store.New(p.Etcd), Feed: b, Sink: c, Localities: lc, Log: p.Log.With("part", "pusher"),
		Registerer: p.Registerer, Quiet: p.Quiet, MaxDelay: p.MaxDelay, MaxHold: p.MaxHold, ClusterLinger: p.ClusterLinger,
	})
	if err != nil {
		return err
	}
	if p.Started != nil {
		p.Started(ps, c)
	}
	if p.Dump != nil {
		p.Dump.cache.Store(c)
		p.Dump.localities.Store(lc)
		p.Dump.pusher.Store(ps)
	}
	xcfg := p.XDS
	xcfg.Cache, xcfg.Classes, xcfg.ClassesChanged, xcfg.Convergence = c, ps, ps.ClassesChanged(), ps
	xcfg.Localities = localities{Cache: lc, pusher: ps}
	xcfg.Authorize = servedOnly(ps, xcfg.Authorize)
	if p.ScopeByProxies {
		// A namespace's scope is loaded with its first proxy: the
		// proxy retries until it is.
		authorize := xcfg.Authorize
		xcfg.Authorize = func(ctx context.Context, node *core.Node) (*core.Node, error) {
			if authorize != nil {
				var err error
				if node, err = authorize(ctx, node); err != nil {
					return nil, err
				}
			}
			ns := classify.Namespace(node)
			if err := ps.Admit(ns); err != nil {
				ps.Left(ns)
				return nil, status.Errorf(codes.Unavailable, "shardpilot: loading what namespace %q sees; retry", ns)
			}
			return node, nil
		}
		xcfg.Closed = func(node *core.Node) { ps.Left(classify.Namespace(node)) }
	}
	xcfg.Log, xcfg.Registerer, xcfg.Status = p.Log.With("part", "xds"), p.Registerer, p.Status
	xcfg.Ready = func() bool { return ps.GeneratedRevision() > 0 }
	xcfg.Register = func(r grpc.ServiceRegistrar) {
		if p.Dump != nil {
			statusv3.RegisterClientStatusDiscoveryServiceServer(r, &CSDS{Dump: p.Dump, Policy: p.Policy})
		}
		if p.Certificates != nil {
			securityv1.RegisterIstioCertificateServiceServer(r, p.Certificates)
		}
	}
	srv, err := server.New(xcfg)
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ps.Run(ctx) })
	g.Go(func() error { return srv.Run(ctx, p.ADS) })
	if p.ClientCA != nil {
		g.Go(func() error {
			return p.ClientCA.Watch(ctx, func() { srv.EndUntrusted(p.ClientCA.Trusted) })
		})
	}
	if p.NamespacesFile != "" {
		failures := prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_placement_read_failures_total",
			Help: "Reads of the namespaces file (--namespaces-file) that failed or found it invalid; the last placement is kept."})
		if p.Registerer != nil {
			if err := p.Registerer.Register(failures); err != nil {
				return err
			}
		}
		g.Go(func() error {
			every := cmp.Or(p.PlacementPoll, time.Second)
			watchPlacement(ctx, p.NamespacesFile, placement, every, p.Log, failures, func(namespaces []string) {
				if err := ps.Place(namespaces); err != nil {
					p.Log.Error("cannot change the namespaces served", "err", err)
					return
				}
				// Those no longer served reconnect: their address leads to
				// their new shard now.
				srv.Shed(func(n *core.Node) bool { return !ps.Serves(classify.Namespace(n)) },
					"shardpilot: the proxy's namespace is served by another shard now; reconnect")
			})
			return nil
		})
	}
	return g.Wait()
}

// servedOnly refuses the proxies of namespaces a pusher does not serve
// (none when it serves every one), after authorize, which says which
// namespace a proxy is of.
func servedOnly(ps *pusher.Pusher, authorize func(context.Context, *core.Node) (*core.Node, error)) func(context.Context, *core.Node) (*core.Node, error) {
	return func(ctx context.Context, node *core.Node) (*core.Node, error) {
		if authorize != nil {
			var err error
			if node, err = authorize(ctx, node); err != nil {
				return nil, err
			}
		}
		if ns := classify.Namespace(node); !ps.Serves(ns) {
			served, _ := ps.Placement()
			return nil, status.Errorf(codes.FailedPrecondition, "shardpilot: this pusher serves the proxies of namespaces %s, not of %q: connect to the pushers of its shard",
				cmp.Or(strings.Join(served, ","), "(none)"), ns)
		}
		return node, nil
	}
}

// localities serves the load assignments of the proxies of each locality
// from a cache of their own, filled by the pusher.
type localities struct {
	*cache.Cache
	pusher *pusher.Pusher
}

func (l localities) Class(n *core.Node) string { return generate.LocalityName(n.GetLocality()) }
func (l localities) Fill(class string)         { l.pusher.FillLocality(class) }

// Problem is one rejected input, as /debug/problems serves it.
type Problem struct {
	Source   string `json:"source"`
	Location string `json:"location"`
	Resource string `json:"resource,omitempty"`
	Field    string `json:"field,omitempty"`
	Reason   string `json:"reason"`
	// Warning says the object applies all the same (a field that has no
	// effect yet); otherwise it is rejected.
	Warning bool `json:"warning,omitempty"`
}

// Problems lists the current problems of the sources this process syncs,
// ordered by source and location.
func Problems(m *ingest.Metrics) []Problem {
	out := []Problem{}
	for source, problems := range m.Problems() {
		for _, p := range problems {
			out = append(out, Problem{Source: source, Location: p.Location, Resource: p.Resource, Field: p.Field, Reason: p.Reason, Warning: p.Warning})
		}
	}
	slices.SortFunc(out, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Location, b.Location), cmp.Compare(a.Resource, b.Resource))
	})
	return out
}

// ProblemsHandler serves /debug/problems: the current problems as JSON.
func ProblemsHandler(m *ingest.Metrics) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(Problems(m))
	})
}

// Rejections lists the sources' current problems for the status page.
func Rejections(m *ingest.Metrics) func() []statuspage.Rejected {
	return func() []statuspage.Rejected {
		var out []statuspage.Rejected
		for _, p := range Problems(m) {
			where, why := p.Location, p.Reason
			if p.Resource != "" {
				where += " (" + p.Resource + ")"
			}
			if p.Field != "" {
				why = p.Field + ": " + why
			}
			if p.Warning {
				why = "warning (applied): " + why
			}
			out = append(out, statuspage.Rejected{Source: p.Source, Location: where, Reason: why})
		}
		return out
	}
}
