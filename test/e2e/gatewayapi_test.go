package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var grpcRoutes = schema.GroupVersionResource{Group: "gateway.networking.k8s.io", Version: "v1", Resource: "grpcroutes"}

// watchOn opens a Health.Watch stream and returns the address of the
// backend that serves it.
func watchOn(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return "", err
	}
	if _, err := stream.Recv(); err != nil {
		return "", err
	}
	p, ok := peer.FromContext(stream.Context())
	if !ok {
		return "", fmt.Errorf("no peer")
	}
	return p.Addr.String(), nil
}

// TestGRPCRouteOnAService: a GRPCRoute whose parent is a Service (GAMMA),
// applied to a real apiserver, routes a proxyless grpc-go client's calls
// of that Service: a method match sends Health.Watch to one version, the
// rest is split by weight between two; the route's status says Accepted.
func TestGRPCRouteOnAService(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallGatewayAPICRDs(t)
	ns := kc.Namespace(t, nil)
	ip := hostIP(t)
	v1, v2, plain := startBackendOn(t, ip), startBackendOn(t, ip), startBackendOn(t, ip)
	createService(t, kc, ns, "greeter", 50051)
	createService(t, kc, ns, "greeter-v1", 50051)
	createService(t, kc, ns, "greeter-v2", 50051)
	createWorkload(t, kc, ns, "greeter", "greeter", "v0", plain)
	createWorkload(t, kc, ns, "greeter-v1", "greeter-v1", "v1", v1)
	createWorkload(t, kc, ns, "greeter-v2", "greeter-v2", "v2", v2)

	cp := NewCluster(t, Options{}, kubeSource("c1", kc.Config))
	conn := dialXDS(t, cp.ads, fmt.Sprintf("xds:///greeter.%s.svc.cluster.local:50051", ns))
	allOn(t, conn, plain.addr, "without a route, the Service's own endpoint serves")

	backend := func(name string, weight int) map[string]any {
		return map[string]any{"name": name, "port": int64(50051), "weight": int64(weight)}
	}
	route := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
		"metadata": map[string]any{"name": "greeter", "namespace": ns},
		"spec": map[string]any{
			"parentRefs": []any{map[string]any{"group": "", "kind": "Service", "name": "greeter", "port": int64(50051)}},
			"rules": []any{
				map[string]any{
					"matches":     []any{map[string]any{"method": map[string]any{"service": "grpc.health.v1.Health", "method": "Watch"}}},
					"backendRefs": []any{backend("greeter-v2", 1)},
				},
				map[string]any{"backendRefs": []any{backend("greeter-v1", 1), backend("greeter-v2", 1)}},
			},
		},
	}}
	if _, err := kc.Dynamic.Resource(grpcRoutes).Namespace(ns).Create(context.Background(), route, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "calls are split by weight between v1 and v2, none on the Service's own endpoint", func() (bool, string) {
		got := spread(conn, 40)
		return got[v1.addr] > 0 && got[v2.addr] > 0 && got[v1.addr]+got[v2.addr] == 40, fmt.Sprint(got)
	})
	testutil.Eventually(t, 20*time.Second, "the method match sends every Watch to v2", func() (bool, string) {
		for i := range 10 {
			addr, err := watchOn(conn)
			if err != nil || addr != v2.addr {
				return false, fmt.Sprintf("watch %d: %s %v", i, addr, err)
			}
		}
		return true, ""
	})
	testutil.Eventually(t, 20*time.Second, "the route says Accepted", func() (bool, string) {
		u, err := kc.Dynamic.Resource(grpcRoutes).Namespace(ns).Get(context.Background(), "greeter", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		parents, _, _ := unstructured.NestedSlice(u.Object, "status", "parents")
		if len(parents) != 1 {
			return false, fmt.Sprint(parents)
		}
		conds, _, _ := unstructured.NestedSlice(parents[0].(map[string]any), "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Accepted" {
				return m["status"] == "True", fmt.Sprint(m)
			}
		}
		return false, fmt.Sprint(conds)
	})
}
