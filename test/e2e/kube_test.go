package e2e

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/health"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
)

// hostIP returns a non-loopback IPv4 address of this machine: the
// apiserver refuses loopback addresses in EndpointSlices.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	t.Fatal("this machine has no non-loopback IPv4 address for EndpointSlice backends")
	return ""
}

// startBackendOn is startBackend on a chosen address.
func startBackendOn(t *testing.T, ip string) backend {
	t.Helper()
	lis, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	return serveBackend(t, lis, health.NewServer())
}

func createService(t *testing.T, kc *kubetest.Cluster, ns, name string, port int32) {
	t.Helper()
	_, err := kc.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: port}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// createWorkload creates a Pod labelled with its version and an
// EndpointSlice that puts it behind the service at the backend's address.
func createWorkload(t *testing.T, kc *kubetest.Cluster, ns, service, name, version string, b backend) {
	t.Helper()
	ctx := context.Background()
	if _, err := kc.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": service, "version": version}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: service}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	host, _, _ := net.SplitHostPort(b.addr)
	if _, err := kc.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{host}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: name}}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("grpc"), Port: ptr.To(int32(b.port))}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func applyIstio(t *testing.T, kc *kubetest.Cluster, kind, resource, ns, name string, spec map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "networking.istio.io/v1", "kind": kind,
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec,
	}}
	gvr := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: resource}
	if _, err := kc.Dynamic.Resource(gvr).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestProxylessGRPCFollowsKubernetes: endpoints that exist only as
