package kube

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	networkinglisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// istioResources are the Istio networking and security resources watched,
// by kind (their group is istio.GroupOf the kind).
var istioResources = map[string]string{
	istio.KindServiceEntry:          "serviceentries",
	istio.KindWorkloadEntry:         "workloadentries",
	istio.KindVirtualService:        "virtualservices",
	istio.KindDestinationRule:       "destinationrules",
	istio.KindSidecar:               "sidecars",
	istio.KindGateway:               "gateways",
	istio.KindAuthorizationPolicy:   "authorizationpolicies",
	istio.KindPeerAuthentication:    "peerauthentications",
	istio.KindRequestAuthentication: "requestauthentications",
	istio.KindTelemetry:             "telemetries",
	istio.KindEnvoyFilter:           "envoyfilters",
	istio.KindWorkloadGroup:         "workloadgroups",
}

// Config configures a Source.
type Config struct {
	// Cluster identifies the cluster; it names the endpoint shard and the
	// source. Default "Kubernetes", as in Istio.
	Cluster string
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	Syncer  ingest.Writer
	// DomainSuffix completes Service host names. Default cluster.local.
	DomainSuffix string
	// MeshNamespace holds the mesh's settings, Istio's MeshConfig in the
	// ConfigMap istio (key mesh), read by the part that owns the namespace
	// whatever NamespaceSelector says. Default istio-system.
	MeshNamespace string
	// NamespaceSelector selects the namespaces in the mesh by their labels,
	// like Istio's discoverySelectors; nil selects all.
	NamespaceSelector labels.Selector
	// GatewayControllers are the controller names of the GatewayClasses
	// served (default Istio's, istio.io/gateway-controller); the first
	// names this controller in the routes' statuses.
	GatewayControllers []string
	// Parts, above 1, splits the cluster's namespaces into that many parts
	// (PartOf) and makes this source ingest part Part alone, under a name
	// of its own (PartName): each part may be led by another ingester
	// replica, so that one cluster's ingest scales past one leader.
	Part, Parts int
	// Informers, when set, are the cluster's informers shared with the
	// sources of its other parts in this process (nil: the source's own).
	Informers *Informers
	// Quiet is how long changes must stop before a sync. Default 0: a
	// change is synced at once, and what arrives during a sync is synced
	// together after it (see ingest.Loop).
	Quiet time.Duration
	// MaxDelay bounds how long a change waits for the quiet period. Default 100ms.
	MaxDelay time.Duration
	// Resync syncs even without changes, to repair drift. Default 5m.
	Resync time.Duration
	// RetryDelay is the pause before retrying a failed sync. Default 1s.
	RetryDelay time.Duration
	Log        *slog.Logger
	// Metrics are shared by the sources of a process (labelled by
	// cluster); nil keeps them unregistered.
	Metrics *Metrics
	// OnSynced, when set, is called after every successful sync.
	OnSynced func(ingest.Result)
	// Registrations, when set, are the registrations of workloads whose
	// agents connect naming a WorkloadGroup: the source makes their
	// WorkloadEntries in its part's namespaces (see registrar), and
	// removes each RegistrationGrace (default 10s, istiod's) after its
	// workload disconnected. Nil: WorkloadGroups are warned of.
	Registrations     Registrations
	RegistrationGrace time.Duration
	// RegistrationLimits bound what one identity and one namespace may
	// make the registrar write and hold.
	RegistrationLimits RegistrationLimits
}

// RegistrationLimits bound the registrations of one identity and of one
// namespace, so that one workload's credentials cannot starve the others'.
type RegistrationLimits struct {
	// PerIdentity and PerNamespace bound the entries held (connected, or
	// within their grace): past them a registration is refused with the
	// reason. Default 1,000 and 5,000.
	PerIdentity, PerNamespace int
	// WritesPerSecond and WriteBurst bound the requests to the API server
	// one identity's registrations make (writing an entry, marking it
	// disconnected, removing it); NamespaceWritesPerSecond and
	// NamespaceWriteBurst those of one namespace's. A registration past
	// them is left unanswered, and written when its pusher repeats it with
	// a heartbeat; a disconnection is not marked on the entry, and its
	// removal waits. Default 5 a second after 20, and 20 a second after
	// 80.
	WritesPerSecond, NamespaceWritesPerSecond float64
	WriteBurst, NamespaceWriteBurst           int
}

