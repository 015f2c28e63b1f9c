// Command ingester reads the mesh's sources — Kubernetes clusters,
// ZooKeeper registries (Dubbo, Curator) and a directory of Istio YAML —
// normalizes them into etcd, and relays every
// committed change to NATS JetStream for the pushers. Run several replicas:
// each source and the relay have one leader at a time, elected in etcd.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/internal/version"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"github.com/shardpilot/shardpilot/pkg/inject"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	clientv3 "go.etcd.io/etcd/client/v3"
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
// Unless read, the files are not read (each cluster's config is nil).
func parseKubeconfigs(list string, read bool) ([]cluster, error) {
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
		if path == "" {
			return nil, fmt.Errorf("--kubeconfig %s: no path", entry)
		}
		c := cluster{id: id}
		if read {
			cfg, err := cli.KubeConfig(path)
			if err != nil {
				return nil, fmt.Errorf("--kubeconfig %s: %w", entry, err)
			}
			c.kube = cfg
		}
		out = append(out, c)
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

// options are the ingester's flags.
type options struct {
	common                                                                                  cli.Common
	remote                                                                                  cli.Remote
	meshDir, meshNamespace, domainSuffix, kubeconfigs, nsSelector, leaderID, signingKeyFile string
	gatewayControllers                                                                      string
	leaderTTL, syncMax, zkSession, registrationGrace                                        time.Duration
	relayRepairAfter                                                                        time.Duration
	yamlMaxFile                                                                             int64
	ensembles, dubboRoots, curatorRoots, zkNamespace, zkHosts                               string
	hook                                                                                    injectFlags
	parts                                                                                   *int
	rootCerts                                                                               *bool
	registrationLimits                                                                      kube.RegistrationLimits
	kubeQPS                                                                                 float64
	kubeBurst                                                                               int
	// checkOnly validates the flags and exits (--check-flags).
	checkOnly bool
}

// register defines the flags on fs.
func (o *options) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	o.common.Register(fs, ":15015")
	o.remote.Register(fs)
	fs.StringVar(&o.meshDir, "mesh-dir", "", "directory of Istio YAML to ingest")
	fs.Int64Var(&o.yamlMaxFile, "yaml-max-file-size", yamldir.DefaultMaxFileSize, "largest file of --mesh-dir read, in bytes; a larger one is a problem that keeps what it held (a document is also refused when its aliases would expand it past 1,000,000 nodes or four times this size)")
	fs.StringVar(&o.signingKeyFile, "bus-signing-key-file", "", "PEM file of an ed25519 private key (openssl genpkey -algorithm ed25519) the relay signs every change event with; pushers given its public key (--bus-verify-key-file) refuse events without its signature, so that a NATS credential alone cannot forge config")
	fs.StringVar(&o.kubeconfigs, "kubeconfig", "", `Kubernetes clusters to watch: comma-separated "[<cluster-id>=]<path>", path "in-cluster" for the pod's own`)
	fs.StringVar(&o.ensembles, "zookeeper", "", `ZooKeeper ensembles to watch for Dubbo and Curator registrations: "<id>=<host:port>[,<host:port>...]", ensembles separated by ';'`)
	fs.StringVar(&o.dubboRoots, "zookeeper-dubbo-roots", "/dubbo", "comma-separated paths Dubbo registers under (one per registry group; empty: none)")
	fs.StringVar(&o.curatorRoots, "zookeeper-curator-roots", "/services", "comma-separated base paths of Curator service discovery (empty: none)")
	fs.StringVar(&o.zkNamespace, "zookeeper-namespace", "default", `namespace of a registered service whose provider names none (a "namespace" URL parameter, or Curator metadata)`)
	fs.StringVar(&o.zkHosts, "zookeeper-host-template", "{service}.{namespace}.svc.{domain}", "hostname of a registered service: {service} is the Dubbo interface (lowercased) or the Curator service name, {domain} the domain suffix")
	fs.DurationVar(&o.zkSession, "zookeeper-session-timeout", 10*time.Second, "ZooKeeper session timeout")
	o.parts = fs.Int("kube-namespace-parts", 1, "split each cluster's namespaces into this many parts (by a hash of their names), each a source with a leader election of its own, so that as many ingester replicas share one large cluster's ingest (each part's leader watches the cluster and writes its part's namespaces); a part takes over what the cluster's earlier parts wrote in its namespaces when the number changes")
	fs.StringVar(&o.gatewayControllers, "gateway-controllers", gatewayapi.DefaultController, "comma-separated controller names of the Gateway API GatewayClasses served (Istio's class istio names istio.io/gateway-controller); the first is written in the routes' statuses")
	fs.StringVar(&o.nsSelector, "namespace-selector", "", "label selector for the namespaces in the mesh, like Istio's discoverySelectors (default all)")
	fs.StringVar(&o.domainSuffix, "domain-suffix", "cluster.local", "DNS suffix that completes short host names")
	fs.StringVar(&o.meshNamespace, "mesh-namespace", "istio-system", `namespace of the mesh's settings: the ConfigMap "istio" whose key "mesh" is Istio's MeshConfig (in a cluster, or as a document of --mesh-dir); the pushers apply what they act on and warn of the rest`)
	o.rootCerts = fs.Bool("root-cert-configmap", true, "publish the roots proxies trust (which the pushers holding the CA write to etcd) in every namespace of each cluster's mesh as Istio's ConfigMap istio-ca-root-cert (key root-cert.pem), as istiod does, for Istio's agents; off when istiod still writes it (a migration that keeps istiod's root)")
	o.hook.register(fs)
	fs.StringVar(&o.leaderID, "leader-id", host, "this replica's name in leader elections; empty runs without elections (one replica only)")
	fs.DurationVar(&o.syncMax, "sync-max-delay", 100*time.Millisecond, "longest a source change waits for its source to be quiet before it is synced (the quiet period is 10ms)")
	fs.DurationVar(&o.registrationGrace, "registration-grace", 10*time.Second, "how long the WorkloadEntry of an auto-registered workload (an agent naming a WorkloadGroup) outlives its connection to the pushers, so that a reconnecting workload keeps it")
	fs.IntVar(&o.registrationLimits.PerIdentity, "max-registrations-per-identity", 1000, "auto-registered workloads one identity (a service account) may hold: past it a registration is refused with the reason, its stream ended")
	fs.IntVar(&o.registrationLimits.PerNamespace, "max-registrations-per-namespace", 5000, "auto-registered workloads one namespace may hold")
	fs.Float64Var(&o.registrationLimits.WritesPerSecond, "registration-writes-per-identity", 5, "requests to the API server a second one identity's registrations may make (writing a WorkloadEntry, marking it disconnected, removing it), after a burst of 20: a registration past them is written when its pusher repeats it, a disconnection is not marked and its removal waits, so that one identity's registrations cannot starve the others'")
	fs.Float64Var(&o.registrationLimits.NamespaceWritesPerSecond, "registration-writes-per-namespace", 20, "requests to the API server a second one namespace's registrations may make, after a burst of 80 (as --registration-writes-per-identity)")
	fs.Float64Var(&o.kubeQPS, "kube-qps", 80, "requests a second to each Kubernetes API server (client-go's rate limiter; istiod's default), after a burst of --kube-burst")
	fs.IntVar(&o.kubeBurst, "kube-burst", 160, "burst of requests to each Kubernetes API server")
	fs.DurationVar(&o.relayRepairAfter, "relay-repair-after", 30*time.Second, "how long the bus may refuse every publish before the relay starts a new history of the stream (a RESYNC every pusher obeys, fresh de-duplication ids) instead of retrying the same write")
	fs.DurationVar(&o.leaderTTL, "leader-ttl", 10*time.Second, "how long a crashed leader keeps its leadership before another replica takes over")
	fs.BoolVar(&o.checkOnly, "check-flags", false, "check the flags and their environment twins, as the ingester does before it starts, then exit (0: it would start; files are not read)")
}

