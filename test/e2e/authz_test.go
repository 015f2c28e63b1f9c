package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
)

// xdsServer is a proxyless gRPC server whose listener, security and
// authorization come from the pusher: grpc-go's xDS server.
type xdsServer struct {
	backend
	serving chan struct{}
}

// startXDSServer serves the health service through grpc-go's xDS server,
// on every interface, as a workload of demo labelled app=greeter. channel
// is the bootstrap's channel credentials to the pusher; providers, when
// set, its certificate providers (for mutual TLS).
func startXDSServer(t *testing.T, ads, nodeID, channel, providers string) *xdsServer {
	t.Helper()
	return startXDSServerIn(t, "demo", ads, nodeID, channel, providers)
}

// startXDSServerIn is startXDSServer for a workload of namespace ns.
func startXDSServerIn(t *testing.T, ns, ads, nodeID, channel, providers string) *xdsServer {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "server_features": ["xds_v3"], "channel_creds": [%s]}],
		"node": {"id": %q, "metadata": {"GENERATOR": "grpc", "NAMESPACE": %q, "LABELS": {"app": "greeter"}}},
		"server_listener_resource_name_template": "grpc/server?xds.resource.listening_address=%%s"
		%s
	}`, ads, channel, nodeID, ns, providers)
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	s := &xdsServer{serving: make(chan struct{})}
	srv, err := xds.NewGRPCServer(grpc.Creds(creds), xds.BootstrapContentsForTesting([]byte(bootstrap)),
		xds.ServingModeCallback(func(_ net.Addr, args xds.ServingModeChangeArgs) {
			if args.Mode == connectivity.ServingModeServing {
				select {
				case <-s.serving:
				default:
					close(s.serving)
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	port := lis.Addr().(*net.TCPAddr).Port
	s.backend = backend{addr: fmt.Sprintf("127.0.0.1:%d", port), port: port}
	return s
}

// dialMutualXDS dials target through grpc-go's xDS resolver as a client
// (account) of namespace ns whose bootstrap has the channel credentials
// and certificate providers given: xDS credentials, for Istio's mutual TLS.
func dialMutualXDS(t *testing.T, ads, ns, account, channel, providers, target string) *grpc.ClientConn {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "server_features": ["xds_v3"], "channel_creds": [%s]}],
		"node": {"id": "sidecar~127.0.0.1~%s.%s~%s.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": %q}}
		%s
	}`, ads, channel, account, ns, ns, ns, providers)
	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServing waits until the server has its listener from the pusher.
func (s *xdsServer) waitServing(t *testing.T) {
	t.Helper()
	select {
	case <-s.serving:
	case <-time.After(30 * time.Second):
		t.Fatal("the xDS server never got its listener")
	}
}

// rpcs makes a Check and a List call and returns their codes.
func rpcs(conn *grpc.ClientConn) (check, list codes.Code) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c := healthpb.NewHealthClient(conn)
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
	check = status.Code(err)
	_, err = c.List(ctx, &healthpb.HealthListRequest{})
	return check, status.Code(err)
}

// waitFor waits until Check and List answer with the codes wanted.
func waitFor(t *testing.T, conn *grpc.ClientConn, check, list codes.Code, what string) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, what, func() (bool, string) {
		c, l := rpcs(conn)
		return c == check && l == list, fmt.Sprintf("Check %s, List %s", c, l)
	})
	// And it stays so: 20 pairs in a row.
	for range 20 {
		if c, l := rpcs(conn); c != check || l != list {
			t.Fatalf("%s: then Check %s, List %s", what, c, l)
		}
	}
}

const denyList = `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-list, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  action: DENY
  rules:
  - to: [{operation: {paths: ["/grpc.health.v1.Health/List"]}}]
`