// withDefaults fills in the defaults.
func (l RegistrationLimits) withDefaults() RegistrationLimits {
	if l.PerIdentity == 0 {
		l.PerIdentity = 1000
	}
	if l.PerNamespace == 0 {
		l.PerNamespace = 5000
	}
	if l.WritesPerSecond == 0 {
		l.WritesPerSecond = 5
	}
	if l.WriteBurst == 0 {
		l.WriteBurst = 20
	}
	if l.NamespaceWritesPerSecond == 0 {
		l.NamespaceWritesPerSecond = 20
	}
	if l.NamespaceWriteBurst == 0 {
		l.NamespaceWriteBurst = 80
	}
	return l
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Client == nil || c.Dynamic == nil || c.Syncer == nil {
		return errors.New("kube: a client, a dynamic client and a syncer are required")
	}
	if c.Cluster == "" {
		c.Cluster = "Kubernetes"
	}
	if !model.ValidHostname(c.Cluster) && !dnsLabelish(c.Cluster) {
		return fmt.Errorf("kube: cluster ID %q: want letters, digits and dashes", c.Cluster)
	}
	if c.DomainSuffix == "" {
		c.DomainSuffix = "cluster.local"
	}
	if c.MeshNamespace == "" {
		c.MeshNamespace = "istio-system"
	}
	if c.Parts == 0 {
		c.Parts = 1
	}
	if c.Parts < 1 || c.Part < 0 || c.Part >= c.Parts {
		return fmt.Errorf("kube: part %d of %d: want 0 <= part < parts", c.Part, c.Parts)
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.RegistrationGrace == 0 {
		c.RegistrationGrace = 10 * time.Second
	}
	c.RegistrationLimits = c.RegistrationLimits.withDefaults()
	if l := c.RegistrationLimits; l.PerIdentity < 1 || l.PerNamespace < 1 || l.WritesPerSecond < 0 || l.WriteBurst < removeCost ||
		l.NamespaceWritesPerSecond < 0 || l.NamespaceWriteBurst < removeCost {
		return fmt.Errorf("kube: registration limits of %d per identity, %d per namespace, %g writes a second after %d per identity, %g after %d per namespace: want positive numbers, bursts of at least %d",
			l.PerIdentity, l.PerNamespace, l.WritesPerSecond, l.WriteBurst, l.NamespaceWritesPerSecond, l.NamespaceWriteBurst, removeCost)
	}
	return nil
}

func dnsLabelish(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return s != ""
}

// Source watches one Kubernetes cluster.
type Source struct {
	cfg     Config
	m       *Metrics
	emitted map[string]string // location → last problem reported as an Event
	dirty   dirty
	// statuses are the Gateway API statuses to write after the sync that
	// translated them (owned by the loop's goroutine).
	statuses []gatewayapi.Status
	// ingressStatus is what the last sync found the Ingresses' statuses
	// should show (owned like statuses).
	ingressStatus ingressStatus
	// decoded is each Istio object read as an istio.Resource, by
	// location, kept while its resourceVersion stays (owned like
	// statuses): a sync converts again only the objects that changed.
	decoded map[string]decodedResource
}

// decodedResource is an Istio object read as an istio.Resource, at a
// resourceVersion.
type decodedResource struct {
	version string
	r       istio.Resource
}

// Metrics are the Kubernetes source's metrics, labelled by cluster.
type Metrics struct {
	events        *prometheus.CounterVec
	registrations *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg (nil registers nothing).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_kube_watch_events_total",
		Help: "Kubernetes watch events received, by cluster and kind."}, []string{"cluster", "kind"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ingest_workload_registrations_total",
			Help: "WorkloadEntries of auto-registered workloads, by cluster and result: created, updated, removed, refused (no such WorkloadGroup, an identity it does not admit), failed (the API server's error)."},
			[]string{"cluster", "result"})}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.events, m.registrations} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("kube: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// New returns a Source.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := cfg.Metrics
	if m == nil {
		m, _ = NewMetrics(nil)
	}
	return &Source{cfg: cfg, m: m, emitted: map[string]string{}}, nil
}

