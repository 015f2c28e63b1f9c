package e2e

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// flakyHealth fails every other call with UNAVAILABLE.
type flakyHealth struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
}

func (f *flakyHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if f.calls.Add(1)%2 == 1 {
		return nil, status.Error(codes.Unavailable, "flaky")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func startFlakyBackend(t *testing.T) (backend, *flakyHealth) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &flakyHealth{}
	return serveBackend(t, lis, h), h
}

const routingRules = greeterSubsets + "---" + greeterByHeader

// greeterByHeader routes jason to subset v2 and everyone else, with
// retries, to v1.
const greeterByHeader = `
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - name: jason
    match: [{headers: {x-user: {exact: jason}}}]
    route: [{destination: {host: greeter, subset: v2}}]
  - name: everyone
    route: [{destination: {host: greeter, subset: v1}}]
    retries: {attempts: 3, retryOn: unavailable}
`

// TestProxylessHeaderRoutingAndRetries: grpc-go routes by a request header
// and retries UNAVAILABLE as the VirtualService says, with real RPCs.
func TestProxylessHeaderRoutingAndRetries(t *testing.T) {
	flaky, health := startFlakyBackend(t)
	steady := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", flaky),
		workloadEntry("greeter-2", "v2", steady), routingRules))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")

	callAs := func(user string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if user != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-user", user)
		}
		var p peer.Peer
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		if err != nil {
			return "", err
		}
		return p.Addr.String(), nil
	}
	// Wait for the whole configuration: the ingester may store the file's
	// objects over more than one revision, and a client routed before the
	// rules arrive (to the endpoints stored so far) may already send every
	// call to the steady backend. Only the rules send calls without the
	// header to the flaky one and retry them.
	testutil.Eventually(t, 20*time.Second, "the header routes jason to subset v2, the rest to v1 with retries", func() (bool, string) {
		for range 10 {
			addr, err := callAs("jason")
			if err != nil || addr != steady.addr {
				return false, fmt.Sprint("jason: ", addr, err)
			}
			if addr, err = callAs(""); err != nil || addr != flaky.addr {
				return false, fmt.Sprint("without the header: ", addr, err)
			}
		}
		return true, ""
	})
	// Every other call to the flaky backend fails; the retry policy hides it.
	before := health.calls.Load()
	for i := range 20 {
		addr, err := callAs("")
		if err != nil {
			t.Fatalf("rpc %d failed despite the retry policy: %v", i, err)
		}
		if addr != flaky.addr {
			t.Fatalf("rpc %d without the header went to %s, want subset v1 (%s)", i, addr, flaky.addr)
		}
	}
	if attempts := health.calls.Load() - before; attempts < 30 {
		t.Errorf("20 RPCs took %d attempts on the flaky backend; want retries (about 40)", attempts)
	}
}

// meshRetries is the mesh's ConfigMap with a default retry policy.
func meshRetries(policy string) string {
	return `
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system}
data:
  mesh: |
    defaultHttpRetryPolicy: ` + policy + "\n"
}

// TestProxylessMeshRetries: the mesh's MeshConfig sets the retries of
// routes that name none, and a change of it reaches a real grpc-go client:
// with none, every other call to a flaky backend fails; with the mesh's
// policy, none does.
func TestProxylessMeshRetries(t *testing.T) {
	flaky, _ := startFlakyBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", flaky)))
	writeMesh(t, dir, "mesh.yaml", meshRetries("{attempts: 0}"))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	call := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	// Calls alternate between failing and succeeding while nothing retries.
	testutil.Eventually(t, 20*time.Second, "calls failing without retries", func() (bool, string) {
		failed := 0
		for range 10 {
			if err := call(); status.Code(err) == codes.Unavailable {
				failed++
			}
		}
		return failed >= 4, fmt.Sprintf("%d of 10 calls failed", failed)
	})
	writeMesh(t, dir, "mesh.yaml", meshRetries("{attempts: 3, retryOn: unavailable}"))
	testutil.Eventually(t, 20*time.Second, "the mesh's retries hiding the failures", func() (bool, string) {
		for i := range 20 {
			if err := call(); err != nil {
				return false, fmt.Sprintf("call %d: %v", i, err)
			}
		}
		return true, ""
	})
}
