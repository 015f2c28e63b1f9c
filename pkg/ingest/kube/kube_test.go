package kube_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// running is a kube source syncing one cluster into a store.
type running struct {
	st     *store.Store
	cancel context.CancelFunc
	done   chan error
}

func startSource(t *testing.T, kc *kubetest.Cluster, cli *clientv3.Client, cluster string, cfg func(*kube.Config)) *running {
	t.Helper()
	st := store.New(cli)
	c := kube.Config{Cluster: cluster, Client: kc.Client, Dynamic: kc.Dynamic, Log: testutil.Log(t)}
	if cfg != nil {
		cfg(&c)
	}
	syncer, err := ingest.NewSyncer(ingest.Config{Source: kube.PartName(cluster, c.Part, c.Parts), Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	c.Syncer = syncer
	src, err := kube.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{st: st, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- src.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("source: %v", err)
		}
	})
	return r
}

// object waits until the store holds key in the shape check wants.
func (r *running) object(t *testing.T, key string, what string, check func(model.Object) (bool, string)) {
	t.Helper()
	k, err := model.ParseKey(key)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, what, func() (bool, string) {
		items, _, _, err := r.st.List(context.Background())
		if err != nil {
			return false, err.Error()
		}
		for _, it := range items {
			if it.Key == k {
				if check == nil {
					return true, ""
				}
				return check(it.Object)
			}
		}
		return false, key + " not in the store"
	})
}

// absent waits until the store no longer holds key.
func (r *running) absent(t *testing.T, key string, what string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, what, func() (bool, string) {
		items, _, _, err := r.st.List(context.Background())
		if err != nil {
			return false, err.Error()
		}
		for _, it := range items {
			if it.Key.String() == key {
				return false, key + " still in the store"
			}
		}
		return true, ""
	})
}

func istioObject(kind, version, ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": istio.GroupOf(kind) + "/" + version,
		"kind":       kind,
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       spec,
	}}
}

func gvr(kind string) schema.GroupVersionResource {
	plural := strings.ToLower(kind) + "s"
	if strings.HasSuffix(kind, "Entry") || strings.HasSuffix(kind, "Policy") || kind == "Telemetry" {
		plural = strings.ToLower(strings.TrimSuffix(kind, "y")) + "ies"
	}
	return schema.GroupVersionResource{Group: istio.GroupOf(kind), Version: "v1", Resource: plural}
}

func apply(t *testing.T, kc *kubetest.Cluster, u *unstructured.Unstructured) {
	t.Helper()
	g := gvr(u.GetKind())
	g.Version = strings.TrimPrefix(u.GetAPIVersion(), istio.GroupOf(u.GetKind())+"/")
	_, err := kc.Dynamic.Resource(g).Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// updateSpec replaces the spec of an Istio resource.
func updateSpec(t *testing.T, kc *kubetest.Cluster, ns, kind, name string, spec map[string]any) {
	t.Helper()
	res := kc.Dynamic.Resource(gvr(kind)).Namespace(ns)
	u, err := res.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"] = spec
	if _, err := res.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update %s %s: %v", kind, name, err)
	}
}

// deleteIstio deletes an Istio resource.
func deleteIstio(t *testing.T, kc *kubetest.Cluster, ns, kind, name string) {
	t.Helper()
	if err := kc.Dynamic.Resource(gvr(kind)).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete %s %s: %v", kind, name, err)
	}
}

// routeTo is a VirtualService's spec: host routed to itself, with a
// timeout.
func routeTo(host, timeout string) map[string]any {
	return map[string]any{"hosts": []any{host}, "http": []any{map[string]any{"timeout": timeout,
		"route": []any{map[string]any{"destination": map[string]any{"host": host}}}}}}
}

func endpoint(addr, pod, ns string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
	}
}