// ObjectName is the store name of a cluster's Service: "<name>@<cluster>".
func ObjectName(service, cluster string) string { return service + "@" + cluster }

// SourceName is the name a cluster's objects carry as their origin source.
func SourceName(cluster string) string { return "kubernetes/" + cluster }

// PartName names the source of one part of a cluster's namespaces
// (SourceName when the cluster is one part): "kubernetes/<cluster>#<part>of<parts>",
// counting parts from 1.
func PartName(cluster string, part, parts int) string {
	if parts <= 1 {
		return SourceName(cluster)
	}
	return fmt.Sprintf("%s#%dof%d", SourceName(cluster), part+1, parts)
}

// SameCluster says whether a source name is a cluster's: its whole
// source or one of its parts.
func SameCluster(source, cluster string) bool {
	whole := SourceName(cluster)
	return source == whole || strings.HasPrefix(source, whole+"#")
}

// PartOf returns the part of a namespace when a cluster's namespaces are
// split into parts: FNV-1a of its name, modulo parts. A namespace keeps its
// part for as long as the number of parts stays.
func PartOf(namespace string, parts int) int {
	if parts <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(namespace))
	return int(h.Sum32() % uint32(parts))
}

// watched is what one run of the source reads from.
type watched struct {
	services   corelisters.ServiceLister
	slices     discoverylisters.EndpointSliceLister
	pods       corelisters.PodLister
	nodes      corelisters.NodeLister
	namespaces corelisters.NamespaceLister
	istio      map[string]cache.GenericLister // by kind
	gatewayAPI []*gatewayResource
	// meshConfig holds the mesh's ConfigMap, for the part that owns its
	// namespace (nil for the others; see watchMeshConfig).
	meshConfig corelisters.ConfigMapLister
	// slicesByPod finds the EndpointSlices naming a Pod (index byPod).
	slicesByPod cache.Indexer
	// ingresses and ingressClasses, for the part that serves Ingresses
	// (nil for the others; see watchIngress).
	ingresses      networkinglisters.IngressLister
	ingressClasses networkinglisters.IngressClassLister
}

func (w *watched) Pod(ns, name string) *corev1.Pod {
	p, err := w.pods.Pods(ns).Get(name)
	if err != nil {
		return nil
	}
	return p
}

func (w *watched) Node(name string) *corev1.Node {
	if name == "" {
		return nil
	}
	n, err := w.nodes.Get(name)
	if err != nil {
		return nil
	}
	return n
}

// Run watches the cluster and syncs until ctx is done.
func (s *Source) Run(ctx context.Context) error {
	t, err := s.build(ctx)
	if err != nil {
		return err
	}
	defer t.close()
	return t.run(ctx)
}

// term is one run of the source, built: the informers it shares, its
// handlers on them, what it reads and its sync loop. Nothing runs until
// run starts the informers.
type term struct {
	s       *Source
	factory informers.SharedInformerFactory
	dyn     dynamicinformer.DynamicSharedInformerFactory
	stop    <-chan struct{}
	w       *watched
	loop    *ingest.Loop
	served  map[string]servedResource
	closers []func() // in the order they run
}

// close removes the term's handlers and lets go of what it holds.
func (t *term) close() {
	for _, c := range t.closers {
		c()
	}
}

