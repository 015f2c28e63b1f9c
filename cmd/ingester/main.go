// Command ingester reads the mesh's sources — Kubernetes clusters,
// ZooKeeper registries (Dubbo, Curator) and a directory of Istio YAML —
// normalizes them into etcd, and relays every
// committed change to NATS JetStream for the pushers. Run several replicas:
// each source and the relay have one leader at a time, elected in etcd.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/cmd/internal/app"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"github.com/shardpilot/shardpilot/pkg/inject"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
)

func main() { cli.Main("ingester", run) }

// cluster is one --kubeconfig entry.
type cluster struct {
	id   string
	kube *rest.Config
}

// parseKubeconfigs reads "[<cluster-id>=]<path>" entries; the path
// "in-cluster" means the pod's own service account.
func parseKubeconfigs(list string) ([]cluster, error) {
	var out []cluster
	seen := map[string]bool{}
	for _, entry := range strings.Split(list, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, path, ok := strings.Cut(entry, "=")
		if !ok {
			id, path = "Kubernetes", entry
		}
		if seen[id] {
			return nil, fmt.Errorf("--kubeconfig: cluster ID %q is given twice; name each cluster: id=path", id)
		}
		seen[id] = true
		cfg, err := cli.KubeConfig(path)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig %s: %w", entry, err)
		}
		out = append(out, cluster{id: id, kube: cfg})
	}
	return out, nil
}

// parseEnsembles reads "<id>=<host:port>,<host:port>;<id>=..." entries.
func parseEnsembles(list string) ([]zookeeper.Config, error) {
	var out []zookeeper.Config
	seen := map[string]bool{}
	for _, entry := range strings.Split(list, ";") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		id, servers, ok := strings.Cut(entry, "=")
		if !ok || id == "" || servers == "" {
			return nil, fmt.Errorf("--zookeeper %q: want <id>=<host:port>[,<host:port>...], ensembles separated by ';'", entry)
		}
		if seen[id] {
			return nil, fmt.Errorf("--zookeeper: ensemble ID %q is given twice", id)
		}
		seen[id] = true
		var addrs []string
		for _, a := range strings.Split(servers, ",") {
			a = strings.TrimSpace(a)
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, fmt.Errorf("--zookeeper %s: server %q: want host:port", id, a)
			}
			addrs = append(addrs, a)
		}
		out = append(out, zookeeper.Config{Ensemble: id, Servers: addrs})
	}
	return out, nil
}

