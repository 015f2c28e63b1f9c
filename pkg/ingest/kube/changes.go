package kube

import (
	"cmp"
	"maps"
	"sync"

	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"k8s.io/apimachinery/pkg/api/meta"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// changes are what changed in the cluster since the last sync began: a
// sync reads and writes only that.
type changes struct {
	services map[cache.ObjectName]bool // Services whose objects may have changed
	// istio: every Istio resource; istioObjects: those named (see
	// someIstioObjects).
	istio        bool
	istioObjects map[istioRef]bool
	// gatewayAPI: a Gateway API resource, or a Service or Namespace one
	// refers to.
	gatewayAPI bool
	// ingress: an Ingress or IngressClass, or a Service (an Ingress's
	// backend port, the gateway's addresses).
	ingress bool
	all     bool // something every object may depend on
}

// dirty collects changes from the informers' goroutines.
type dirty struct {
	mu sync.Mutex
	c  changes
}

func (d *dirty) service(ns, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.c.services == nil {
		d.c.services = map[cache.ObjectName]bool{}
	}
	d.c.services[cache.NewObjectName(ns, name)] = true
}

func (d *dirty) set(flag func(*changes)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	flag(&d.c)
}

// take returns the changes and starts over.
func (d *dirty) take() changes {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.c
	d.c = changes{}
	return c
}

// mark records what the change from old to cur (either nil) of kind may
// change, and reports whether that is anything.
func (s *Source) mark(kind string, w *watched, old, cur any) bool {
	switch kind {
	case "Service":
		if len(w.gatewayAPI) > 0 {
			s.dirty.set(func(c *changes) { c.gatewayAPI = true })
		}
		if w.ingresses != nil {
			s.dirty.set(func(c *changes) { c.ingress = true })
		}
		for _, o := range []any{old, cur} {
			if svc, ok := o.(*corev1.Service); ok {
				s.dirty.service(svc.Namespace, svc.Name)
			}
		}
	case "EndpointSlice":
		for _, o := range []any{old, cur} {
			if es, ok := o.(*discoveryv1.EndpointSlice); ok && es.Labels[discoveryv1.LabelServiceName] != "" {
				s.dirty.service(es.Namespace, es.Labels[discoveryv1.LabelServiceName])
			}
		}
	case "Pod":
		// A Pod gives its endpoints labels, a service account and a node.
		op, _ := old.(*corev1.Pod)
		cp, _ := cur.(*corev1.Pod)
		if op != nil && cp != nil && maps.Equal(op.Labels, cp.Labels) &&
			op.Spec.ServiceAccountName == cp.Spec.ServiceAccountName && op.Spec.NodeName == cp.Spec.NodeName {
			return false
		}
		p := cmp.Or(cp, op)
		if p == nil {
			return false
		}
		list, _ := w.slicesByPod.ByIndex(byPod, p.Namespace+"/"+p.Name)
		if len(list) == 0 {
			return false
		}
		for _, o := range list {
			if es, ok := o.(*discoveryv1.EndpointSlice); ok && es.Labels[discoveryv1.LabelServiceName] != "" {
				s.dirty.service(es.Namespace, es.Labels[discoveryv1.LabelServiceName])
			}
		}
	case "Node":
		// A Node gives the endpoints on it their locality.
		on, _ := old.(*corev1.Node)
		cn, _ := cur.(*corev1.Node)
		if on != nil && cn != nil && sameLabels(on.Labels, cn.Labels, labelRegion, labelZone, labelSubzone) {
			return false
		}
		s.dirty.set(func(c *changes) { c.all = true })
	case "Namespace":
		// Namespaces matter to a selector (the mesh's, a listener's), by
		// their labels.
		on, _ := old.(*corev1.Namespace)
		cn, _ := cur.(*corev1.Namespace)
		if on != nil && cn != nil && maps.Equal(on.Labels, cn.Labels) {
			return false
		}
		if len(w.gatewayAPI) > 0 {
			s.dirty.set(func(c *changes) { c.gatewayAPI = true })
		}
		if s.cfg.NamespaceSelector == nil || s.cfg.NamespaceSelector.Empty() {
			return len(w.gatewayAPI) > 0
		}
		s.dirty.set(func(c *changes) { c.all = true })
	case "Ingress", "IngressClass":
		if kind == "Ingress" && old != nil && cur != nil && !ingressSpecChanged(old, cur) {
			return false
		}
		s.dirty.set(func(c *changes) { c.ingress = true })
	default:
		if isGatewayKind(kind) {
			if old != nil && cur != nil && !specChanged(old, cur) {
				return false
			}
			s.dirty.set(func(c *changes) { c.gatewayAPI = true })
			break
		}
		// An Istio kind.
		ref, ok := refOf(kind, cmp.Or(cur, old))
		s.dirty.set(func(c *changes) {
			if !ok || kind == istio.KindConfigMap {
				c.istio = true
				return
			}
			if c.istioObjects == nil {
				c.istioObjects = map[istioRef]bool{}
			}
			c.istioObjects[ref] = true
		})
	}
	return true
}

func sameLabels(a, b map[string]string, keys ...string) bool {
	for _, k := range keys {
		if a[k] != b[k] {
			return false
		}
	}
	return true
}

// istioRef names an Istio resource.
type istioRef struct{ kind, namespace, name string }

func (r istioRef) location() string { return location(r.kind, r.namespace, r.name) }

// refOf names the Istio resource o (nil: none).
func refOf(kind string, o any) (istioRef, bool) {
	m, err := meta.Accessor(o)
	if o == nil || err != nil {
		return istioRef{}, false
	}
	return istioRef{kind, m.GetNamespace(), m.GetName()}, true
}

// joined says whether the resources of an Istio kind are normalized with
// others of their namespace: ServiceEntries and the WorkloadEntries whose
// endpoints they select. Every other kind but the mesh's ConfigMap
// normalizes by itself.
func joined(kind string) bool {
	return kind == istio.KindServiceEntry || kind == istio.KindWorkloadEntry
}