// validated is what the flags say, checked.
type validated struct {
	clusters []cluster
	zks      []zookeeper.Config
	selector labels.Selector
	// gatewayControllers are the Gateway API controller names served.
	gatewayControllers []string
	bus                bus.Config
}

// validate checks the flags before anything starts.
func (o *options) validate() (v validated, err error) {
	v.clusters, err = parseKubeconfigs(o.kubeconfigs, !o.checkOnly)
	if err != nil {
		return v, err
	}
	if o.kubeQPS <= 0 || o.kubeBurst < 1 {
		return v, fmt.Errorf("--kube-qps %g, --kube-burst %d: want positive numbers", o.kubeQPS, o.kubeBurst)
	}
	for _, c := range v.clusters {
		if c.kube != nil {
			c.kube.QPS, c.kube.Burst = float32(o.kubeQPS), o.kubeBurst
		}
	}
	if l := o.registrationLimits; l.WritesPerSecond <= 0 || l.NamespaceWritesPerSecond <= 0 {
		return v, fmt.Errorf("--registration-writes-per-identity %g, --registration-writes-per-namespace %g: want positive numbers", l.WritesPerSecond, l.NamespaceWritesPerSecond)
	}
	if *o.parts < 1 || *o.parts > 256 {
		return v, fmt.Errorf("--kube-namespace-parts %d: want 1 to 256", *o.parts)
	}
	v.zks, err = parseEnsembles(o.ensembles)
	if err != nil {
		return v, err
	}
	for i := range v.zks {
		v.zks[i].DubboRoots, v.zks[i].CuratorRoots, v.zks[i].SessionTimeout, v.zks[i].MaxDelay = paths(o.dubboRoots), paths(o.curatorRoots), o.zkSession, o.syncMax
		v.zks[i].Naming = zookeeper.Naming{HostTemplate: o.zkHosts, Namespace: o.zkNamespace, DomainSuffix: o.domainSuffix}
		if err := v.zks[i].Validate(); err != nil {
			return v, fmt.Errorf("--zookeeper %s: %w", v.zks[i].Ensemble, err)
		}
	}
	if o.yamlMaxFile <= 0 {
		return v, fmt.Errorf("--yaml-max-file-size %d: want a positive number of bytes", o.yamlMaxFile)
	}
	if o.meshDir == "" && len(v.clusters) == 0 && len(v.zks) == 0 {
		return v, errors.New("nothing to ingest: give --mesh-dir, --kubeconfig, --zookeeper or several")
	}
	for c := range strings.SplitSeq(o.gatewayControllers, ",") {
		c = strings.TrimSpace(c)
		if c == "" || !strings.Contains(c, "/") {
			return v, fmt.Errorf("--gateway-controllers %q: each name is a domain and a path, such as istio.io/gateway-controller", o.gatewayControllers)
		}
		v.gatewayControllers = append(v.gatewayControllers, c)
	}
	v.selector, err = labels.Parse(o.nsSelector)
	if err != nil {
		return v, fmt.Errorf("--namespace-selector %q: %w", o.nsSelector, err)
	}
	v.bus = bus.Config{Stream: o.remote.Stream}
	if o.signingKeyFile != "" && !o.checkOnly {
		if v.bus.Sign, err = cli.SigningKey("bus-signing-key-file", o.signingKeyFile); err != nil {
			return v, err
		}
	}
	if err := v.bus.Validate(); err != nil {
		return v, fmt.Errorf("--stream: %w", err)
	}
	return v, o.hook.validate()
}