// paths splits a comma-separated list of ZooKeeper paths ("" is none).
func paths(list string) []string {
	out := []string{}
	for _, p := range strings.Split(list, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(ctx context.Context, args []string) error {
	var common cli.Common
	var remote cli.Remote
	var meshDir, meshNamespace, domainSuffix, kubeconfigs, nsSelector, leaderID, signingKeyFile string
	var leaderTTL, syncMax, zkSession time.Duration
	var ensembles, dubboRoots, curatorRoots, zkNamespace, zkHosts string
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("ingester", flag.ContinueOnError)
	common.Register(fs, ":15015")
	remote.Register(fs)
	fs.StringVar(&meshDir, "mesh-dir", "", "directory of Istio YAML to ingest")
	fs.StringVar(&signingKeyFile, "bus-signing-key-file", "", "PEM file of an ed25519 private key (openssl genpkey -algorithm ed25519) the relay signs every change event with; pushers given its public key (--bus-verify-key-file) refuse events without its signature, so that a NATS credential alone cannot forge config")
	fs.StringVar(&kubeconfigs, "kubeconfig", "", `Kubernetes clusters to watch: comma-separated "[<cluster-id>=]<path>", path "in-cluster" for the pod's own`)
	fs.StringVar(&ensembles, "zookeeper", "", `ZooKeeper ensembles to watch for Dubbo and Curator registrations: "<id>=<host:port>[,<host:port>...]", ensembles separated by ';'`)
	fs.StringVar(&dubboRoots, "zookeeper-dubbo-roots", "/dubbo", "comma-separated paths Dubbo registers under (one per registry group; empty: none)")
	fs.StringVar(&curatorRoots, "zookeeper-curator-roots", "/services", "comma-separated base paths of Curator service discovery (empty: none)")
	fs.StringVar(&zkNamespace, "zookeeper-namespace", "default", `namespace of a registered service whose provider names none (a "namespace" URL parameter, or Curator metadata)`)
	fs.StringVar(&zkHosts, "zookeeper-host-template", "{service}.{namespace}.svc.{domain}", "hostname of a registered service: {service} is the Dubbo interface (lowercased) or the Curator service name, {domain} the domain suffix")
	fs.DurationVar(&zkSession, "zookeeper-session-timeout", 10*time.Second, "ZooKeeper session timeout")
	parts := fs.Int("kube-namespace-parts", 1, "split each cluster's namespaces into this many parts (by a hash of their names), each a source with a leader election of its own, so that as many ingester replicas share one large cluster's ingest (each part's leader watches the cluster and writes its part's namespaces); a part takes over what the cluster's earlier parts wrote in its namespaces when the number changes")
	fs.StringVar(&nsSelector, "namespace-selector", "", "label selector for the namespaces in the mesh, like Istio's discoverySelectors (default all)")
	fs.StringVar(&domainSuffix, "domain-suffix", "cluster.local", "DNS suffix that completes short host names")
	fs.StringVar(&meshNamespace, "mesh-namespace", "istio-system", `namespace of the mesh's settings: the ConfigMap "istio" whose key "mesh" is Istio's MeshConfig (in a cluster, or as a document of --mesh-dir); the pushers apply what they act on and warn of the rest`)
	rootCerts := fs.Bool("root-cert-configmap", true, "publish the roots proxies trust (which the pushers holding the CA write to etcd) in every namespace of each cluster's mesh as Istio's ConfigMap istio-ca-root-cert (key root-cert.pem), as istiod does, for Istio's agents; off when istiod still writes it (a migration that keeps istiod's root)")
	var hook injectFlags
	hook.register(fs)
	fs.StringVar(&leaderID, "leader-id", host, "this replica's name in leader elections; empty runs without elections (one replica only)")
	fs.DurationVar(&syncMax, "sync-max-delay", 100*time.Millisecond, "longest a source change waits for its source to be quiet before it is synced (the quiet period is 10ms)")
	fs.DurationVar(&leaderTTL, "leader-ttl", 10*time.Second, "how long a crashed leader keeps its leadership before another replica takes over")
	if err := cli.Parse(fs, "shardpilot ingester: sources → etcd, and etcd → NATS JetStream.", args); err != nil {
		return err
	}
	clusters, err := parseKubeconfigs(kubeconfigs)
	if err != nil {
		return err
	}
	if *parts < 1 || *parts > 256 {
		return fmt.Errorf("--kube-namespace-parts %d: want 1 to 256", *parts)
	}
	zks, err := parseEnsembles(ensembles)
	if err != nil {
		return err
	}
	for i := range zks {
		zks[i].DubboRoots, zks[i].CuratorRoots, zks[i].SessionTimeout, zks[i].MaxDelay = paths(dubboRoots), paths(curatorRoots), zkSession, syncMax
		zks[i].Naming = zookeeper.Naming{HostTemplate: zkHosts, Namespace: zkNamespace, DomainSuffix: domainSuffix}
		if err := zks[i].Validate(); err != nil {
			return fmt.Errorf("--zookeeper %s: %w", zks[i].Ensemble, err)
		}
	}
	if meshDir == "" && len(clusters) == 0 && len(zks) == 0 {
		return errors.New("nothing to ingest: give --mesh-dir, --kubeconfig, --zookeeper or several")
	}
	selector, err := labels.Parse(nsSelector)
	if err != nil {
		return fmt.Errorf("--namespace-selector %q: %w", nsSelector, err)
	}
	busCfg := bus.Config{Stream: remote.Stream}
	if signingKeyFile != "" {
		if busCfg.Sign, err = cli.SigningKey("bus-signing-key-file", signingKeyFile); err != nil {
			return err
		}
	}
	if err := busCfg.Validate(); err != nil {
		return fmt.Errorf("--stream: %w", err)
	}
	if err := common.ApplyMemoryLimit(); err != nil {
		return err
	}
	if err := hook.validate(); err != nil {
		return err
	}
	log, err := telemetry.NewLogger(os.Stderr, common.LogLevel, common.LogFormat)
	if err != nil {
		return err
	}
	adminToken, err := common.AdminTokens(log)
	if err != nil {
		return err
	}
	conns, err := app.Connect(remote, "shardpilot-ingester", log)
	if err != nil {
		return err
	}
	defer conns.Close()
	adminLis, err := cli.Listen(log, "admin", "admin-addr", common.AdminAddr)
	if err != nil {
		return err
	}
	adminTLSLis, adminTLS, err := common.AdminTLS(log)
	if err != nil {
		adminLis.Close()
		return err
	}

	reg := telemetry.NewRegistry()
	serveHook, err := hook.start(log, reg)
	if err != nil {
		adminLis.Close()
		return err
	}
	ingestMetrics, err := ingest.NewMetrics(reg)
	if err != nil {
		return err
	}
	kubeMetrics, err := kube.NewMetrics(reg)
	if err != nil {
		return err
	}
	// Each source and the relay has its election; replicas spread them,
	// each leading its fair share, so that ingest scales past one leader.
	election := app.Election{ID: leaderID, TTL: leaderTTL, Share: &app.Share{Etcd: conns.Etcd, Role: "ingester", Every: leaderTTL / 2, Log: log}}
	ready := telemetry.NewReadiness()
	g, ctx := errgroup.WithContext(ctx)
	if meshDir != "" {
		if leaderID == "" {
			// Unelected, this replica syncs the directory itself; elected,
			// a follower has nothing to sync and is ready as it is.
			ready.Set("mesh directory synced", false)
		}
		g.Go(func() error {
			return app.Source{Etcd: conns.Etcd, MeshDir: meshDir, MeshNamespace: meshNamespace, DomainSuffix: domainSuffix, Election: election, MaxDelay: syncMax,
				Log: log, Metrics: ingestMetrics,
				OnSynced: func(ingest.Result) { ready.Set("mesh directory synced", true) }}.Run(ctx)
		})
	}
	for _, c := range clusters {
		if *rootCerts {
			g.Go(func() error {
				return app.RootCerts{Etcd: conns.Etcd, Cluster: c.id, Kube: c.kube, NamespaceSelector: selector, Election: election, Log: log}.Run(ctx)
			})
		}
		g.Go(func() error {
			return app.KubeSource{Etcd: conns.Etcd, Cluster: c.id, Kube: c.kube, MeshNamespace: meshNamespace, DomainSuffix: domainSuffix, MaxDelay: syncMax,
				NamespaceSelector: selector, Parts: *parts, Election: election, Log: log, Metrics: ingestMetrics, KubeMetrics: kubeMetrics}.Run(ctx)
		})
	}
	for _, z := range zks {
		g.Go(func() error {
			return app.ZooKeeperSource{Etcd: conns.Etcd, Config: z, Election: election, Log: log, Metrics: ingestMetrics}.Run(ctx)
		})
	}
	if serveHook != nil {
		g.Go(func() error { return serveHook(ctx) })
	}
	var rl atomic.Pointer[relay.Relay]
	ready.Check("relay following the store", func() bool { r := rl.Load(); return r == nil || r.Healthy() })
	g.Go(func() error {
		return app.Relay{Etcd: conns.Etcd, NATS: conns.NATS, Bus: busCfg, Election: election,
			Log: log, Registerer: reg, Started: func(r *relay.Relay) { rl.Store(r) }}.Run(ctx)
	})
	name := leaderID
	if name == "" {
		name = host
	}
	me := store.Member{Role: "ingester", Name: name, Admin: cli.Advertised(common.AdvertiseHost, adminLis), Started: time.Now()}
	if adminTLSLis != nil {
		me.AdminTLS = cli.Advertised(common.AdvertiseHost, adminTLSLis)
	}
	g.Go(func() error { return store.Announce(ctx, conns.Etcd, me, 0, log) })
	page := statuspage.New(statuspage.Config{Title: "ingester", Gatherer: reg, Rejected: app.Rejections(ingestMetrics)})
	g.Go(func() error { return page.Run(ctx) })
	g.Go(func() error {
		return (&telemetry.Admin{Listener: adminLis, TLSListener: adminTLSLis, TLS: adminTLS, Gatherer: reg, Ready: ready, Log: log, DebugToken: adminToken, Page: page,
			Debug: map[string]http.Handler{"/debug/problems": app.ProblemsHandler(ingestMetrics)}}).Run(ctx)
	})
	return g.Wait()
}

// injectFlags are the flags of the webhook that points new pods' Istio
// agents at their namespace's pushers.
type injectFlags struct{ addr, cert, key, address string }

func (f *injectFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.addr, "inject-addr", "", "address to serve the discovery-address webhook on (HTTPS, path "+inject.Path+"; Istio's injector uses :15017): the API server calls it for the new pods of the namespaces its MutatingWebhookConfiguration selects, and their Istio agents are pointed at --inject-discovery-address for ADS and certificates (empty: not served)")
	fs.StringVar(&f.cert, "inject-cert-file", "", "PEM certificate the webhook is served with (read again when it changes); the MutatingWebhookConfiguration's caBundle must verify it")
	fs.StringVar(&f.key, "inject-key-file", "", "PEM key of --inject-cert-file")
	fs.StringVar(&f.address, "inject-discovery-address", "", "the pushers' address new pods' Istio agents dial, {namespace} standing for the pod's namespace: a shard's Service of the namespace (<release>-xds-{namespace}.<release namespace>.svc:15012) or the pushers' (<release>-pusher.<release namespace>.svc:15012)")
}

func (f *injectFlags) validate() error {
	if f.addr == "" {
		if f.cert != "" || f.key != "" || f.address != "" {
			return errors.New("--inject-cert-file, --inject-key-file, --inject-discovery-address are for the webhook: give --inject-addr too")
		}
		return nil
	}
	if f.cert == "" || f.key == "" || f.address == "" {
		return errors.New("--inject-addr: give --inject-cert-file, --inject-key-file and --inject-discovery-address")
	}
	if _, err := inject.New(f.address, nil, nil); err != nil {
		return fmt.Errorf("--inject-discovery-address: %w", err)
	}
	return nil
}

// start listens for the webhook, when asked; serve answers until ctx ends.
func (f *injectFlags) start(log *slog.Logger, reg prometheus.Registerer) (serve func(context.Context) error, err error) {
	if f.addr == "" {
		return nil, nil
	}
	w, err := inject.New(f.address, log.With("part", "inject"), reg)
	if err != nil {
		return nil, fmt.Errorf("--inject-discovery-address: %w", err)
	}
	tc, err := identity.ServerTLS(f.cert, f.key, "", log)
	if err != nil {
		return nil, fmt.Errorf("--inject-cert-file, --inject-key-file: %w", err)
	}
	lis, err := cli.Listen(log, "discovery-address webhook", "inject-addr", f.addr)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return w.Serve(ctx, lis, tc) }, nil
}
