package ingress_test

import (
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/ingress"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func path(p string, typ *networkingv1.PathType, svc string, port networkingv1.ServiceBackendPort) networkingv1.HTTPIngressPath {
	return networkingv1.HTTPIngressPath{Path: p, PathType: typ, Backend: networkingv1.IngressBackend{
		Service: &networkingv1.IngressServiceBackend{Name: svc, Port: port}}}
}

func rule(host string, paths ...networkingv1.HTTPIngressPath) networkingv1.IngressRule {
	return networkingv1.IngressRule{Host: host, IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{Paths: paths}}}
}

// TestTranslate: the Ingresses of the class served (by annotation, by an
// IngressClass of Istio's controller) become a Gateway each and a
// VirtualService per host, as istiod makes them; an Ingress of no class
// is served in DEFAULT mode alone; what cannot be served is warned of.
// The normalized objects and problems are in testdata/translated.json.
func TestTranslate(t *testing.T) {
	prefix, exact, impl := ptr.To(networkingv1.PathTypePrefix), ptr.To(networkingv1.PathTypeExact), ptr.To(networkingv1.PathTypeImplementationSpecific)
	num := func(n int32) networkingv1.ServiceBackendPort { return networkingv1.ServiceBackendPort{Number: n} }
	older := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	in := ingress.Input{
		Classes: []*networkingv1.IngressClass{
			{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Spec: networkingv1.IngressClassSpec{Controller: ingress.Controller}},
			{ObjectMeta: metav1.ObjectMeta{Name: "nginx"}, Spec: networkingv1.IngressClassSpec{Controller: "k8s.io/ingress-nginx"}},
		},
		Services: []*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 8080}}}}},
		Ingresses: []*networkingv1.Ingress{
			{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", CreationTimestamp: older},
				Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("istio"),
					TLS: []networkingv1.IngressTLS{{Hosts: []string{"shop.example.com"}, SecretName: "shop-cert"}, {Hosts: []string{"x.example.com"}}},
					Rules: []networkingv1.IngressRule{
						rule("shop.example.com", path("/", prefix, "web", networkingv1.ServiceBackendPort{Name: "http"}),
							path("/cart", exact, "cart", num(80)), path("/static/*", impl, "static", num(80)),
							path("/x", prefix, "missing", networkingv1.ServiceBackendPort{Name: "nope"})),
					}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "api", Namespace: "api", Annotations: map[string]string{"kubernetes.io/ingress.class": "istio"}},
				Spec: networkingv1.IngressSpec{DefaultBackend: &networkingv1.IngressBackend{},
					Rules: []networkingv1.IngressRule{rule("shop.example.com", path("/api/v1", prefix, "api", num(9090))), rule("", path("", nil, "api", num(9090)))}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "nginx-one", Namespace: "shop"}, Spec: networkingv1.IngressSpec{IngressClassName: ptr.To("nginx"),
				Rules: []networkingv1.IngressRule{rule("n.example.com", path("/", prefix, "web", num(8080)))}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "classless", Namespace: "shop"},
				Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{rule("c.example.com", path("/", prefix, "web", num(8080)))}}},
		},
	}
	type result struct {
		Served   []string `json:"served"`
		Objects  []any    `json:"objects"`
		Problems []string `json:"problems"`
	}
	run := func(opts ingress.Options) result {
		out := ingress.Translate(in, opts, time.Time{})
		objs, problems := istio.Normalize(out.Inputs, istio.Options{})
		var r result
		for _, ing := range out.Served {
			r.Served = append(r.Served, ing.Namespace+"/"+ing.Name)
		}
		for _, o := range objs {
			r.Objects = append(r.Objects, map[string]any{"key": o.Key.String(), "object": golden.Proto(t, o.Object)})
		}
		for _, p := range append(out.Problems, problems...) {
			r.Problems = append(r.Problems, p.Error())
		}
		return r
	}
	golden.Check(t, "translated.json", golden.JSON(t, run(ingress.Options{})))
	if got := run(ingress.Options{Mode: "DEFAULT"}).Served; len(got) != 3 || got[2] != "shop/classless" {
		t.Errorf("DEFAULT mode serves %v, want the classless Ingress too", got)
	}
	if got := run(ingress.Options{Mode: "OFF"}).Served; len(got) != 1 || got[0] != "shop/web" {
		t.Errorf("OFF mode serves %v, want the IngressClass's alone (istiod's rule)", got)
	}
}