// startSources starts, in g, the sources of v: the mesh directory, each
// cluster (and its root certificates' ConfigMaps) and each ZooKeeper
// ensemble, each under its election.
func (o *options) startSources(ctx context.Context, g *errgroup.Group, v validated, etcd *clientv3.Client, registrations kube.Registrations, election app.Election, ready *telemetry.Readiness,
	log *slog.Logger, ingestReport *ingest.Report, kubeMetrics *kube.Metrics) {
	if o.meshDir != "" {
		if o.leaderID == "" {
			// Unelected, this replica syncs the directory itself; elected,
			// a follower has nothing to sync and is ready as it is.
			ready.Set("mesh directory synced", false)
		}
		g.Go(func() error {
			return app.Source{Etcd: etcd, MeshDir: o.meshDir, MaxFileSize: o.yamlMaxFile, MeshNamespace: o.meshNamespace, DomainSuffix: o.domainSuffix, Election: election, MaxDelay: o.syncMax,
				Log: log, Report: ingestReport,
				OnSynced: func(ingest.Result) { ready.Set("mesh directory synced", true) }}.Run(ctx)
		})
	}
	for _, c := range v.clusters {
		synced := "Kubernetes cluster " + c.id + " synced"
		var allSynced func()
		if o.leaderID == "" {
			// Unelected, this replica writes the cluster's state itself:
			// ready once it has, so that pushers started after it load
			// the mesh, not an empty store.
			ready.Set(synced, false)
			allSynced = func() { ready.Set(synced, true) }
		}
		if *o.rootCerts {
			g.Go(func() error {
				return app.RootCerts{Etcd: etcd, Cluster: c.id, Kube: c.kube, NamespaceSelector: v.selector, Election: election, Log: log}.Run(ctx)
			})
		}
		g.Go(func() error {
			return app.KubeSource{Etcd: etcd, Cluster: c.id, Kube: c.kube, MeshNamespace: o.meshNamespace, DomainSuffix: o.domainSuffix, MaxDelay: o.syncMax,
				NamespaceSelector: v.selector, Parts: *o.parts, Election: election, Log: log, Report: ingestReport, KubeMetrics: kubeMetrics,
				GatewayControllers: v.gatewayControllers, Registrations: registrations, RegistrationGrace: o.registrationGrace,
				RegistrationLimits: o.registrationLimits, OnAllSynced: allSynced}.Run(ctx)
		})
	}
	for _, z := range v.zks {
		g.Go(func() error {
			return app.ZooKeeperSource{Etcd: etcd, Config: z, Election: election, Log: log, Report: ingestReport}.Run(ctx)
		})
	}
}

