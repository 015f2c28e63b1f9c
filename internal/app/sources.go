package app

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// termStore is the store of the current leadership term.
type termStore struct{ cur atomic.Pointer[store.Store] }

var _ ingest.Store = (*termStore)(nil)

func (t *termStore) PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (bool, int64, error) {
	return t.cur.Load().PutAt(ctx, k, o, modRev)
}

func (t *termStore) DeleteAt(ctx context.Context, k model.Key, modRev int64) (bool, int64, error) {
	return t.cur.Load().DeleteAt(ctx, k, modRev)
}

func (t *termStore) WriteAll(ctx context.Context, writes []model.Stored) (bool, int64, []bool, error) {
	return t.cur.Load().WriteAll(ctx, writes)
}

func (t *termStore) List(ctx context.Context) ([]model.Stored, int64, []error, error) {
	return t.cur.Load().List(ctx)
}

func (t *termStore) Revision(ctx context.Context) (int64, error) {
	return t.cur.Load().Revision(ctx)
}

// Source runs the YAML-directory source into the store.
type Source struct {
	Etcd    *clientv3.Client
	MeshDir string
	// MaxFileSize is the largest YAML file read (default: yamldir's).
	MaxFileSize  int64
	DomainSuffix string
	// MeshNamespace is the namespace of the mesh's ConfigMap (see
	// istio.Options).
	MeshNamespace string
	// MaxDelay bounds how long a change waits for the directory to be
	// quiet (see ingest.Loop).
	MaxDelay time.Duration
	Election Election
	Log      *slog.Logger
	// Report may be nil (metrics unregistered, problems not kept).
	Report *ingest.Report
	// OnSynced is called after every sync.
	OnSynced func(ingest.Result)
}

// Run runs the source until ctx is done.
func (s Source) Run(ctx context.Context) error {
	const name = "yaml"
	term := &termStore{}
	syncer, err := ingest.NewSyncer(ingest.Config{Source: name, Store: term, Log: s.Log, Report: s.Report})
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
		Limits:    yamldir.Limits{MaxFileSize: s.MaxFileSize},
	})
	if err != nil {
		return err
	}
	return led(ctx, s.Etcd, s.Election, "source/"+name, s.Log, term, forgetting(s.Report, name, src.Run))
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
	// GatewayControllers are the Gateway API controller names served
	// (kube.Config).
	GatewayControllers []string
	// Parts, above 1, splits the cluster's namespaces into that many
	// parts (kube.PartOf), each a source and an election of its own, so
	// that several replicas share one cluster's ingest.
	Parts    int
	Election Election
	Log      *slog.Logger
	// Report may be nil (metrics unregistered, problems not kept).
	Report      *ingest.Report
	KubeMetrics *kube.Metrics
	OnSynced    func(ingest.Result)
	// OnAllSynced, when set, is called once every part this replica runs
	// has written the cluster's state once (an unelected replica runs
	// them all): what its readiness waits for.
	OnAllSynced func()
	// Registrations, RegistrationGrace and RegistrationLimits: see
	// kube.Config.
	Registrations      kube.Registrations
	RegistrationGrace  time.Duration
	RegistrationLimits kube.RegistrationLimits
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
	var unsynced atomic.Int32
	unsynced.Store(int32(parts))
	for part := range parts {
		name := kube.PartName(k.Cluster, part, parts)
		var first sync.Once
		onSynced := func(r ingest.Result) {
			if k.OnSynced != nil {
				k.OnSynced(r)
			}
			first.Do(func() {
				if unsynced.Add(-1) == 0 && k.OnAllSynced != nil {
					k.OnAllSynced()
				}
			})
		}
		term := &termStore{}
		// A part owns what the cluster's other sources (its parts before
		// the number of parts changed) wrote in its namespaces.
		adopts := func(source string, key model.Key) bool {
			return source != name && kube.SameCluster(source, k.Cluster) && kube.PartOf(key.Namespace, parts) == part
		}
		syncer, err := ingest.NewSyncer(ingest.Config{Source: name, Adopts: adopts, Store: term, Log: k.Log, Report: k.Report})
		if err != nil {
			return err
		}
		src, err := kube.New(kube.Config{
			Cluster: k.Cluster, Client: client, Dynamic: dyn, Syncer: syncer, Part: part, Parts: parts, Informers: shared,
			DomainSuffix: k.DomainSuffix, MeshNamespace: k.MeshNamespace, NamespaceSelector: k.NamespaceSelector, GatewayControllers: k.GatewayControllers,
			Log: k.Log.With("source", name), Metrics: k.KubeMetrics, OnSynced: onSynced, MaxDelay: k.MaxDelay,
			Registrations: k.Registrations, RegistrationGrace: k.RegistrationGrace, RegistrationLimits: k.RegistrationLimits,
		})
		if err != nil {
			return err
		}
		// Each part is an election of its own: the parts spread over the
		// replicas as the sources do.
		g.Go(func() error {
			return led(ctx, k.Etcd, k.Election, "source/"+name, k.Log, term, forgetting(k.Report, name, src.Run))
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
		return (&kube.RootCerts{Client: client, Store: store.New(r.Etcd), NamespaceSelector: r.NamespaceSelector, Log: r.Log.With("part", name)}).Run(ctx)
	})
}

// ZooKeeperSource runs the ZooKeeper source of one ensemble into the store.
type ZooKeeperSource struct {
	Etcd *clientv3.Client
	// Config is the source's configuration; its Syncer and Log are set here.
	Config   zookeeper.Config
	Election Election
	Log      *slog.Logger
	// Report may be nil (metrics unregistered, problems not kept).
	Report *ingest.Report
}

// Run watches the ensemble until ctx is done.
func (z ZooKeeperSource) Run(ctx context.Context) error {
	name := zookeeper.SourceName(z.Config.Ensemble)
	term := &termStore{}
	syncer, err := ingest.NewSyncer(ingest.Config{Source: name, Store: term, Log: z.Log, Report: z.Report})
	if err != nil {
		return err
	}
	cfg := z.Config
	cfg.Syncer, cfg.Log = syncer, z.Log.With("source", name)
	src, err := zookeeper.New(cfg)
	if err != nil {
		return err
	}
	return led(ctx, z.Etcd, z.Election, "source/"+name, z.Log, term, forgetting(z.Report, name, src.Run))
}