// build acquires the informers and adds the source's handlers. On an
// error it has let go of everything.
func (s *Source) build(ctx context.Context) (_ *term, err error) {
	shared := s.cfg.Informers
	if shared == nil {
		shared = NewInformers(s.cfg.Client, s.cfg.Dynamic)
	}
	factory, dyn, stop, release, err := shared.acquire()
	if err != nil {
		return nil, fmt.Errorf("kube: %s: index EndpointSlices: %w", s.cfg.Cluster, err)
	}
	t := &term{s: s, factory: factory, dyn: dyn, stop: stop, closers: []func(){release}}
	// The handlers are this source's: the informers may serve other
	// parts after it stops.
	var handlers []func()
	t.closers = append(t.closers, func() {
		for _, remove := range handlers {
			remove()
		}
	})
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	watch := func(kind string, inf cache.SharedIndexInformer, h cache.ResourceEventHandler) error {
		reg, err := inf.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("kube: %s: watch %s: %w", s.cfg.Cluster, kind, err)
		}
		handlers = append(handlers, func() { _ = inf.RemoveEventHandler(reg) })
		return nil
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	t.closers = append(t.closers, broadcaster.Shutdown)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.cfg.Client.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "shardpilot-ingester"})

	w := &watched{
		services:   factory.Core().V1().Services().Lister(),
		slices:     factory.Discovery().V1().EndpointSlices().Lister(),
		pods:       factory.Core().V1().Pods().Lister(),
		nodes:      factory.Core().V1().Nodes().Lister(),
		namespaces: factory.Core().V1().Namespaces().Lister(),
		istio:      map[string]cache.GenericLister{},
		gatewayAPI: s.gatewayAPIAvailable(),
	}
	t.w = w
	t.loop = ingest.NewLoop(ingest.Loop{
		Writer: s.cfg.Syncer,
		Quiet:  s.cfg.Quiet, MaxDelay: s.cfg.MaxDelay, Resync: s.cfg.Resync, RetryDelay: s.cfg.RetryDelay, Log: s.cfg.Log.With("cluster", s.cfg.Cluster),
		Sync: func(ctx context.Context, full bool) error { return s.sync(ctx, w, recorder, full) },
	})
	if err := s.watchAll(ctx, t, watch); err != nil {
		return nil, err
	}
	return t, nil
}

// watchAll adds the source's handlers to every informer it reads.
func (s *Source) watchAll(ctx context.Context, t *term, watch func(string, cache.SharedIndexInformer, cache.ResourceEventHandler) error) error {
	w, changed := t.w, t.loop.Changed
	slices := t.factory.Discovery().V1().EndpointSlices().Informer()
	w.slicesByPod = slices.GetIndexer()
	for kind, inf := range map[string]cache.SharedIndexInformer{
		"Service":       t.factory.Core().V1().Services().Informer(),
		"EndpointSlice": slices,
		"Pod":           t.factory.Core().V1().Pods().Informer(),
		"Node":          t.factory.Core().V1().Nodes().Informer(),
		"Namespace":     t.factory.Core().V1().Namespaces().Informer(),
	} {
		if err := watch(kind, inf, s.handler(kind, w, changed)); err != nil {
			return err
		}
	}
	t.served = s.istioAvailable()
	for kind, resource := range t.served {
		gi := t.dyn.ForResource(schema.GroupVersionResource{Group: istio.GroupOf(kind), Version: resource.version, Resource: resource.plural})
		if err := watch(kind, gi.Informer(), s.handler(kind, w, changed)); err != nil {
			return err
		}
		w.istio[kind] = gi.Lister()
	}
	if err := s.watchGatewayAPI(t.dyn, w, watch, changed); err != nil {
		return err
	}
	if err := s.watchIngress(t.factory, w, watch, changed); err != nil {
		return err
	}
	stopMesh, err := s.watchMeshConfig(ctx, w, watch, changed)
	if err != nil {
		return err
	}
	t.closers = append(t.closers, stopMesh)
	return nil
}

