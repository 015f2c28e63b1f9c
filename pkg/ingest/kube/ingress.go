package kube

import (
	"context"
	"slices"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/ingress"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	networkingv1 "k8s.io/api/networking/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Kubernetes Ingresses are read by the source of the part that owns the
// mesh's namespace, where the ingress gateway runs and the mesh's settings
// (the class served) are read; their handler kinds are "Ingress" and
// "IngressClass".

// watchesIngress reports whether this source serves the cluster's Ingresses.
func (s *Source) watchesIngress() bool { return PartOf(s.cfg.MeshNamespace, s.cfg.Parts) == s.cfg.Part }

// watchIngress watches Ingresses and IngressClasses.
func (s *Source) watchIngress(factory informers.SharedInformerFactory, w *watched,
	watch func(string, cache.SharedIndexInformer, cache.ResourceEventHandler) error, changed func()) error {
	if !s.watchesIngress() {
		return nil
	}
	ings, classes := factory.Networking().V1().Ingresses(), factory.Networking().V1().IngressClasses()
	if err := watch("Ingress", ings.Informer(), s.handler("Ingress", w, changed)); err != nil {
		return err
	}
	if err := watch("IngressClass", classes.Informer(), s.handler("IngressClass", w, changed)); err != nil {
		return err
	}
	w.ingresses, w.ingressClasses = ings.Lister(), classes.Lister()
	return nil
}

// ingressSpecChanged reports whether an Ingress update is more than its
// status (which this source writes).
func ingressSpecChanged(old, cur any) bool {
	o, ok1 := old.(*networkingv1.Ingress)
	c, ok2 := cur.(*networkingv1.Ingress)
	if !ok1 || !ok2 {
		return true
	}
	return !apiequality.Semantic.DeepEqual(o.Spec, c.Spec) || !apiequality.Semantic.DeepEqual(o.Annotations, c.Annotations)
}

// ingressOptions are the mesh's ingress settings, from its MeshConfig
// where this source reads it.
func (s *Source) ingressOptions(w *watched) ingress.Options {
	opts := ingress.Options{DomainSuffix: s.cfg.DomainSuffix, Namespace: s.cfg.MeshNamespace}
	if w.meshConfig == nil {
		return opts
	}
	cm, err := w.meshConfig.ConfigMaps(s.cfg.MeshNamespace).Get(istio.MeshConfigName)
	if err != nil {
		return opts
	}
	var mesh struct {
		IngressClass          string `json:"ingressClass"`
		IngressControllerMode string `json:"ingressControllerMode"`
		IngressSelector       string `json:"ingressSelector"`
		IngressService        string `json:"ingressService"`
	}
	raw, err := yaml.YAMLToJSON([]byte(cm.Data[istio.MeshConfigKey]))
	if err != nil || kjson.UnmarshalCaseSensitivePreserveInts(raw, &mesh) != nil {
		return opts // the normalizer reports the settings' problems
	}
	opts.Class, opts.Mode, opts.Service = mesh.IngressClass, mesh.IngressControllerMode, mesh.IngressService
	switch {
	case mesh.IngressSelector != "":
		opts.Selector = map[string]string{"istio": mesh.IngressSelector}
	case mesh.IngressService != "" && mesh.IngressService != "istio-ingressgateway":
		opts.Selector = map[string]string{"istio": mesh.IngressService}
	}
	return opts
}

// ingressObjects translates the Ingresses of the class served in the mesh's
// namespaces, and keeps the addresses their statuses should show.
func (s *Source) ingressObjects(w *watched, selected func(string) bool, now time.Time, refs map[string]runtime.Object) ([]ingest.Object, []ingest.Problem) {
	if w.ingresses == nil {
		return nil, nil
	}
	var in ingress.Input
	all, _ := w.ingresses.List(labels.Everything())
	for _, ing := range all {
		if selected(ing.Namespace) {
			in.Ingresses = append(in.Ingresses, ing)
			refs[ingress.Location(ing.Namespace, ing.Name)] = ing
		}
	}
	in.Classes, _ = w.ingressClasses.List(labels.Everything())
	in.Services, _ = w.services.List(labels.Everything())
	opts := s.ingressOptions(w).WithDefaults()
	out := ingress.Translate(in, opts, now)
	objs, problems := istio.Normalize(out.Inputs, istio.Options{DomainSuffix: s.cfg.DomainSuffix, Shard: s.cfg.Cluster, MeshNamespace: s.cfg.MeshNamespace})
	svc, _ := w.services.Services(opts.Namespace).Get(opts.Service)
	s.ingressStatus = ingressStatus{served: out.Served, addresses: ingress.Addresses(svc)}
	return objs, append(out.Problems, problems...)
}

// ingressStatus is what the served Ingresses' statuses should show.
type ingressStatus struct {
	served    []*networkingv1.Ingress
	addresses []networkingv1.IngressLoadBalancerIngress
}

// writeIngressStatuses writes the gateway's addresses into the status of
// each Ingress served where it differs; a write that fails is retried by
// the next sync.
func (s *Source) writeIngressStatuses(ctx context.Context) {
	st := s.ingressStatus
	s.ingressStatus = ingressStatus{}
	for _, ing := range st.served {
		if slices.EqualFunc(ing.Status.LoadBalancer.Ingress, st.addresses, func(a, b networkingv1.IngressLoadBalancerIngress) bool {
			return apiequality.Semantic.DeepEqual(a, b)
		}) {
			continue
		}
		c := ing.DeepCopy()
		c.Status.LoadBalancer.Ingress = st.addresses
		if _, err := s.cfg.Client.NetworkingV1().Ingresses(c.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			s.cfg.Log.Warn("cannot write an Ingress's status", "cluster", s.cfg.Cluster, "resource", ingress.Location(c.Namespace, c.Name), "err", err)
			s.dirty.set(func(c *changes) { c.ingress = true })
		}
	}
}