func run(ctx context.Context, args []string) (err error) {
	var o options
	fs := flag.NewFlagSet("ingester", flag.ContinueOnError)
	o.register(fs)
	if err := cli.Parse(fs, "shardpilot ingester: sources → etcd, and etcd → NATS JetStream.", args); err != nil {
		return err
	}
	v, err := o.validate()
	if err != nil || o.checkOnly {
		return err
	}
	busCfg := v.bus
	log, adminToken, err := o.common.Start()
	if err != nil {
		return err
	}
	conns, err := app.Connect(o.remote, "shardpilot-ingester", log)
	if err != nil {
		return err
	}
	defer conns.Close()
	adminLis, err := cli.Listen(log, "admin", "admin-addr", o.common.AdminAddr)
	if err != nil {
		return err
	}
	adminTLSLis, adminTLS, err := o.common.AdminTLS(log)
	if err != nil {
		adminLis.Close()
		return err
	}
	defer func() {
		if err != nil { // the admin server closes them once it runs
			adminLis.Close()
			if adminTLSLis != nil {
				adminTLSLis.Close()
			}
		}
	}()

	reg := telemetry.NewRegistry(version.Collector())
	serveHook, err := o.hook.start(log, reg)
	if err != nil {
		return err
	}
	ingestReport, err := ingest.NewReport(reg)
	if err != nil {
		return err
	}
	kubeMetrics, err := kube.NewMetrics(reg)
	if err != nil {
		return err
	}
	// Each source and the relay has its election; replicas spread them,
	// each leading its fair share, so that ingest scales past one leader.
	election := app.Election{ID: o.leaderID, TTL: o.leaderTTL, Share: &app.Share{Etcd: conns.Etcd, Role: "ingester", Every: o.leaderTTL / 2, Log: log}}
	ready := telemetry.NewReadiness()
	rl, err := app.Relay{Etcd: conns.Etcd, NATS: conns.NATS, Bus: busCfg, Election: election, Log: log, Registerer: reg, RepairAfter: o.relayRepairAfter}.Build()
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	// The workloads the pushers register arrive over the bus: each
	// cluster's parts make the WorkloadEntries of their namespaces'.
	registrations := &bus.Registrations{NATS: conns.NATS, Log: log.With("part", "registrations")}
	o.startSources(ctx, g, v, conns.Etcd, registrations, election, ready, log, ingestReport, kubeMetrics)
	if serveHook != nil {
		g.Go(func() error { return serveHook(ctx) })
	}
	ready.Check("relay following the store", rl.Relay.Healthy)
	watchStore(ctx, g, ready, conns.Etcd, election)
	if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "shardpilot_ingester_leading",
		Help: "Elections (sources, the relay) this replica leads now (all it runs, without elections)."}, func() float64 { return float64(len(election.Share.Leading())) })); err != nil {
		return err
	}
	if err := reg.Register(election.Share.Collector()); err != nil {
		return err
	}
	g.Go(func() error { return rl.Run(ctx) })
	name := cmp.Or(o.leaderID, hostname())
	me := o.common.Member("ingester", name, nil, adminLis, adminTLSLis)
	g.Go(func() error { return store.Announce(ctx, conns.Etcd, me, 0, log) })
	page := statuspage.New(statuspage.Config{Title: "ingester", Version: version.String(), Gatherer: reg, Rejected: app.Rejections(ingestReport)})
	g.Go(func() error { return page.Run(ctx) })
	admin := &telemetry.Admin{Listener: adminLis, TLSListener: adminTLSLis, TLS: adminTLS, Gatherer: reg, Ready: ready, Log: log, DebugToken: adminToken,
		TokenOnLoopback: o.common.AdminTokenOnLoopback, Page: page, Debug: o.debugHandlers(conns, ingestReport)}
	g.Go(func() error { return admin.Run(ctx) })
	return g.Wait()
}