// run starts the informers, waits for their caches, and syncs until ctx
// is done.
func (t *term) run(ctx context.Context) error {
	s := t.s
	// Started by the first source, the informers run until the last
	// stops (Start starts only those not running yet).
	t.factory.Start(t.stop)
	t.dyn.Start(t.stop)
	for typ, ok := range t.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("kube: %s: %v never synced: %w", s.cfg.Cluster, typ, ctx.Err())
		}
	}
	for gvr, ok := range t.dyn.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("kube: %s: %v never synced: %w", s.cfg.Cluster, gvr, ctx.Err())
		}
	}
	s.cfg.Log.Info("kubernetes caches synced", "cluster", s.cfg.Cluster, "istio_kinds", len(t.w.istio))
	// Events before this point are in the first sync.
	return s.runSynced(ctx, t.loop, s.registrar(t.w, t.served))
}

// runSynced runs the sync loop, and the registrar of the part's
// workloads when there is one, once the caches are synced.
func (s *Source) runSynced(ctx context.Context, loop *ingest.Loop, reg *registrar) error {
	if reg == nil {
		return loop.Run(ctx)
	}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return loop.Run(ctx) })
	g.Go(func() error { return reg.run(ctx, s.cfg.Registrations) })
	return g.Wait()
}

// servedResource is an Istio resource as the cluster serves it: its plural
// and the version watched.
type servedResource struct{ plural, version string }

// istioAvailable returns the Istio resources the cluster serves, each at
// the first of its versions served (v1 where Istio serves it); a cluster
// without Istio's CRDs has only its Services.
func (s *Source) istioAvailable() map[string]servedResource {
	out := map[string]servedResource{}
	lists := map[string][]string{} // group/version: resources
	for kind, plural := range istioResources {
		for _, version := range istio.VersionsOf(kind) {
			gv := istio.GroupOf(kind) + "/" + version
			names, ok := lists[gv]
			if !ok {
				if list, err := s.cfg.Client.Discovery().ServerResourcesForGroupVersion(gv); err == nil {
					for _, r := range list.APIResources {
						names = append(names, r.Name)
					}
				}
				lists[gv] = names
			}
			if slices.Contains(names, plural) {
				out[kind] = servedResource{plural, version}
				break
			}
		}
		if _, ok := out[kind]; !ok {
			s.cfg.Log.Warn("an Istio CRD is not served; not watching it", "cluster", s.cfg.Cluster, "kind", kind, "group", istio.GroupOf(kind))
		}
	}
	return out
}

// handler marks what an event of kind may change and pokes the loop.
func (s *Source) handler(kind string, w *watched, changed func()) cache.ResourceEventHandler {
	mark := func(old, cur any) {
		s.m.events.WithLabelValues(s.cfg.Cluster, kind).Inc()
		if s.mark(kind, w, unwrap(old), unwrap(cur)) {
			changed()
		}
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { mark(nil, o) },
		UpdateFunc: func(old, cur any) { mark(old, cur) },
		DeleteFunc: func(o any) { mark(o, nil) },
	}
}

// unwrap returns the object a deletion's tombstone holds.
func unwrap(o any) any {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return o
}

// byPod indexes EndpointSlices by the Pods their endpoints name, so that a
// Pod's change finds its Services.
const byPod = "pod"

func slicePods(o any) ([]string, error) {
	es, ok := o.(*discoveryv1.EndpointSlice)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, e := range es.Endpoints {
		if r := e.TargetRef; r != nil && r.Kind == "Pod" {
			out = append(out, cmp.Or(r.Namespace, es.Namespace)+"/"+r.Name)
		}
	}
	return out, nil
}

// stripManagedFields drops what the source never reads from the cached
// objects, which matters with a Pod per endpoint.
func stripManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}

