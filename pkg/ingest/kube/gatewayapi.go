package kube

import (
	"context"
	"reflect"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// The Gateway API is read whole by the source of the cluster's first part:
// a route's attachment depends on Gateways and grants of other namespaces.
// Its handler kinds are the qualified kinds (gatewayapi.KindLocation), so
// that an Istio Gateway and a Gateway of this API are told apart.

// gatewayResource is a Gateway API resource the cluster serves.
type gatewayResource struct {
	kind   string
	gvr    schema.GroupVersionResource
	lister cache.GenericLister
}

// gatewayAPIAvailable returns the Gateway API resources the cluster
// serves, in the versions read; none when this source is not the first
// part's or the CRDs are not installed.
func (s *Source) gatewayAPIAvailable() []*gatewayResource {
	if s.cfg.Part != 0 {
		return nil
	}
	var out []*gatewayResource
	for _, r := range gatewayapi.Resources {
		list, err := s.cfg.Client.Discovery().ServerResourcesForGroupVersion(gatewayapi.Group + "/" + r.Version)
		if err != nil {
			continue
		}
		for _, ar := range list.APIResources {
			if ar.Name == r.Resource {
				out = append(out, &gatewayResource{kind: r.Kind, gvr: schema.GroupVersionResource{Group: gatewayapi.Group, Version: r.Version, Resource: r.Resource}})
			}
		}
	}
	if len(out) == 0 {
		s.cfg.Log.Info("Gateway API CRDs not served; not watching them", "cluster", s.cfg.Cluster)
	}
	return out
}

// watchGatewayAPI watches the Gateway API resources w holds (set from
// gatewayAPIAvailable before any handler runs: the handlers of shared
// informers may run at once, and read it).
func (s *Source) watchGatewayAPI(dyn dynamicinformer.DynamicSharedInformerFactory, w *watched,
	watch func(string, cache.SharedIndexInformer, cache.ResourceEventHandler) error, changed func()) error {
	for _, r := range w.gatewayAPI {
		gi := dyn.ForResource(r.gvr)
		r.lister = gi.Lister()
		if err := watch(gatewayapi.KindLocation(r.kind), gi.Informer(), s.handler(gatewayapi.KindLocation(r.kind), w, changed)); err != nil {
			return err
		}
	}
	return nil
}

// isGatewayKind reports whether a handler kind is a Gateway API kind.
func isGatewayKind(kind string) bool {
	for _, r := range gatewayapi.Resources {
		if kind == gatewayapi.KindLocation(r.Kind) {
			return true
		}
	}
	return false
}

// specChanged reports whether an update of a Gateway API resource is more
// than its status: the statuses written here come back as updates.
func specChanged(old, cur any) bool {
	o, ok1 := old.(*unstructured.Unstructured)
	c, ok2 := cur.(*unstructured.Unstructured)
	if !ok1 || !ok2 || o.GetGeneration() == 0 {
		return true
	}
	return o.GetGeneration() != c.GetGeneration() || !reflect.DeepEqual(o.GetLabels(), c.GetLabels())
}

// gatewayKinds are the locations the Gateway API resources cover.
func gatewayKinds() []string {
	out := make([]string, len(gatewayapi.Resources))
	for i, r := range gatewayapi.Resources {
		out[i] = gatewayapi.KindLocation(r.Kind)
	}
	return out
}

// gatewayObjects translates the Gateway API resources in the selected
// namespaces, and keeps the statuses to write after the sync.
func (s *Source) gatewayObjects(w *watched, selected func(string) bool, now time.Time, refs map[string]runtime.Object) ([]ingest.Object, []ingest.Problem) {
	if len(w.gatewayAPI) == 0 {
		return nil, nil
	}
	in := gatewayapi.Inputs{
		Service: func(ns, name string) *corev1.Service {
			svc, err := w.services.Services(ns).Get(name)
			if err != nil || !selected(ns) {
				return nil
			}
			return svc
		},
		Namespace: func(name string) (map[string]string, bool) {
			ns, err := w.namespaces.Get(name)
			if err != nil {
				return nil, false
			}
			return ns.Labels, true
		},
		GatewayServices: func(ns, gw string) []*corev1.Service {
			list, _ := w.services.Services(ns).List(labels.SelectorFromSet(labels.Set{gatewayapi.GatewayNameLabel: gw}))
			return list
		},
	}
	var problems []ingest.Problem
	for _, r := range w.gatewayAPI {
		list, _ := r.lister.List(labels.Everything())
		for _, o := range list {
			u, ok := o.(*unstructured.Unstructured)
			if !ok || (u.GetNamespace() != "" && !selected(u.GetNamespace())) {
				continue
			}
			loc := gatewayapi.Location(r.kind, u.GetNamespace(), u.GetName())
			refs[loc] = u
			if err := in.Add(u); err != nil {
				problems = append(problems, ingest.Problem{Location: loc, Resource: loc, Reason: err.Error()})
			}
		}
	}
	out := gatewayapi.Translate(in, gatewayapi.Options{DomainSuffix: s.cfg.DomainSuffix, ObservedAt: now, Controllers: s.cfg.GatewayControllers})
	s.statuses = out.Statuses
	return out.Objects, append(problems, out.Problems...)
}

// writeStatuses writes the statuses the last translation found, where they
// differ from what the resources show; a write that fails is retried by
// the next sync.
func (s *Source) writeStatuses(ctx context.Context, w *watched, controller string) {
	statuses := s.statuses
	s.statuses = nil
	for _, st := range statuses {
		r := w.gatewayResource(st.Kind)
		if r == nil {
			continue
		}
		var obj runtime.Object
		var err error
		if st.Namespace == "" {
			obj, err = r.lister.Get(st.Name)
		} else {
			obj, err = r.lister.ByNamespace(st.Namespace).Get(st.Name)
		}
		u, ok := obj.(*unstructured.Unstructured)
		if err != nil || !ok {
			continue // deleted since
		}
		next, changed := mergedStatus(u, st, controller)
		if !changed {
			continue
		}
		c := u.DeepCopy()
		c.Object["status"] = next
		if _, err := s.cfg.Dynamic.Resource(r.gvr).Namespace(st.Namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
			s.cfg.Log.Warn("cannot write a status", "cluster", s.cfg.Cluster, "resource", gatewayapi.Location(st.Kind, st.Namespace, st.Name), "err", err)
			s.dirty.set(func(c *changes) { c.gatewayAPI = true })
		}
	}
}

// controller is the controller name written in the routes' statuses.
func (s *Source) controller() string {
	if len(s.cfg.GatewayControllers) > 0 {
		return s.cfg.GatewayControllers[0]
	}
	return gatewayapi.DefaultController
}

func (w *watched) gatewayResource(kind string) *gatewayResource {
	for _, r := range w.gatewayAPI {
		if r.kind == kind {
			return r
		}
	}
	return nil
}

// mergedStatus returns the status a resource should show: the
// translation's, keeping a condition's transition time while its status
// holds and other controllers' route parents; and whether it differs from
// what the resource shows.
func mergedStatus(u *unstructured.Unstructured, st gatewayapi.Status, controller string) (map[string]any, bool) {
	var next any
	switch {
	case st.Class != nil:
		var old gwv1.GatewayClassStatus
		_ = fromStatus(u, &old)
		st.Class.Conditions = mergeConditions(old.Conditions, st.Class.Conditions)
		next = st.Class
	case st.Gateway != nil:
		var old gwv1.GatewayStatus
		_ = fromStatus(u, &old)
		st.Gateway.Conditions = mergeConditions(old.Conditions, st.Gateway.Conditions)
		for i, l := range st.Gateway.Listeners {
			var prev []metav1.Condition
			for _, ol := range old.Listeners {
				if ol.Name == l.Name {
					prev = ol.Conditions
				}
			}
			st.Gateway.Listeners[i].Conditions = mergeConditions(prev, l.Conditions)
		}
		next = st.Gateway
	default:
		var old gwv1.RouteStatus
		_ = fromStatus(u, &old)
		next = &gwv1.RouteStatus{Parents: mergeParents(old.Parents, st.Parents, controller)}
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(next)
	if err != nil {
		return nil, false
	}
	cur, _ := u.Object["status"].(map[string]any)
	return m, !equality.Semantic.DeepEqual(cur, m)
}

func fromStatus(u *unstructured.Unstructured, into any) error {
	st, ok := u.Object["status"].(map[string]any)
	if !ok {
		return nil
	}
	return runtime.DefaultUnstructuredConverter.FromUnstructured(st, into)
}

// mergeConditions returns want with the transition times of old's
// conditions whose status has not changed.
func mergeConditions(old, want []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, 0, len(want))
	for _, c := range want {
		if prev := meta.FindStatusCondition(old, c.Type); prev != nil && prev.Status == c.Status {
			c.LastTransitionTime = prev.LastTransitionTime
		} else {
			c.LastTransitionTime = metav1.Now()
		}
		out = append(out, c)
	}
	return out
}

// mergeParents returns the parents of other controllers, then ours.
func mergeParents(old, ours []gwv1.RouteParentStatus, controller string) []gwv1.RouteParentStatus {
	var out []gwv1.RouteParentStatus
	for _, p := range old {
		if string(p.ControllerName) != controller {
			out = append(out, p)
		}
	}
	for _, p := range ours {
		var prev []metav1.Condition
		for _, op := range old {
			if string(op.ControllerName) == controller && reflect.DeepEqual(op.ParentRef, p.ParentRef) {
				prev = op.Conditions
			}
		}
		p.Conditions = mergeConditions(prev, p.Conditions)
		out = append(out, p)
	}
	return out
}