// EndpointSlices in a real apiserver carry real RPCs, a VirtualService
// applied through the API moves them, an ExternalName Service naming the
// service is routed as it, and the VirtualService's change and deletion
// move the RPCs again.
func TestProxylessGRPCFollowsKubernetes(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	ip := hostIP(t)
	a, b := startBackendOn(t, ip), startBackendOn(t, ip)
	createService(t, kc, ns, "greeter", 50051)
	createWorkload(t, kc, ns, "greeter", "greeter-a", "v1", a)
	createWorkload(t, kc, ns, "greeter", "greeter-b", "v2", b)

	cp := NewCluster(t, Options{}, kubeSource("c1", kc.Config))
	conn := dialXDS(t, cp.ads, fmt.Sprintf("xds:///greeter.%s.svc.cluster.local:50051", ns))
	testutil.Eventually(t, 30*time.Second, "RPCs reach both EndpointSlice backends", func() (bool, string) {
		got := spread(conn, 20)
		return got[a.addr] > 0 && got[b.addr] > 0 && got[a.addr]+got[b.addr] == 20, fmt.Sprint(got)
	})

	applyIstio(t, kc, "DestinationRule", "destinationrules", ns, "greeter", map[string]any{
		"host": "greeter", "subsets": []any{
			map[string]any{"name": "v1", "labels": map[string]any{"version": "v1"}},
			map[string]any{"name": "v2", "labels": map[string]any{"version": "v2"}},
		}})
	applyIstio(t, kc, "VirtualService", "virtualservices", ns, "greeter", map[string]any{
		"hosts": []any{"greeter"},
		"http":  []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": "greeter", "subset": "v2"}}}}},
	})
	allOn(t, conn, b.addr, "a VirtualService applied through the API sends every RPC to subset v2")

	// An ExternalName Service naming greeter is an alias of it: a client
	// dialling the alias is routed as greeter is.
	if _, err := kc.Client.CoreV1().Services(ns).Create(context.Background(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "greeter." + ns + ".svc.cluster.local",
			Ports: []corev1.ServicePort{{Name: "grpc", Port: 50051}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	alias := dialXDS(t, cp.ads, fmt.Sprintf("xds:///legacy.%s.svc.cluster.local:50051", ns))
	allOn(t, alias, b.addr, "RPCs to the ExternalName alias are routed as greeter's")
	// A change of it, and its deletion, are synced by themselves (the
	// ingester reads that resource alone): the clients follow both.
	vs := kc.Dynamic.Resource(schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "virtualservices"}).Namespace(ns)
	u, err := vs.Get(context.Background(), "greeter", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	u.Object["spec"] = map[string]any{
		"hosts": []any{"greeter"},
		"http":  []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": "greeter", "subset": "v1"}}}}},
	}
	if _, err := vs.Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	allOn(t, conn, a.addr, "the VirtualService changed to subset v1 sends every RPC there")
	allOn(t, alias, a.addr, "and every RPC to the alias")
	if err := vs.Delete(context.Background(), "greeter", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the VirtualService deleted, RPCs reach both backends again", func() (bool, string) {
		got := spread(conn, 20)
		return got[a.addr] > 0 && got[b.addr] > 0, fmt.Sprint(got)
	})
}

// TestLeaderFailover runs two ingester replicas for one cluster; the
// leader crashes; the follower takes over within the lease TTL and
// reconciles what changed while nobody led.
func TestLeaderFailover(t *testing.T) {
	kc := kubetest.Get(t)
	ns := kc.Namespace(t, nil)
	createService(t, kc, ns, "stays", 80)
	createService(t, kc, ns, "goes", 80)
	etcd, _ := testutil.Etcd(t)
	dial := func() *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cliA, cliB := dial(), dial()
	defer cliB.Close()
	const ttl = 2 * time.Second
	start := func(cli *clientv3.Client, id string) (context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- app.KubeSource{Etcd: cli, Cluster: "c1", Kube: kc.Config, Log: testutil.Log(t).With("replica", id),
				Election: app.Election{ID: id, TTL: ttl}}.Run(ctx)
		}()
		return cancel, done
	}
	st := store.New(cliB)
	has := func(name string) bool {
		items, _, _, err := st.List(context.Background())
		if err != nil {
			return false
		}
		for _, it := range items {
			if it.Key == (model.Key{Kind: model.KindService, Namespace: ns, Name: kube.ObjectName(name, "c1")}) {
				return true
			}
		}
		return false
	}

	cancelA, doneA := start(cliA, "a")
	testutil.Eventually(t, 30*time.Second, "the first replica leads and syncs", func() (bool, string) {
		return has("stays") && has("goes"), "services not in the store yet"
	})
	cancelB, doneB := start(cliB, "b")
	defer func() { cancelB(); <-doneB }()

	// The leader crashes: its etcd client vanishes without resigning.
	crashed := time.Now()
	cliA.Close()
	cancelA()
	<-doneA
	// While nobody leads, the cluster changes.
	if err := kc.Client.CoreV1().Services(ns).Delete(context.Background(), "goes", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	createService(t, kc, ns, "arrives", 80)
	testutil.Eventually(t, 30*time.Second, "the follower takes over and reconciles", func() (bool, string) {
		return !has("goes") && has("arrives") && has("stays"), fmt.Sprintf("goes=%v arrives=%v stays=%v", has("goes"), has("arrives"), has("stays"))
	})
	took := time.Since(crashed)
	t.Logf("follower reconciled %s after the leader crashed (lease TTL %s)", took.Round(10*time.Millisecond), ttl)
	if took > ttl+5*time.Second {
		t.Errorf("takeover took %s; the lease TTL is %s", took, ttl)
	}
}

// TestTwoClustersMerge watches two clusters (two real apiservers) from one
// ingester; the same Service has an endpoint in each; the pusher serves
// both endpoints, one per cluster shard.
func TestTwoClustersMerge(t *testing.T) {
	c1 := kubetest.Get(t)
	c2 := kubetest.StartAnother(t)
	ns := c1.Namespace(t, nil)
	c2.CreateNamespace(t, ns, nil)
	ip := hostIP(t)
	a, b := startBackendOn(t, ip), startBackendOn(t, ip)
	createService(t, c1, ns, "greeter", 50051)
	createWorkload(t, c1, ns, "greeter", "greeter-a", "v1", a)
	createService(t, c2, ns, "greeter", 50051)
	createWorkload(t, c2, ns, "greeter", "greeter-b", "v1", b)

	cp := NewCluster(t, Options{}, kubeSource("east", c1.Config), kubeSource("west", c2.Config))
	conn := dialXDS(t, cp.ads, fmt.Sprintf("xds:///greeter.%s.svc.cluster.local:50051", ns))
	testutil.Eventually(t, 30*time.Second, "RPCs reach the endpoints of both clusters", func() (bool, string) {
		got := spread(conn, 20)
		return got[a.addr] > 0 && got[b.addr] > 0 && got[a.addr]+got[b.addr] == 20, fmt.Sprint(got)
	})
	items, _, _, err := store.New(cp.etcd).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, it := range items {
		if it.Key.Kind == model.KindEndpoints && it.Key.Namespace == ns {
			keys = append(keys, it.Key.String())
		}
	}
	want := fmt.Sprint([]string{"/mesh/v1/endpoints/" + ns + "/greeter@east/east", "/mesh/v1/endpoints/" + ns + "/greeter@west/west"})
	if slices.Sort(keys); fmt.Sprint(keys) != want {
		t.Errorf("endpoint keys %v, want one shard per cluster %s", keys, want)
	}
}