// sync syncs the whole cluster when full or when something every object
// may depend on changed, else only what changed since the last sync.
func (s *Source) sync(ctx context.Context, w *watched, recorder record.EventRecorder, full bool) error {
	d := s.dirty.take()
	if full {
		s.cfg.Syncer.Forget()
	}
	now := time.Now()
	var (
		res   ingest.Result
		err   error
		objs  []ingest.Object
		refs  = map[string]runtime.Object{}
		level = slog.LevelDebug
	)
	if full || d.all {
		var problems []ingest.Problem
		objs, problems = s.snapshot(w, now, refs)
		res, err = s.cfg.Syncer.Sync(ctx, objs, problems)
		level = slog.LevelInfo
	} else {
		covered, problems := s.part(w, d, now, refs, &objs)
		res, err = s.cfg.Syncer.SyncPart(ctx, covered, objs, problems)
	}
	if err != nil {
		return err
	}
	s.report(res.Problems, refs, recorder)
	s.writeStatuses(ctx, w, s.controller())
	s.writeIngressStatuses(ctx)
	s.cfg.Log.Log(ctx, level, "cluster synced", "cluster", s.cfg.Cluster, "full", full || d.all, "objects", len(objs),
		"written", res.Written, "deleted", res.Deleted, "unchanged", res.Unchanged, "problems", len(res.Problems))
	if s.cfg.OnSynced != nil {
		s.cfg.OnSynced(res)
	}
	return nil
}

// part normalizes what changed into objs, and returns the
// locations that covers and the problems found.
func (s *Source) part(w *watched, d changes, now time.Time, refs map[string]runtime.Object, objs *[]ingest.Object) ([]string, []ingest.Problem) {
	selected := s.namespaceFilter(w)
	var covered []string
	var problems []ingest.Problem
	for id := range d.services {
		covered = append(covered, location("Service", id.Namespace, id.Name))
		svc, err := w.services.Services(id.Namespace).Get(id.Name)
		if err != nil || !selected(svc.Namespace) {
			continue // gone: its objects go
		}
		more, p := s.service(w, svc, now, refs)
		*objs = append(*objs, more...)
		problems = append(problems, p...)
	}
	if d.istio {
		for kind := range istioResources {
			covered = append(covered, kind)
		}
		covered = append(covered, istio.KindConfigMap)
		more, p := s.istioObjects(w, selected, now, refs)
		*objs = append(*objs, more...)
		problems = append(problems, p...)
	} else if len(d.istioObjects) > 0 {
		more, locs, p := s.someIstioObjects(w, selected, d.istioObjects, now, refs)
		covered = append(covered, locs...)
		*objs = append(*objs, more...)
		problems = append(problems, p...)
	}
	if d.gatewayAPI && len(w.gatewayAPI) > 0 {
		covered = append(covered, gatewayKinds()...)
		more, p := s.gatewayObjects(w, s.meshFilter(w), now, refs)
		*objs = append(*objs, more...)
		problems = append(problems, p...)
	}
	if (d.ingress || d.istio) && w.ingresses != nil {
		covered = append(covered, "Ingress")
		more, p := s.ingressObjects(w, s.meshFilter(w), now, refs)
		*objs = append(*objs, more...)
		problems = append(problems, p...)
	}
	return covered, problems
}

// report puts a Warning Event on every object with a new problem.
func (s *Source) report(problems []ingest.Problem, refs map[string]runtime.Object, recorder record.EventRecorder) {
	now := map[string]string{}
	for _, p := range problems {
		msg := p.Reason
		if p.Field != "" {
			msg = p.Field + ": " + p.Reason
		}
		now[p.Location] = msg
		if s.emitted[p.Location] == msg {
			continue
		}
		if obj := refs[p.Location]; obj != nil {
			recorder.Event(obj, corev1.EventTypeWarning, "Rejected", "shardpilot: "+msg)
		}
	}
	s.emitted = now
}

// location names an object in problems and origins.
func location(kind, ns, name string) string { return kind + " " + ns + "/" + name }

// snapshot normalizes everything the caches hold in the selected
// namespaces. refs maps each location to its object, for Events.
func (s *Source) snapshot(w *watched, now time.Time, refs map[string]runtime.Object) ([]ingest.Object, []ingest.Problem) {
	selected := s.namespaceFilter(w)
	var objs []ingest.Object
	var problems []ingest.Problem
	services, _ := w.services.List(labels.Everything())
	for _, svc := range services {
		if !selected(svc.Namespace) {
			continue
		}
		more, p := s.service(w, svc, now, refs)
		objs = append(objs, more...)
		problems = append(problems, p...)
	}
	more, p := s.istioObjects(w, selected, now, refs)
	objs, problems = append(objs, more...), append(problems, p...)
	more, p = s.gatewayObjects(w, s.meshFilter(w), now, refs)
	objs, problems = append(objs, more...), append(problems, p...)
	more, p = s.ingressObjects(w, s.meshFilter(w), now, refs)
	return append(objs, more...), append(problems, p...)
}

