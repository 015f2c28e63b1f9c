package kube_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	"github.com/shardpilot/shardpilot/pkg/model"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// applyGatewayScenario creates the objects of a file of YAML documents,
// each namespace renamed to "<prefix>-<namespace>": the Namespaces and
// Services by the typed client (a Service's cluster IP left to the
// apiserver), the Gateway API kinds by the dynamic one.
func applyGatewayScenario(t *testing.T, kc *kubetest.Cluster, file, prefix string, namespaces ...string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	for _, ns := range namespaces {
		text = strings.NewReplacer("namespace: "+ns, "namespace: "+prefix+"-"+ns, "{name: "+ns+"}", "{name: "+prefix+"-"+ns+"}",
			"{name: "+ns+", ", "{name: "+prefix+"-"+ns+", ").Replace(text)
	}
	ctx := context.Background()
	for doc := range strings.SplitSeq(text, "\n---\n") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		switch u.GetKind() {
		case "Namespace":
			kc.CreateNamespace(t, u.GetName(), u.GetLabels())
		case "Service":
			var s corev1.Service
			if err := yaml.Unmarshal([]byte(doc), &s); err != nil {
				t.Fatal(err)
			}
			s.Spec.ClusterIP = ""
			if _, err := kc.Client.CoreV1().Services(s.Namespace).Create(ctx, &s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		default:
			_, err := kc.Dynamic.Resource(gatewayGVR(u.GetKind())).Namespace(u.GetNamespace()).Create(ctx, &u, metav1.CreateOptions{})
			if err != nil && !(apierrors.IsAlreadyExists(err) && u.GetNamespace() == "") {
				t.Fatalf("%s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
			}
		}
	}
}

func gatewayGVR(kind string) schema.GroupVersionResource {
	for _, r := range gatewayapi.Resources {
		if r.Kind == kind {
			return schema.GroupVersionResource{Group: gatewayapi.Group, Version: r.Version, Resource: r.Resource}
		}
	}
	panic("not a Gateway API kind: " + kind)
}

// conditionsOf reads conditions at a path of an object's status:
// "<type>=<status>/<reason>" each, sorted.
func conditionsOf(u *unstructured.Unstructured, path ...string) []string {
	list, _, _ := unstructured.NestedSlice(u.Object, path...)
	var out []string
	for _, c := range list {
		m, _ := c.(map[string]any)
		out = append(out, fmt.Sprintf("%v=%v/%v", m["type"], m["status"], m["reason"]))
	}
	slices.Sort(out)
	return out
}

// statusShows waits until a Gateway API object's status, as summed up by
// show, is want.
func statusShows(t *testing.T, kc *kubetest.Cluster, kind, ns, name, want string, show func(*unstructured.Unstructured) string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, kind+" "+ns+"/"+name+" shows "+want, func() (bool, string) {
		u, err := kc.Dynamic.Resource(gatewayGVR(kind)).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got := show(u)
		return got == want, got
	})
}

// parents sums up a route's parents' conditions, one line each.
func parents(u *unstructured.Unstructured) string {
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "parents")
	var out []string
	for _, p := range list {
		m, _ := p.(map[string]any)
		out = append(out, fmt.Sprint(m["controllerName"], " ", conditionsOf(&unstructured.Unstructured{Object: m}, "conditions")))
	}
	return strings.Join(out, "; ")
}