// TestAuthorizationPolicy: an AuthorizationPolicy denying a path, applied
// by a grpc-go xDS server from the listener the pusher serves it, makes
// that RPC fail with PermissionDenied while the rest succeed; a policy that
// selects other workloads does not apply; removing the policy lets the RPC
// through again.
func TestAuthorizationPolicy(t *testing.T) {
	dir := t.TempDir()
	cp := NewCluster(t, Options{}, yamlSource(dir))
	srv := startXDSServer(t, cp.ads, "sidecar~127.0.0.1~greeter-1.demo~demo.svc.cluster.local", `{"type": "insecure"}`, "")
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", srv.backend)))
	srv.waitServing(t)
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	waitFor(t, conn, codes.OK, codes.OK, "both RPCs are served without a policy")

	writeMesh(t, dir, "policy.yaml", denyList)
	waitFor(t, conn, codes.OK, codes.PermissionDenied, "the denied path fails with PermissionDenied, the other is served")

	other := strings.ReplaceAll(strings.ReplaceAll(denyList, "app: greeter", "app: other"), "no-list", "no-list-elsewhere")
	writeMesh(t, dir, "policy.yaml", other)
	waitFor(t, conn, codes.OK, codes.OK, "a policy selecting other workloads does not apply")

	writeMesh(t, dir, "policy.yaml", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-check, namespace: demo}
spec:
  rules:
  - to: [{operation: {paths: ["*/Check"], methods: [POST]}}]
`)
	waitFor(t, conn, codes.OK, codes.PermissionDenied, "a namespace-wide ALLOW policy allows what it names only")
}

// TestStrictMutualTLSWithPrincipals: a namespace's PeerAuthentication
// STRICT makes a grpc-go xDS server take mutual TLS only, with workload
// certificates served over SDS; a client of a DestinationRule with
// ISTIO_MUTUAL calls it; an ALLOW policy naming the client's principal
// lets it through and refuses another identity of the same namespace.
func TestStrictMutualTLSWithPrincipals(t *testing.T) {
	dir := t.TempDir()
	cp, boot := securedControlPlane(t, time.Hour, yamlSource(dir))
	// Each workload's agent writes its workload certificate.
	agent := func(account string) (channel, providers string) {
		cert, key := boot.Issue(t, account, "spiffe://cluster.local/ns/demo/sa/"+account)
		wCert, wKey, wRoot := newSDSClient(t, cp.ads, boot.CertFile, cert, key, "agent~"+account+".demo").next(t, 10*time.Second).write(t, t.TempDir())
		channel = fmt.Sprintf(`{"type": "tls", "config": {"ca_certificate_file": %q, "certificate_file": %q, "private_key_file": %q}}`, boot.CertFile, cert, key)
		providers = fmt.Sprintf(`, "certificate_providers": {"default": {"plugin_name": "file_watcher",
			"config": {"certificate_file": %q, "private_key_file": %q, "ca_certificate_file": %q, "refresh_interval": "1s"}}}`, wCert, wKey, wRoot)
		return channel, providers
	}
	serverChannel, serverProviders := agent("greeter")
	srv := startXDSServer(t, cp.ads, "sidecar~127.0.0.1~greeter-1.demo~demo.svc.cluster.local", serverChannel, serverProviders)
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", srv.backend), `
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: demo}
spec:
  host: greeter.demo.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: demo}
spec: {mtls: {mode: STRICT}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: only-client, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  rules:
  - from: [{source: {principals: ["cluster.local/ns/demo/sa/client"]}}]
`))
	srv.waitServing(t)

	dial := func(account string) *grpc.ClientConn {
		channel, providers := agent(account)
		return dialMutualXDS(t, cp.ads, "demo", account, channel, providers, "xds:///greeter.demo.svc.cluster.local:50051")
	}
	waitFor(t, dial("client"), codes.OK, codes.OK, "the named principal is served over mutual TLS")
	waitFor(t, dial("intruder"), codes.PermissionDenied, codes.PermissionDenied, "another identity of demo is refused")

	// Plaintext is refused by the STRICT server.
	plain, err := grpc.NewClient(srv.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if c, _ := rpcs(plain); c == codes.OK {
		t.Error("a plaintext client was served by a STRICT server")
	}
}

// TestPoliciesFailClosed: a policy naming a field shardpilot does not check
// yet is applied failing closed, never dropped: the workload whose only
// policy is such an ALLOW denies every RPC (dropped, it would allow all),
// and a DENY whose rule names one denies regardless of it while the
// workload's other policy still applies.
func TestPoliciesFailClosed(t *testing.T) {
	dir := t.TempDir()
	cp := NewCluster(t, Options{}, yamlSource(dir))
	srv := startXDSServer(t, cp.ads, "sidecar~127.0.0.1~greeter-1.demo~demo.svc.cluster.local", `{"type": "insecure"}`, "")
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", srv.backend)))
	srv.waitServing(t)
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	waitFor(t, conn, codes.OK, codes.OK, "both RPCs are served without a policy")

	writeMesh(t, dir, "policy.yaml", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-office, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  rules:
  - from: [{source: {remoteIpBlocks: ["192.0.2.0/24"]}}]
`)
	waitFor(t, conn, codes.PermissionDenied, codes.PermissionDenied, "an ALLOW whose source is not checked allows nothing")

	writeMesh(t, dir, "policy.yaml", `
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-all, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  rules:
  - {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-list-from-outside, namespace: demo}
spec:
  selector: {matchLabels: {app: greeter}}
  action: DENY
  rules:
  - from: [{source: {notRemoteIpBlocks: ["10.0.0.0/8"]}}]
    to: [{operation: {paths: ["/grpc.health.v1.Health/List"]}}]
`)
	defer func() {
		if t.Failed() {
			rec := httptest.NewRecorder()
			cp.dump.ServeHTTP(rec, httptest.NewRequest("GET", "/?proxy=sidecar~127.0.0.1~greeter-1.demo~demo.svc.cluster.local", nil))
			t.Log(rec.Body.String())
		}
	}()
	waitFor(t, conn, codes.OK, codes.PermissionDenied, "a DENY whose source is not checked denies its path regardless, beside the other policy")
}