// service normalizes a Service and its endpoints.
func (s *Source) service(w *watched, svc *corev1.Service, now time.Time, refs map[string]runtime.Object) ([]ingest.Object, []ingest.Problem) {
	loc := location("Service", svc.Namespace, svc.Name)
	refs[loc] = svc
	spec, err := ConvertService(svc, s.cfg.DomainSuffix)
	if err != nil {
		p := ingest.Problem{Location: loc, Resource: loc, Reason: err.Error(), KeepLocation: loc}
		var fe *model.FieldError
		if errors.As(err, &fe) {
			p.Field, p.Reason = fe.Field, fe.Reason
		}
		return nil, []ingest.Problem{p}
	}
	// Each cluster's Service is its own object: the same Service in two
	// clusters is one host whose endpoints the pusher merges.
	name := ObjectName(svc.Name, s.cfg.Cluster)
	key := model.Key{Kind: model.KindService, Namespace: svc.Namespace, Name: name}
	origin := func() *meshv1.Origin {
		return &meshv1.Origin{SourceVersion: svc.ResourceVersion, ObservedAt: timestamppb.New(now), Location: loc}
	}
	spec.Origin = origin()
	objs := []ingest.Object{{Key: key, Object: spec, Resource: loc}}
	slices, _ := w.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	eps := ConvertEndpoints(svc, slices, w)
	if svc.Spec.Type == corev1.ServiceTypeExternalName && svc.Spec.ExternalName != "" {
		// A DNS service: its clusters resolve the external name.
		eps = []*meshv1.Endpoint{{Address: svc.Spec.ExternalName}}
	}
	if len(eps) > 0 {
		objs = append(objs, ingest.Object{
			Key:      model.Key{Kind: model.KindEndpoints, Namespace: svc.Namespace, Name: model.EndpointsName(name, s.cfg.Cluster)},
			Object:   &meshv1.Endpoints{Origin: origin(), Service: name, Shard: s.cfg.Cluster, Endpoints: eps},
			Resource: loc,
		})
	}
	return objs, nil
}

// istioObjects normalizes the Istio resources in the selected namespaces.
func (s *Source) istioObjects(w *watched, selected func(string) bool, now time.Time, refs map[string]runtime.Object) ([]ingest.Object, []ingest.Problem) {
	var problems []ingest.Problem
	var inputs []istio.Input
	decoded := make(map[string]decodedResource, len(s.decoded))
	for kind, lister := range w.istio {
		list, _ := lister.List(labels.Everything())
		for _, o := range list {
			u, ok := o.(*unstructured.Unstructured)
			if !ok || !selected(u.GetNamespace()) {
				continue
			}
			in, d, problem := s.istioInput(kind, u, now, refs)
			if problem != nil {
				problems = append(problems, *problem)
				continue
			}
			decoded[in.Location] = d
			inputs = append(inputs, in)
		}
	}
	s.decoded = decoded
	if in, ok := s.meshConfigInput(w, now, refs); ok {
		inputs = append(inputs, in)
	}
	objs, more := s.normalize(inputs)
	return objs, append(problems, more...)
}