// TestGatewayAPIStatus applies an ingress Gateway with routes valid and
// invalid in every way to a real apiserver with the Gateway API's CRDs,
// and reads the statuses written back as kubectl shows them; then a
// ReferenceGrant is deleted and the route it allowed says so.
func TestGatewayAPIStatus(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallGatewayAPICRDs(t)
	_, cli := testutil.Etcd(t)
	p := kc.Namespace(t, nil)
	applyGatewayScenario(t, kc, "../gatewayapi/testdata/ingress.yaml", p, "infra", "shop", "blog")
	infra, shop, blog := p+"-infra", p+"-shop", p+"-blog"
	r := startSource(t, kc, cli, "c1", nil)

	statusShows(t, kc, "GatewayClass", "", "istio", "[Accepted=True/Accepted]", func(u *unstructured.Unstructured) string {
		return fmt.Sprint(conditionsOf(u, "status", "conditions"))
	})
	statusShows(t, kc, "Gateway", infra, "edge", "[Accepted=True/Accepted Programmed=True/Programmed] listeners "+
		"http:1 https:2 other-cert:0(RefNotPermitted) clash:0(ProtocolConflict) udp:0(UnsupportedProtocol) tls:1 tcp:1", func(u *unstructured.Unstructured) string {
		list, _, _ := unstructured.NestedSlice(u.Object, "status", "listeners")
		// A listener's conditions are summed up by the reasons of those
		// that are not healthy (Programmed follows the others).
		healthy := []string{"Accepted=True", "ResolvedRefs=True", "Conflicted=False", "Programmed=True", "Programmed=False"}
		var ls []string
		for _, l := range list {
			m, _ := l.(map[string]any)
			s := fmt.Sprintf("%v:%v", m["name"], m["attachedRoutes"])
			for _, c := range conditionsOf(&unstructured.Unstructured{Object: m}, "conditions") {
				if !slices.Contains(healthy, strings.Split(c, "/")[0]) {
					s += "(" + strings.Split(c, "/")[1] + ")"
				}
			}
			ls = append(ls, s)
		}
		return fmt.Sprint(conditionsOf(u, "status", "conditions"), " listeners ", strings.Join(ls, " "))
	})
	ok := gatewayapi.DefaultController + " [Accepted=True/Accepted ResolvedRefs=True/ResolvedRefs]"
	for _, c := range []struct{ ns, name, want string }{
		{infra, "web", ok},
		{shop, "cart", ok},
		{blog, "posts", gatewayapi.DefaultController + " [Accepted=False/NotAllowedByListeners ResolvedRefs=False/RefNotPermitted]"},
		{shop, "wrong-host", gatewayapi.DefaultController + " [Accepted=False/NoMatchingListenerHostname ResolvedRefs=True/ResolvedRefs]"},
		{shop, "refused", gatewayapi.DefaultController + " [Accepted=True/Accepted ResolvedRefs=False/RefNotPermitted]"},
		{infra, "lost", strings.Repeat("; "+gatewayapi.DefaultController+" [Accepted=False/NoMatchingParent ResolvedRefs=False/BackendNotFound]", 2)[2:]},
	} {
		statusShows(t, kc, "HTTPRoute", c.ns, c.name, c.want, parents)
	}
	for kind, name := range map[string]string{"TLSRoute": "secure", "TCPRoute": "db"} {
		statusShows(t, kc, kind, infra, name, ok, parents)
	}
	r.object(t, "/mesh/v1/routerules/"+shop+"/cart~httproute~gateway", "the accepted route is stored", func(o model.Object) (bool, string) {
		rr := o.(*meshv1.RouteRule)
		return slices.Equal(rr.Gateways, []string{infra + "/" + gatewayapi.ListenerGatewayName("edge", "https")}), fmt.Sprint(rr.Gateways)
	})
	r.object(t, "/mesh/v1/gateways/"+infra+"/"+gatewayapi.ListenerGatewayName("edge", "http"), "the HTTP listener is stored", nil)
	r.absent(t, "/mesh/v1/routerules/"+blog+"/posts~httproute~gateway", "the refused route is not stored")

	if err := kc.Dynamic.Resource(gatewayGVR("ReferenceGrant")).Namespace(infra).Delete(context.Background(), "shop-to-web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	statusShows(t, kc, "HTTPRoute", shop, "cart", gatewayapi.DefaultController+" [Accepted=True/Accepted ResolvedRefs=False/RefNotPermitted]", parents)
}
