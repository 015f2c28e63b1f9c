package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	k8singress "github.com/shardpilot/shardpilot/pkg/ingest/ingress"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ingressGatewayService makes the mesh's ingress gateway Service
// (istio-system/istio-ingressgateway) with an external IP, whose address
// Ingresses of Istio's class show.
func ingressGatewayService(t *testing.T, kc *kubetest.Cluster) string {
	t.Helper()
	ctx := context.Background()
	if _, err := kc.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	const ip = "192.0.2.10"
	_, err := kc.Client.CoreV1().Services("istio-system").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "istio-ingressgateway"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"istio": "ingressgateway"}, ExternalIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http2", Port: 80}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return ip
}

// TestIngressServedAtTheGateway: a Kubernetes Ingress whose IngressClass
// is Istio's is served at the ingress gateway proxy (its route
// configuration routes the Ingress's host and paths to the backend
// Service, longest path first), shows the gateway's address in its
// status; an Ingress of another class is left alone.
func TestIngressServedAtTheGateway(t *testing.T) {
	kc := kubetest.Get(t)
	ns := kc.Namespace(t, nil)
	ctx := context.Background()
	ip := ingressGatewayService(t, kc)
	createService(t, kc, ns, "web", 8080)
	createService(t, kc, ns, "api", 9090)
	class := "istio-" + ns
	if _, err := kc.Client.NetworkingV1().IngressClasses().Create(ctx, &networkingv1.IngressClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: networkingv1.IngressClassSpec{Controller: k8singress.Controller},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kc.Client.NetworkingV1().IngressClasses().Delete(context.Background(), class, metav1.DeleteOptions{})
	})
	path := func(p string, typ networkingv1.PathType, svc string, port int32) networkingv1.HTTPIngressPath {
		return networkingv1.HTTPIngressPath{Path: p, PathType: &typ, Backend: networkingv1.IngressBackend{
			Service: &networkingv1.IngressServiceBackend{Name: svc, Port: networkingv1.ServiceBackendPort{Number: port}}}}
	}
	rules := []networkingv1.IngressRule{{Host: "web-" + ns + ".example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
		Paths: []networkingv1.HTTPIngressPath{path("/", networkingv1.PathTypePrefix, "web", 8080), path("/api", networkingv1.PathTypePrefix, "api", 9090)}}}}}
	for _, ing := range []*networkingv1.Ingress{
		{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: networkingv1.IngressSpec{IngressClassName: ptr.To(class), Rules: rules}},
		{ObjectMeta: metav1.ObjectMeta{Name: "other", Annotations: map[string]string{"kubernetes.io/ingress.class": "nginx"}},
			Spec: networkingv1.IngressSpec{Rules: []networkingv1.IngressRule{{Host: "other-" + ns + ".example.com",
				IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
					Paths: []networkingv1.HTTPIngressPath{path("/", networkingv1.PathTypePrefix, "web", 8080)}}}}}}},
	} {
		if _, err := kc.Client.NetworkingV1().Ingresses(ns).Create(ctx, ing, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	cp := NewCluster(t, Options{}, kubeSource("c1", kc.Config))
	ads, node := ingressRouter(t, cp.ads)
	routes := func() []*route.VirtualHost {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.RouteType, ResourceNames: []string{"http.80"}}); err != nil {
			return nil
		}
		resp, err := s.Recv()
		if err != nil || len(resp.Resources) != 1 {
			return nil
		}
		rc := &route.RouteConfiguration{}
		if resp.Resources[0].UnmarshalTo(rc) != nil {
			return nil
		}
		return rc.VirtualHosts
	}
	testutil.Eventually(t, 30*time.Second, "the gateway routes the Ingress's host, /api to api before / to web", func() (bool, string) {
		var got []string
		for _, vh := range routes() {
			if slices.Contains(vh.Domains, "other-"+ns+".example.com") {
				return false, "the other class's Ingress is served"
			}
			if !slices.Contains(vh.Domains, "web-"+ns+".example.com") {
				continue
			}
			for _, r := range vh.Routes {
				got = append(got, r.GetMatch().GetPrefix()+" "+r.GetRoute().GetCluster())
			}
		}
		want := []string{"/api outbound|9090||api." + ns + ".svc.cluster.local", "/ outbound|8080||web." + ns + ".svc.cluster.local"}
		return slices.Equal(got, want), fmt.Sprint(got)
	})
	testutil.Eventually(t, 20*time.Second, "the Ingress shows the gateway's address, the other none", func() (bool, string) {
		web, err := kc.Client.NetworkingV1().Ingresses(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		other, err := kc.Client.NetworkingV1().Ingresses(ns).Get(ctx, "other", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		lb := web.Status.LoadBalancer.Ingress
		return len(lb) == 1 && lb[0].IP == ip && len(other.Status.LoadBalancer.Ingress) == 0, fmt.Sprint(lb, other.Status.LoadBalancer.Ingress)
	})
}