// watchStore probes the store and makes readiness say what it found: an
// ingester that cannot reach the store writes nothing, whatever it leads,
// and etcd out of space (its NOSPACE alarm) refuses every write.
func watchStore(ctx context.Context, g *errgroup.Group, ready *telemetry.Readiness, etcd *clientv3.Client, election app.Election) {
	var probe store.Probe
	g.Go(func() error { probe.Run(ctx, store.New(etcd), 2*time.Second); return nil })
	ready.Check("store reachable", probe.Reachable)
	ready.Check("store accepts writes (no etcd alarm)", probe.Writable)
	ready.Detail(func() string {
		leads := "leads: everything (no elections)"
		if election.ID != "" {
			leads = "leads: " + cmp.Or(strings.Join(election.Share.Leading(), ", "), "nothing")
		}
		if a := probe.Alarms(); a != "" {
			leads += "\netcd alarm: " + a + " (no write succeeds until it is disarmed)"
		}
		return leads
	})
}

// debugHandlers are the admin server's debug pages of the ingester.
func (o *options) debugHandlers(conns *app.Conns, report *ingest.Report) map[string]http.Handler {
	return map[string]http.Handler{"/debug/problems": app.ProblemsHandler(report),
		"/debug/security": telemetry.WeaknessHandler(func(ctx context.Context) []telemetry.Weakness {
			ws := o.common.Weaknesses(ctx, &o.remote, conns.NATS, conns.Etcd)
			if o.signingKeyFile == "" {
				ws = append(ws, telemetry.Weakness{Severity: telemetry.High, Setting: "--bus-signing-key-file (chart: nats.signing)",
					Risk: "change events are not signed: pushers cannot tell the relay's from those any NATS credential that may publish writes"})
			}
			return ws
		})}
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

// hostname is the host's name, "" when it has none.
func hostname() string {
	h, _ := os.Hostname()
	return h
}