// someIstioObjects normalizes the named Istio resources, and returns the
// locations that covers: each resource by itself, but ServiceEntries and
// WorkloadEntries, which are normalized with every other of their
// namespace (see joined). Resources gone, or in namespaces not selected,
// are left out. At 200 services, normalizing every Istio resource again at
// each change was most of what the ingester did.
func (s *Source) someIstioObjects(w *watched, selected func(string) bool, named map[istioRef]bool, now time.Time, refs map[string]runtime.Object) ([]ingest.Object, []string, []ingest.Problem) {
	if s.decoded == nil {
		s.decoded = map[string]decodedResource{}
	}
	read := maps.Clone(named)
	joins := map[string]bool{} // the namespaces whose joins are read again
	for ref := range named {
		if joined(ref.kind) && selected(ref.namespace) {
			joins[ref.namespace] = true
		}
	}
	for kind, lister := range w.istio {
		if !joined(kind) {
			continue
		}
		for ns := range joins {
			list, _ := lister.ByNamespace(ns).List(labels.Everything())
			for _, o := range list {
				if u, ok := o.(*unstructured.Unstructured); ok {
					read[istioRef{kind, u.GetNamespace(), u.GetName()}] = true
				}
			}
		}
	}
	var covered []string
	var problems []ingest.Problem
	var inputs []istio.Input
	for ref := range read {
		loc := ref.location()
		covered = append(covered, loc)
		var u *unstructured.Unstructured
		if lister := w.istio[ref.kind]; lister != nil && selected(ref.namespace) {
			o, _ := lister.ByNamespace(ref.namespace).Get(ref.name)
			u, _ = o.(*unstructured.Unstructured)
		}
		if u == nil {
			delete(s.decoded, loc) // gone: its objects go
			continue
		}
		in, d, problem := s.istioInput(ref.kind, u, now, refs)
		if problem != nil {
			delete(s.decoded, loc)
			problems = append(problems, *problem)
			continue
		}
		s.decoded[loc] = d
		inputs = append(inputs, in)
	}
	objs, more := s.normalize(inputs)
	return objs, covered, append(problems, more...)
}

// istioInput reads an Istio resource as the normalizer takes it, decoding
// it only when its version is not the one decoded last.
func (s *Source) istioInput(kind string, u *unstructured.Unstructured, now time.Time, refs map[string]runtime.Object) (istio.Input, decodedResource, *ingest.Problem) {
	loc := location(kind, u.GetNamespace(), u.GetName())
	refs[loc] = u
	version := u.GetResourceVersion()
	d, ok := s.decoded[loc]
	if !ok || version == "" || d.version != version {
		r, err := toResource(u)
		if err != nil {
			return istio.Input{}, d, &ingest.Problem{Location: loc, Resource: loc, Reason: err.Error(), KeepLocation: loc}
		}
		d = decodedResource{version, r}
	}
	return istio.Input{Resource: d.r, Location: loc, SourceVersion: version, ObservedAt: now}, d, nil
}

func (s *Source) normalize(inputs []istio.Input) ([]ingest.Object, []ingest.Problem) {
	return istio.Normalize(inputs, istio.Options{DomainSuffix: s.cfg.DomainSuffix, Shard: s.cfg.Cluster, MeshNamespace: s.cfg.MeshNamespace,
		Registration: s.cfg.Registrations != nil})
}

// toResource reads an Istio object as the normalizer takes it.
func toResource(u *unstructured.Unstructured) (istio.Resource, error) {
	var r istio.Resource
	raw, err := json.Marshal(u.Object)
	if err != nil {
		return r, err
	}
	err = json.Unmarshal(raw, &r)
	return r, err
}

// namespaceFilter returns whether a namespace is in the mesh and in this
// source's part.
func (s *Source) namespaceFilter(w *watched) func(string) bool {
	mine := func(ns string) bool { return PartOf(ns, s.cfg.Parts) == s.cfg.Part }
	inMesh := s.meshFilter(w)
	return func(ns string) bool { return inMesh(ns) && mine(ns) }
}

// meshFilter returns whether a namespace is in the mesh, whatever part.
func (s *Source) meshFilter(w *watched) func(string) bool {
	if s.cfg.NamespaceSelector == nil || s.cfg.NamespaceSelector.Empty() {
		return func(string) bool { return true }
	}
	selected := map[string]bool{}
	list, _ := w.namespaces.List(s.cfg.NamespaceSelector)
	for _, ns := range list {
		selected[ns.Name] = true
	}
	return func(ns string) bool { return selected[ns] }
}