func TestKubernetesObjectsAreNormalized(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	_, cli := testutil.Etcd(t)
	ctx := context.Background()
	ns := kc.Namespace(t, nil)
	node := "node-" + ns

	slice := createWorkload(t, kc, ns, node)
	host := "reviews." + ns + ".svc.cluster.local"
	applyIstioKinds(t, kc, ns)

	r := startSource(t, kc, cli, "c1", nil)
	r.object(t, "/mesh/v1/services/"+ns+"/reviews@c1", "the Service is normalized", func(o model.Object) (bool, string) {
		s := o.(*meshv1.Service)
		got := fmt.Sprint(s.Hostnames, portSummary(s.Ports))
		want := fmt.Sprint([]string{host}, "http-web:9080:PROTOCOL_HTTP>8080 api:9090:PROTOCOL_GRPC>9090 metrics:9100:PROTOCOL_TCP>9100")
		return got == want, got
	})
	r.object(t, "/mesh/v1/endpoints/"+ns+"/reviews@c1/c1", "the EndpointSlice becomes the cluster's endpoints", func(o model.Object) (bool, string) {
		e := o.(*meshv1.Endpoints)
		var got []string
		for _, ep := range e.Endpoints {
			got = append(got, fmt.Sprintf("%s %s %s %s %s/%s %d", ep.Address, ep.Health, ep.Labels["version"], ep.ServiceAccount,
				ep.GetLocality().GetRegion(), ep.GetLocality().GetZone(), ep.Ports["http-web"]))
		}
		want := []string{
			"10.1.0.1 HEALTH_HEALTHY v1 reviews eu-west1/eu-west1-b 8080",
			"10.1.0.2 HEALTH_DRAINING   / 8080",
			"10.1.0.3 HEALTH_UNHEALTHY   / 8080",
		}
		return fmt.Sprint(got) == fmt.Sprint(want), fmt.Sprint(got)
	})
	r.object(t, "/mesh/v1/services/"+ns+"/payments", "the ServiceEntry is normalized", nil)
	r.object(t, "/mesh/v1/endpoints/"+ns+"/payments/c1", "the ServiceEntry's endpoints are the cluster's shard", nil)
	r.object(t, "/mesh/v1/routerules/"+ns+"/reviews", "the VirtualService is normalized", func(o model.Object) (bool, string) {
		rr := o.(*meshv1.RouteRule)
		return rr.Hosts[0] == host && rr.Http[0].Route[0].Destination.Host == host, fmt.Sprint(rr)
	})
	r.object(t, "/mesh/v1/trafficpolicies/"+ns+"/reviews", "the DestinationRule is normalized", nil)
	r.object(t, "/mesh/v1/scopes/"+ns+"/default", "the Sidecar is normalized", nil)
	r.object(t, "/mesh/v1/gateways/"+ns+"/ingress", "the Gateway is normalized", func(o model.Object) (bool, string) {
		g := o.(*meshv1.Gateway)
		return g.Selector["istio"] == "ingressgateway" && g.Servers[0].Port == 80, fmt.Sprint(g)
	})
	r.object(t, "/mesh/v1/telemetries/"+ns+"/logs", "the Telemetry is normalized", nil)
	r.object(t, "/mesh/v1/envoyfilters/"+ns+"/timeouts", "the EnvoyFilter (v1alpha3) is normalized", func(o model.Object) (bool, string) {
		e := o.(*meshv1.EnvoyFilter)
		return len(e.Patches) == 1 && e.Patches[0].Match.GetClusterService() == "reviews", fmt.Sprint(e)
	})
	r.object(t, "/mesh/v1/endpoints/"+ns+"/vms/c1", "the WorkloadEntry joins its ServiceEntry's endpoints", func(o model.Object) (bool, string) {
		e := o.(*meshv1.Endpoints)
		return len(e.Endpoints) == 1 && e.Endpoints[0].Address == "10.4.0.1" && e.Endpoints[0].GetLocality().GetZone() == "us-west1-a", fmt.Sprint(e)
	})

	podAndNodeFollowed(t, kc, r, ns, node)
	// A VirtualService naming a Service that does not exist yet is
	// written once the Service is.
	apply(t, kc, istioObject("VirtualService", "v1", ns, "ratings", map[string]any{
		"hosts": []any{"ratings"},
		"http":  []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": "ratings"}}}}},
	}))
	eventFor(t, kc, ns, "VirtualService", "ratings", "destination.host")
	if _, err := kc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "ratings"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.object(t, "/mesh/v1/routerules/"+ns+"/ratings", "a VirtualService waiting for its host is written with it", nil)

	// Updates and deletes propagate: a changed Istio object is read again
	// (a sync reads again only those whose resourceVersion moved).
	updateSpec(t, kc, ns, "VirtualService", "ratings", routeTo("ratings", "7s"))
	r.object(t, "/mesh/v1/routerules/"+ns+"/ratings", "a VirtualService's change is written", func(o model.Object) (bool, string) {
		rr := o.(*meshv1.RouteRule)
		return rr.Http[0].GetTimeout().AsDuration() == 7*time.Second, fmt.Sprint(rr)
	})
	slice.Endpoints = slice.Endpoints[:1]
	if _, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.object(t, "/mesh/v1/endpoints/"+ns+"/reviews@c1/c1", "an endpoint removed from the slice leaves", func(o model.Object) (bool, string) {
		return len(o.(*meshv1.Endpoints).Endpoints) == 1, fmt.Sprint(o)
	})
	deleteIstio(t, kc, ns, "VirtualService", "reviews")
	r.absent(t, "/mesh/v1/routerules/"+ns+"/reviews", "a deleted VirtualService leaves the store")
	if err := kc.Client.CoreV1().Services(ns).Delete(ctx, "reviews", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r.absent(t, "/mesh/v1/services/"+ns+"/reviews@c1", "a deleted Service leaves the store")
	r.absent(t, "/mesh/v1/endpoints/"+ns+"/reviews@c1/c1", "a deleted Service's endpoints leave the store")
}

// createWorkload creates a Node with a zone, a Pod on it, the reviews
// Service and its EndpointSlice, which it returns.
func createWorkload(t *testing.T, kc *kubetest.Cluster, ns, node string) *discoveryv1.EndpointSlice {
	t.Helper()
	ctx := context.Background()
	if _, err := kc.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
		Labels: map[string]string{"topology.kubernetes.io/region": "eu-west1", "topology.kubernetes.io/zone": "eu-west1-b"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews-1", Labels: map[string]string{"app": "reviews", "version": "v1"}},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "reviews",
			Containers: []corev1.Container{{Name: "app", Image: "reviews"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews", Labels: map[string]string{"app": "reviews"}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "http-web", Port: 9080, TargetPort: intstr.FromInt32(8080)},
			{Name: "api", Port: 9090, AppProtocol: ptr.To("grpc")},
			{Name: "metrics", Port: 9100},
			{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "reviews-abc", Labels: map[string]string{discoveryv1.LabelServiceName: "reviews"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{
			endpoint("10.1.0.1", "reviews-1", ns, true, true, false),
			endpoint("10.1.0.2", "reviews-2", ns, false, true, true),
			endpoint("10.1.0.3", "reviews-3", ns, false, false, false),
		},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http-web"), Port: ptr.To[int32](8080)}, {Name: ptr.To("api"), Port: ptr.To[int32](9090)}},
	}
	if _, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return slice
}

// podAndNodeFollowed: a Pod's labels and a Node's zone reach the
// endpoints on them.
func podAndNodeFollowed(t *testing.T, kc *kubetest.Cluster, r *running, ns, node string) {
	t.Helper()
	ctx := context.Background()
	pod, err := kc.Client.CoreV1().Pods(ns).Get(ctx, "reviews-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels["version"] = "v2"
	if _, err := kc.Client.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.object(t, "/mesh/v1/endpoints/"+ns+"/reviews@c1/c1", "a Pod's new labels reach its endpoint", func(o model.Object) (bool, string) {
		ep := o.(*meshv1.Endpoints).Endpoints[0]
		return ep.Labels["version"] == "v2", fmt.Sprint(ep)
	})
	n, err := kc.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels["topology.kubernetes.io/zone"] = "eu-west1-c"
	if _, err := kc.Client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.object(t, "/mesh/v1/endpoints/"+ns+"/reviews@c1/c1", "a Node's new zone reaches the endpoints on it", func(o model.Object) (bool, string) {
		ep := o.(*meshv1.Endpoints).Endpoints[0]
		return ep.GetLocality().GetZone() == "eu-west1-c", fmt.Sprint(ep)
	})
}

func portSummary(ps []*meshv1.Port) string {
	var out []string
	for _, p := range ps {
		s := fmt.Sprintf("%s:%d:%s", p.Name, p.Number, p.Protocol)
		if p.TargetPort != 0 {
			s += fmt.Sprintf(">%d", p.TargetPort)
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// eventFor waits for a Warning Event on the named object that mentions field.
func eventFor(t *testing.T, kc *kubetest.Cluster, ns, kind, name, field string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("an Event on %s %s naming %s", kind, name, field), func() (bool, string) {
		list, err := kc.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name {
				if e.Type == corev1.EventTypeWarning && strings.Contains(e.Message, field) {
					return true, ""
				}
				seen = append(seen, e.Message)
			}
		}
		return false, fmt.Sprint(seen)
	})
}

func TestInvalidObjectsGetEventsAndTheRestFlows(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	_, cli := testutil.Etcd(t)
	ctx := context.Background()
	ns := kc.Namespace(t, nil)

	// A Service with endpoints labelled version v1 only.
	if _, err := kc.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app-1", Labels: map[string]string{"app": "app", "version": "v1"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "app-1", Labels: map[string]string{discoveryv1.LabelServiceName: "app"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{endpoint("10.3.0.1", "app-1", ns, true, true, false)},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A headless Service may have no ports; the mesh cannot use it.
	if _, err := kc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "portless"},
		Spec:       corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	route := func(name string, match any, host string) {
		spec := map[string]any{"hosts": []any{"app"}, "http": []any{map[string]any{
			"route": []any{map[string]any{"destination": map[string]any{"host": host}}},
		}}}
		if match != nil {
			spec["http"].([]any)[0].(map[string]any)["match"] = []any{match}
		}
		apply(t, kc, istioObject("VirtualService", "v1", ns, name, spec))
	}
	route("bad-regex", map[string]any{"uri": map[string]any{"regex": "/(unclosed"}}, "app")
	route("unknown-host", nil, "nowhere.example.com")
	route("good", map[string]any{"uri": map[string]any{"prefix": "/ok"}}, "app")
	apply(t, kc, istioObject("DestinationRule", "v1", ns, "app", map[string]any{
		"host": "app", "subsets": []any{
			map[string]any{"name": "v1", "labels": map[string]any{"version": "v1"}},
			map[string]any{"name": "v2", "labels": map[string]any{"version": "v2"}},
		},
	}))

	r := startSource(t, kc, cli, "c1", nil)
	eventFor(t, kc, ns, "VirtualService", "bad-regex", "spec.http[0].match[0].uri.regex")
	eventFor(t, kc, ns, "VirtualService", "unknown-host", "spec.http[0].route[0].destination.host")
	eventFor(t, kc, ns, "DestinationRule", "app", "spec.subsets[1].labels")
	eventFor(t, kc, ns, "Service", "portless", "spec.ports")
	r.object(t, "/mesh/v1/routerules/"+ns+"/good", "the valid VirtualService flows", nil)
	r.object(t, "/mesh/v1/endpoints/"+ns+"/app@c1/c1", "the valid Service's endpoints flow", nil)
	for _, k := range []string{"routerules/" + ns + "/bad-regex", "routerules/" + ns + "/unknown-host", "trafficpolicies/" + ns + "/app", "services/" + ns + "/portless@c1"} {
		r.absent(t, "/mesh/v1/"+k, "an invalid object is not written")
	}
}

func TestNamespaceSelector(t *testing.T) {
	kc := kubetest.Get(t)
	_, cli := testutil.Etcd(t)
	ctx := context.Background()
	in := kc.Namespace(t, map[string]string{"mesh": "on"})
	out := kc.Namespace(t, nil)
	for _, ns := range []string{in, out} {
		if _, err := kc.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "web"},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sel, err := labels.Parse("mesh=on")
	if err != nil {
		t.Fatal(err)
	}
	r := startSource(t, kc, cli, "c1", func(c *kube.Config) { c.NamespaceSelector = sel })
	r.object(t, "/mesh/v1/services/"+in+"/web@c1", "a selected namespace's Service is in the mesh", nil)
	r.absent(t, "/mesh/v1/services/"+out+"/web@c1", "an unselected namespace's Service is not")

	// Labelling the namespace brings it in; unlabelling takes it out.
	nsObj, err := kc.Client.CoreV1().Namespaces().Get(ctx, out, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels = map[string]string{"mesh": "on"}
	if _, err := kc.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.object(t, "/mesh/v1/services/"+out+"/web@c1", "a namespace labelled into the mesh brings its Service", nil)
	if nsObj, err = kc.Client.CoreV1().Namespaces().Get(ctx, out, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	nsObj.Labels = nil
	if _, err := kc.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.absent(t, "/mesh/v1/services/"+out+"/web@c1", "a namespace labelled out of the mesh takes its Service away")
}

// TestSameResultFromKubernetesAndYAML: one normalizer serves every source,
// so a VirtualService applied through the API and the same one in the YAML
// directory give the same object.
func TestSameResultFromKubernetesAndYAML(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	_, cli := testutil.Etcd(t)
	ns := kc.Namespace(t, nil)
	spec := map[string]any{
		"hosts": []any{"reviews"},
		"http": []any{map[string]any{
			"match":   []any{map[string]any{"headers": map[string]any{"end-user": map[string]any{"exact": "jason"}}}},
			"route":   []any{map[string]any{"destination": map[string]any{"host": "reviews", "subset": "v2"}, "weight": 100}},
			"timeout": "2s",
		}},
	}
	apply(t, kc, istioObject("VirtualService", "v1beta1", ns, "reviews", spec))
	if _, err := kc.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "reviews"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 9080}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := startSource(t, kc, cli, "c1", nil)
	var fromKube model.Object
	r.object(t, "/mesh/v1/routerules/"+ns+"/reviews", "the VirtualService is ingested", func(o model.Object) (bool, string) {
		fromKube = o
		return true, ""
	})

	yaml := fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: %s}
spec:
  hosts: [reviews]
  http:
  - match: [{headers: {end-user: {exact: jason}}}]
    route: [{destination: {host: reviews, subset: v2}, weight: 100}]
    timeout: 2s
`, ns)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "vs.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	inputs, problems, err := yamldir.Read(dir, time.Now())
	if err != nil || len(problems) > 0 {
		t.Fatal(err, problems)
	}
	objs, problems := istio.Normalize(inputs, istio.Options{})
	if len(objs) != 1 || len(problems) > 0 {
		t.Fatalf("yaml: %v %v", objs, problems)
	}
	if !model.SameContent(objs[0].Object, fromKube) {
		t.Errorf("from Kubernetes:\n%v\nfrom YAML:\n%v", fromKube, objs[0].Object)
	}
}

// TestSecurityPolicies: AuthorizationPolicies, PeerAuthentications and
// RequestAuthentications from the API server reach the store; a CUSTOM
// policy, which no proxy can ask an external authorizer about yet, gets a
// Warning Event naming its action and is written as a DENY (failing
// closed).
func TestSecurityPolicies(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	_, cli := testutil.Etcd(t)
	ns := kc.Namespace(t, nil)
	apply(t, kc, istioObject("AuthorizationPolicy", "v1", ns, "deny-list", map[string]any{
		"selector": map[string]any{"matchLabels": map[string]any{"app": "greeter"}},
		"action":   "DENY",
		"rules":    []any{map[string]any{"to": []any{map[string]any{"operation": map[string]any{"paths": []any{"/grpc.health.v1.Health/List"}, "ports": []any{"50051"}}}}}},
	}))
	apply(t, kc, istioObject("PeerAuthentication", "v1beta1", ns, "default", map[string]any{"mtls": map[string]any{"mode": "STRICT"}}))
	apply(t, kc, istioObject("RequestAuthentication", "v1", ns, "jwt", map[string]any{
		"jwtRules": []any{map[string]any{"issuer": "https://issuer.example.com", "jwksUri": "https://issuer.example.com/jwks"}},
	}))
	apply(t, kc, istioObject("AuthorizationPolicy", "v1", ns, "ext", map[string]any{
		"action": "CUSTOM", "provider": map[string]any{"name": "opa"}, "rules": []any{map[string]any{}},
	}))
	r := startSource(t, kc, cli, "c1", nil)
	r.object(t, "/mesh/v1/authorizationpolicies/"+ns+"/deny-list", "the AuthorizationPolicy", func(o model.Object) (bool, string) {
		p := o.(*meshv1.AuthorizationPolicy)
		ok := p.Action == meshv1.AuthorizationPolicy_ACTION_DENY && p.Selector["app"] == "greeter" &&
			len(p.Rules) == 1 && p.Rules[0].To[0].Paths[0] == "/grpc.health.v1.Health/List" && p.Rules[0].To[0].Ports[0] == 50051
		return ok, p.String()
	})
	r.object(t, "/mesh/v1/peerauthentications/"+ns+"/default", "the PeerAuthentication", func(o model.Object) (bool, string) {
		return o.(*meshv1.PeerAuthentication).Mode == meshv1.MTLSMode_MTLS_MODE_STRICT, "not STRICT"
	})
	r.object(t, "/mesh/v1/requestauthentications/"+ns+"/jwt", "the RequestAuthentication", nil)
	// Failing closed: what a CUSTOM policy selects is denied, and a
	// Warning Event says so.
	eventFor(t, kc, ns, "AuthorizationPolicy", "ext", "spec.action")
	r.object(t, "/mesh/v1/authorizationpolicies/"+ns+"/ext", "the CUSTOM policy, as a DENY", func(o model.Object) (bool, string) {
		p := o.(*meshv1.AuthorizationPolicy)
		return p.Action == meshv1.AuthorizationPolicy_ACTION_DENY && len(p.Rules) == 1, p.String()
	})
}

// TestExternalNameService: an ExternalName Service is an alias of its
// external name (the pushers send nothing of its own, as istiod), and for
// a pusher that does not read aliases, a DNS service whose endpoint is its
// external name.
func TestExternalNameService(t *testing.T) {
	kc := kubetest.Get(t)
	_, cli := testutil.Etcd(t)
	ns := kc.Namespace(t, nil)
	if _, err := kc.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "payments"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "api.payments.example.com",
			Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := startSource(t, kc, cli, "c1", nil)
	r.object(t, "/mesh/v1/services/"+ns+"/"+kube.ObjectName("payments", "c1"), "the DNS service", func(o model.Object) (bool, string) {
		s := o.(*meshv1.Service)
		return s.Resolution == meshv1.Resolution_RESOLUTION_DNS && s.AliasOf == "api.payments.example.com", s.String()
	})
	r.object(t, "/mesh/v1/endpoints/"+ns+"/"+model.EndpointsName(kube.ObjectName("payments", "c1"), "c1"), "its endpoint, the external name", func(o model.Object) (bool, string) {
		eps := o.(*meshv1.Endpoints).Endpoints
		return len(eps) == 1 && eps[0].Address == "api.payments.example.com", fmt.Sprint(eps)
	})
}

// TestPartsShareInformers: the sources of two parts of one cluster in one
// process share its informers (started once), each syncs its own
// namespaces alone, and one stopping leaves the other's watches working.
func TestPartsShareInformers(t *testing.T) {
	kc := kubetest.Get(t)
	_, cli := testutil.Etcd(t)
	// A namespace in each part.
	var inPart [2]string
	for inPart[0] == "" || inPart[1] == "" {
		ns := kc.Namespace(t, nil)
		if p := kube.PartOf(ns, 2); inPart[p] == "" {
			inPart[p] = ns
		}
	}
	shared := kube.NewInformers(kc.Client, kc.Dynamic)
	parts := make([]*running, 2)
	for p := range parts {
		parts[p] = startSource(t, kc, cli, "c1", func(c *kube.Config) { c.Part, c.Parts, c.Informers = p, 2, shared })
	}
	service := func(ns, name string) {
		t.Helper()
		_, err := kc.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	key := func(ns, name string) string { return "/mesh/v1/services/" + ns + "/" + kube.ObjectName(name, "c1") }
	for p, ns := range inPart {
		service(ns, "svc")
		parts[p].object(t, key(ns, "svc"), "each part's Service stored", nil)
	}
	if n := shared.Started(); n != 1 {
		t.Errorf("the informers were started %d times for two parts, want once", n)
	}
	// Part 0 stops; part 1 still follows its namespace.
	parts[0].cancel()
	if err := <-parts[0].done; err != nil {
		t.Fatal(err)
	}
	parts[0].done <- nil // for the cleanup
	service(inPart[1], "later")
	parts[1].object(t, key(inPart[1], "later"), "part 1 to follow its namespace after part 0 stopped", nil)
}

// TestMeshConfigMap: the mesh's ConfigMap is read whatever namespaces the
// mesh selects, and read again when it changes; settings that cannot be
// read get an Event on the ConfigMap and keep those in effect; another
// ConfigMap is not read at all.
func TestMeshConfigMap(t *testing.T) {
	kc := kubetest.Get(t)
	_, cli := testutil.Etcd(t)
	ctx := context.Background()
	ns := kc.Namespace(t, nil)
	cms := kc.Client.CoreV1().ConfigMaps(ns)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "istio"}, Data: map[string]string{"mesh": "connectTimeout: 3s\nh2UpgradePolicy: UPGRADE"}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Data: map[string]string{"mesh": "garbage: ["}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := startSource(t, kc, cli, "c1", func(c *kube.Config) {
		c.MeshNamespace = ns
		c.NamespaceSelector = labels.SelectorFromSet(labels.Set{"in-mesh": "none-of-them"})
	})
	key := model.Key{Kind: model.KindMeshConfig, Namespace: ns, Name: "istio"}.String()
	timeout := func(want time.Duration) func(model.Object) (bool, string) {
		return func(o model.Object) (bool, string) {
			mc := o.(*meshv1.MeshConfig)
			return mc.GetConnectTimeout().AsDuration() == want && mc.H2Upgrade, fmt.Sprintf("connect timeout %v, h2 %v", mc.GetConnectTimeout().AsDuration(), mc.H2Upgrade)
		}
	}
	r.object(t, key, "the mesh's settings", timeout(3*time.Second))

	cm.Data["mesh"] = "connectTimeout: 1m30s\nh2UpgradePolicy: UPGRADE"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r.object(t, key, "the changed settings", timeout(90*time.Second))

	cm.Data["mesh"] = "connectTimeout: soon"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventFor(t, kc, ns, "ConfigMap", "istio", "connectTimeout")
	r.object(t, key, "the settings in effect kept", timeout(90*time.Second))
	items, _, _, err := r.st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Key.Kind == model.KindMeshConfig && it.Key.Name != "istio" {
			t.Errorf("another ConfigMap was read: %v", it.Key)
		}
	}
}
