package app

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"slices"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/xds/nodemeta"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	securityv1 "istio.io/api/security/v1alpha1"
)

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
	// StoreCheck is how often the pusher asks the store whether it holds
	// changes the change stream has not brought (pusher.Config.StoreCheck).
	StoreCheck time.Duration
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// Streams, when set, records every proxy stream's versions
	// (/debug/syncz); the built pusher then serves the cache's content per
	// proxy (/debug/config_dump, CSDS).
	Streams *server.Streams
	// XDS tunes the xDS server (connection age, stream rate, senders,
	// send timeout, class idle time, gRPC buffers, TLS): its cache,
	// hooks, log, registry and status are the pusher's own.
	XDS server.Config
	// Policy, when set, is how proxies are identified: a stream's node
	// must match its peer's certificate (identity.Policy.Authorize). CSDS
	// callers are identified and scoped the same way.
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
	// WholeRoutes sends every Envoy its route configurations whole; by
	// default those that speak Delta are sent their virtual hosts apart
	// (VHDS, see pusher.Config.VirtualHosts).
	WholeRoutes bool
	// SharedGatewayNamespaces binds gateway proxies to their namespace's
	// Gateways, but for these namespaces' (see pusher.Config); nil: none
	// bound, as istiod.
	SharedGatewayNamespaces []string
	// Name names this pusher (default the host's name): the
	// WorkloadEntries of the workloads it registers name it as their
	// controller.
	Name string
	// RegistrationHeartbeat is how often the workloads registered through
	// this pusher are announced again (see bus.Announcer; default 10s).
	RegistrationHeartbeat time.Duration
}

// BuiltPusher is a pusher built and ready to run: every part exists, so
// that the caller can read them (readiness, debug handlers) before and
// while they run.
type BuiltPusher struct {
	Pusher *pusher.Pusher
	Cache  *cache.Cache
	// Dump serves the cache's content per proxy; nil without Status.
	Dump *ConfigDump

	cfg       Pusher
	srv       *server.Server
	announcer *bus.Announcer
	placement []byte
	failures  prometheus.Counter
}

// Run builds the pusher and serves until ctx is done.
func (p Pusher) Run(ctx context.Context) error {
	b, err := p.Build()
	if err != nil {
		return err
	}
	return b.Run(ctx)
}

// Build makes the pusher's parts: its caches, the pusher that fills them
// and the xDS server that answers from them. The pusher only reads the
// stream (the relay makes it): until it exists, the pusher retries its
// load.
func (p Pusher) Build() (*BuiltPusher, error) {
	b, err := bus.New(p.NATS, p.Bus)
	if err != nil {
		return nil, err
	}
	c, err := cache.New(cache.Config{
		Classes: pusher.Classes, Types: slices.Concat(pusher.ClassTypes, pusher.VHDSTypes), SharedTypes: pusher.SharedTypes, Log: p.Log, Registerer: p.Registerer,
	})
	if err != nil {
		return nil, err
	}
	// The load assignments of each locality's proxies, mostly the shared
	// ones (whose encoding they reuse).
	lc, err := cache.New(cache.Config{Types: pusher.SharedTypes, Reuse: c, Log: p.Log})
	if err != nil {
		return nil, err
	}
	out := &BuiltPusher{Cache: c, cfg: p}
	namespaces := p.Namespaces
	if p.NamespacesFile != "" {
		if len(p.Namespaces) > 0 {
			return nil, errors.New("pusher: the namespaces served come from a list or from a file, not both")
		}
		if out.placement, namespaces, err = readPlacement(p.NamespacesFile); err != nil {
			return nil, err
		}
		out.failures = prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_placement_read_failures_total",
			Help: "Reads of the namespaces file (--namespaces-file) that failed or found it invalid; the last placement is kept."})
		if p.Registerer != nil {
			if err := p.Registerer.Register(out.failures); err != nil {
				return nil, err
			}
		}
	}
	out.Pusher, err = pusher.New(pusher.Config{
		RootNamespace: p.RootNamespace, NoAutoMTLS: p.XDS.Secrets == nil && !p.AgentCertificates, MeshOverrides: p.MeshOverrides, TrustDomain: p.TrustDomain,
		AgentCertificates: p.AgentCertificates, VirtualHosts: !p.WholeRoutes, SharedGatewayNamespaces: p.SharedGatewayNamespaces, Namespaces: namespaces, Placed: p.NamespacesFile != "", ScopeByProxies: p.ScopeByProxies, ScopeGrace: p.ScopeGrace, Loader: store.New(p.Etcd), Feed: b, Tables: c, Localities: lc, Log: p.Log.With("part", "pusher"),
		Registerer: p.Registerer, Quiet: p.Quiet, MaxDelay: p.MaxDelay, MaxHold: p.MaxHold, ClusterLinger: p.ClusterLinger, StoreCheck: p.StoreCheck,
	})
	if err != nil {
		return nil, err
	}
	if p.Streams != nil {
		out.Dump = &ConfigDump{status: p.Streams, cache: c, localities: lc, pusher: out.Pusher}
		if held, ok := p.XDS.Secrets.(heldSecrets); ok {
			out.Dump.secrets = held
		}
	}
	if p.NATS != nil {
		host, _ := os.Hostname()
		out.announcer = &bus.Announcer{NATS: p.NATS, Pusher: cmp.Or(p.Name, host, "pusher"), Heartbeat: p.RegistrationHeartbeat, Log: p.Log.With("part", "registration")}
		if p.Registerer != nil {
			if err := p.Registerer.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_pusher_registered_workloads",
				Help: "Streams of workloads whose agents named a WorkloadGroup, announced to the ingesters while they last."},
				func() float64 { return float64(out.announcer.Registered()) })); err != nil {
				return nil, err
			}
		}
	}
	if out.srv, err = server.New(p.xdsConfig(out.Pusher, c, lc, out.Dump, out.announcer)); err != nil {
		return nil, err
	}
	return out, nil
}

