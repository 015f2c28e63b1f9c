package kube

import (
	"context"
	"fmt"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// watchMeshConfig watches the mesh's ConfigMap (istio.MeshConfigName in
// Config.MeshNamespace) for the part that owns its namespace, whatever
// namespaces the mesh selects: one ConfigMap of one namespace, through an
// informer of its own whose handler watch registers. It returns what stops
// it.
func (s *Source) watchMeshConfig(ctx context.Context, w *watched, watch func(string, cache.SharedIndexInformer, cache.ResourceEventHandler) error,
	changed func()) (func(), error) {
	if PartOf(s.cfg.MeshNamespace, s.cfg.Parts) != s.cfg.Part {
		return func() {}, nil
	}
	mesh := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, 0, informers.WithNamespace(s.cfg.MeshNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", istio.MeshConfigName).String()
		}))
	cms := mesh.Core().V1().ConfigMaps()
	if err := watch(istio.KindConfigMap, cms.Informer(), s.handler(istio.KindConfigMap, w, changed)); err != nil {
		return nil, err
	}
	w.meshConfig = cms.Lister()
	stop := make(chan struct{})
	stopped := func() { close(stop); mesh.Shutdown() }
	mesh.Start(stop)
	for typ, ok := range mesh.WaitForCacheSync(ctx.Done()) {
		if !ok {
			stopped()
			return nil, fmt.Errorf("kube: %s: %v never synced: %w", s.cfg.Cluster, typ, ctx.Err())
		}
	}
	return stopped, nil
}

// meshConfigInput returns the mesh's ConfigMap as the normalizer reads
// it; false when this part does not watch it or it does not exist.
func (s *Source) meshConfigInput(w *watched, now time.Time, refs map[string]runtime.Object) (istio.Input, bool) {
	if w.meshConfig == nil {
		return istio.Input{}, false
	}
	cm, err := w.meshConfig.ConfigMaps(s.cfg.MeshNamespace).Get(istio.MeshConfigName)
	if err != nil {
		return istio.Input{}, false
	}
	loc := location(istio.KindConfigMap, cm.Namespace, cm.Name)
	refs[loc] = cm
	return istio.Input{Location: loc, SourceVersion: cm.ResourceVersion, ObservedAt: now,
		Resource: istio.Resource{APIVersion: "v1", Kind: istio.KindConfigMap, Data: cm.Data,
			Metadata: istio.Metadata{Name: cm.Name, Namespace: cm.Namespace, ResourceVersion: cm.ResourceVersion}}}, true
}
