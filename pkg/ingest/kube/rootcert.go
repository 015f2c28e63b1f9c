package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/pkg/store"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// The ConfigMap Istio's agents read the mesh's roots from, in their
// namespace, and its key.
const (
	RootCertConfigMap = "istio-ca-root-cert"
	RootCertKey       = "root-cert.pem"
)

// ignoredNamespaces never get the roots, as istiod leaves them out.
var ignoredNamespaces = []string{"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}

// RootCerts publishes the roots proxies trust (store.TrustKey, which the
// pushers write) as the ConfigMap istio-ca-root-cert in every namespace of
// the mesh, as istiod does: created in a new namespace, updated when the
// roots change, and put back when someone edits or deletes it. One
// replica runs it (under an election).
type RootCerts struct {
	Client kubernetes.Interface
	Store  *store.Store
	// NamespaceSelector selects the namespaces of the mesh (nil: all).
	NamespaceSelector labels.Selector
	// Retry is the pause before a failed write is tried again. Default 1s.
	Retry time.Duration
	Log   *slog.Logger

	mu    sync.Mutex
	roots string
	dirty map[string]bool // namespaces to look at; nil key set: all
	all   bool
	wake  chan struct{}
}

// Run publishes until ctx ends.
func (r *RootCerts) Run(ctx context.Context) error {
	if r.Client == nil || r.Store == nil {
		return errors.New("kube: root certificates: a Kubernetes client and etcd are required")
	}
	if r.Log == nil {
		r.Log = slog.New(slog.DiscardHandler)
	}
	r.wake, r.dirty = make(chan struct{}, 1), map[string]bool{}
	all := informers.NewSharedInformerFactoryWithOptions(r.Client, 0)
	maps := informers.NewSharedInformerFactoryWithOptions(r.Client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", RootCertConfigMap).String()
	}))
	nsInf, cmInf := all.Core().V1().Namespaces(), maps.Core().V1().ConfigMaps()
	mark := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if m, ok := o.(metav1.Object); ok {
			ns := m.GetNamespace()
			if _, isNS := o.(*corev1.Namespace); isNS {
				ns = m.GetName()
			}
			r.mark(ns)
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: mark, UpdateFunc: func(_, o any) { mark(o) }, DeleteFunc: mark}
	for _, inf := range []cache.SharedIndexInformer{nsInf.Informer(), cmInf.Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("kube: root certificates: %w", err)
		}
	}
	stop := make(chan struct{})
	defer func() { close(stop); all.Shutdown(); maps.Shutdown() }()
	all.Start(stop)
	maps.Start(stop)
	for _, f := range []informers.SharedInformerFactory{all, maps} {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				return fmt.Errorf("kube: root certificates: %v never synced: %w", typ, ctx.Err())
			}
		}
	}
	watched := make(chan error, 1)
	go func() { watched <- r.follow(ctx) }()
	retry := r.Retry
	if retry <= 0 {
		retry = time.Second
	}
	for {
		select {
		case <-ctx.Done():
			<-watched
			return nil
		case err := <-watched:
			return err
		case <-r.wake:
		}
		if failed := r.publish(ctx, nsInf.Lister(), cmInf.Lister()); len(failed) > 0 {
			for _, ns := range failed {
				r.mark(ns)
			}
			select {
			case <-ctx.Done():
			case <-time.After(retry):
			}
		}
	}
}

// follow keeps the roots current from the store.
func (r *RootCerts) follow(ctx context.Context) error {
	if err := r.Store.FollowValue(ctx, store.TrustKey, func(v []byte) { r.setRoots(string(v)) }); err != nil {
		return fmt.Errorf("kube: root certificates: %w", err)
	}
	return nil // the end of the run, not a failure
}

func (r *RootCerts) setRoots(roots string) {
	r.mu.Lock()
	changed := r.roots != roots
	r.roots = roots
	if changed {
		r.all = true
	}
	r.mu.Unlock()
	if changed {
		r.Log.Info("the mesh's roots changed; publishing them", "configmap", RootCertConfigMap)
		r.poke()
	}
}

func (r *RootCerts) mark(ns string) {
	r.mu.Lock()
	r.dirty[ns] = true
	r.mu.Unlock()
	r.poke()
}

func (r *RootCerts) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// publish writes the ConfigMap where it is missing or differs, in the
// namespaces marked since the last time, and returns those it failed in.
func (r *RootCerts) publish(ctx context.Context, nsl corelisters.NamespaceLister, cml corelisters.ConfigMapLister) []string {
	r.mu.Lock()
	roots, dirty, all := r.roots, r.dirty, r.all
	r.dirty, r.all = map[string]bool{}, false
	r.mu.Unlock()
	if roots == "" {
		return nil // the pushers have not published them yet
	}
	if all {
		list, _ := nsl.List(labels.Everything())
		for _, ns := range list {
			dirty[ns.Name] = true
		}
	}
	var failed []string
	for ns := range dirty {
		n, err := nsl.Get(ns)
		if err != nil || n.DeletionTimestamp != nil || slices.Contains(ignoredNamespaces, ns) ||
			r.NamespaceSelector != nil && !r.NamespaceSelector.Empty() && !r.NamespaceSelector.Matches(labels.Set(n.Labels)) {
			continue
		}
		if err := r.write(ctx, cml, ns, roots); err != nil {
			r.Log.Warn("cannot publish the mesh's roots", "namespace", ns, "configmap", RootCertConfigMap, "err", err)
			failed = append(failed, ns)
		}
	}
	return failed
}

func (r *RootCerts) write(ctx context.Context, cml corelisters.ConfigMapLister, ns, roots string) error {
	cms := r.Client.CoreV1().ConfigMaps(ns)
	cur, err := cml.ConfigMaps(ns).Get(RootCertConfigMap)
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: RootCertConfigMap,
			Labels: map[string]string{"istio.io/config": "true"}}, Data: map[string]string{RootCertKey: roots}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return errors.New("created meanwhile; looked at again")
		}
		return err
	}
	if err != nil {
		return err
	}
	if cur.Data[RootCertKey] == roots && len(cur.Data) == 1 {
		return nil
	}
	next := cur.DeepCopy()
	next.Data = map[string]string{RootCertKey: roots}
	_, err = cms.Update(ctx, next, metav1.UpdateOptions{})
	return err
}