// xdsConfig is the xDS server's configuration: it answers from the caches
// and calls into the pusher and the policy through hooks.
func (p Pusher) xdsConfig(ps *pusher.Pusher, c, lc *cache.Cache, dump *ConfigDump, announcer *bus.Announcer) server.Config {
	xcfg := p.XDS
	xcfg.Cache, xcfg.Localities = c, localities{Cache: lc, pusher: ps}
	xcfg.Hooks = hooks{pusher: ps, policy: p.Policy, byProxies: p.ScopeByProxies, announcer: announcer, register: func(r grpc.ServiceRegistrar) {
		if dump != nil {
			statusv3.RegisterClientStatusDiscoveryServiceServer(r, &CSDS{Dump: dump, Policy: p.Policy})
		}
		if p.Certificates != nil {
			securityv1.RegisterIstioCertificateServiceServer(r, p.Certificates)
		}
	}}
	xcfg.Log, xcfg.Registerer, xcfg.Streams = p.Log.With("part", "xds"), p.Registerer, p.Streams
	return xcfg
}

// Run serves until ctx is done and returns the first error of its parts.
func (b *BuiltPusher) Run(ctx context.Context) error {
	p, ps, srv := b.cfg, b.Pusher, b.srv
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ps.Run(ctx) })
	g.Go(func() error { return srv.Run(ctx, p.ADS) })
	g.Go(func() error {
		// What decides classes changed (Sidecars, exportTo, Gateways):
		// the proxies whose class is another now reconnect to it.
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-ps.ClassesChanged():
				srv.Reclassify()
			}
		}
	})
	if b.announcer != nil {
		// A registration refused after its stream was admitted (its
		// connect went unanswered) ends the stream, as istiod refuses it.
		g.Go(func() error {
			return b.announcer.Run(ctx, func(key any, reason string) {
				b.srv.Shed(func(n *core.Node) bool { return n == key }, "shardpilot: auto-registration refused: "+reason)
			})
		})
	}
	if p.ClientCA != nil {
		g.Go(func() error {
			return p.ClientCA.Watch(ctx, func() { srv.EndUntrusted(p.ClientCA.Trusted) })
		})
	}
	if p.NamespacesFile != "" {
		g.Go(func() error {
			every := cmp.Or(p.PlacementPoll, time.Second)
			watchPlacement(ctx, p.NamespacesFile, b.placement, every, p.Log, b.failures, func(namespaces []string) {
				if err := ps.Place(namespaces); err != nil {
					p.Log.Error("cannot change the namespaces served", "err", err)
					return
				}
				// Those no longer served reconnect: their address leads to
				// their new shard now.
				srv.Shed(func(n *core.Node) bool { return !ps.Serves(nodemeta.Namespace(n)) },
					"shardpilot: the proxy's namespace is served by another shard now; reconnect")
			})
			return nil
		})
	}
	return g.Wait()
}

// localities serves the load assignments of the proxies of each locality
// from a cache of their own, filled by the pusher.
type localities struct {
	*cache.Cache
	pusher *pusher.Pusher
}

func (l localities) Class(n *core.Node) cache.Class {
	return cache.Class(generate.LocalityName(n.GetLocality()))
}

func (l localities) Fill(class cache.Class) { l.pusher.FillLocality(class) }
