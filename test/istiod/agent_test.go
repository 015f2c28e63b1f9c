package istiod

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// agentMesh is the greeter, a proxyless gRPC server of namespace agents,
// reached by Istio's mutual TLS alone.
const agentMesh = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: agents}
spec:
  hosts: [greeter.agents.svc.cluster.local]
  location: MESH_INTERNAL
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  workloadSelector: {labels: {app: greeter}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: greeter-0, namespace: agents}
spec: {address: 127.0.0.1, ports: {grpc: %d}, labels: {app: greeter}, serviceAccount: greeter}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: agents}
spec:
  host: greeter.agents.svc.cluster.local
  trafficPolicy: {tls: {mode: ISTIO_MUTUAL}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: agents}
spec: {mtls: {mode: STRICT}}
`

// TestIstioAgent runs Istio's own agent (pilot-agent of ISTIO_BIN) in its
// proxyless mode, as the grpc-agent injection template runs it, against
// shardpilot's ingester and pusher and a kube-apiserver: each agent reads
// its service account token and the istio-ca-root-cert the ingester wrote
// (where the kubelet would mount them), gets its certificate from the
// pushers' CA service, verifies the pushers' ADS against that root, and
// writes a gRPC bootstrap and certificate files. A grpc-go server and
// client using them then talk Istio's mutual TLS, routed by the pushers.
func TestIstioAgent(t *testing.T) {
	istioBin := os.Getenv("ISTIO_BIN")
	if istioBin == "" {
		t.Skip("ISTIO_BIN is not set: make e2e-istio-agent ISTIO_BIN=$(hack/istio-binaries.sh <istio source>)")
	}
	ourBin, err := filepath.Abs(cmp.Or(os.Getenv("SHARDPILOT_BIN"), filepath.Join("..", "..", ".bin")))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	kc, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Stop)
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := kc.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	kc.CreateNamespace(t, "agents", nil)
	for _, sa := range []string{"greeter", "client"} {
		if _, err := kc.Client.CoreV1().ServiceAccounts("agents").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// The greeter listens where its WorkloadEntry says, on every interface
	// as gRPC servers do.
	lis, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	meshDir := filepath.Join(work, "mesh")
	if err := os.MkdirAll(meshDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(meshDir, "greeter.yaml"), fmt.Appendf(nil, agentMesh, lis.Addr().(*net.TCPAddr).Port), 0o644); err != nil {
		t.Fatal(err)
	}

	// shardpilot: the mesh's CA signs the pushers' ADS certificate for
	// the name the agents dial; agents authenticate by their token.
	meshCA := testutil.NewCA(t)
	run := shardpilotRunner(t, ctx, ourBin, work)
	run("ingester", "--kubeconfig", "Kubernetes="+kubeconfig, "--mesh-dir", meshDir, "--leader-id", "")
	ads := testutil.FreeAddr(t)
	_, port, _ := net.SplitHostPort(ads)
	discovery := "localhost:" + port
	pusher := run("pusher", "--ads-addr", ads, "--ads-cert-names", "localhost,istiod.istio-system.svc", "--ads-client-ca-file", meshCA.CertFile,
		"--ca-cert-file", meshCA.CertFile, "--ca-key-file", meshCA.KeyFile, "--ads-tokens", "--kubeconfig", kubeconfig)
	testutil.Eventually(t, time.Minute, "the pusher ready", func() (bool, string) {
		return ready("http://" + pusher + "/readyz"), "not ready"
	})
	var root string
	testutil.Eventually(t, time.Minute, "the ingester writes istio-ca-root-cert", func() (bool, string) {
		cm, err := kc.Client.CoreV1().ConfigMaps("agents").Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		root = cm.Data["root-cert.pem"]
		return root != "", "empty"
	})

	// agent runs pilot-agent for a workload, with what the kubelet would
	// mount, and returns its gRPC bootstrap once written.
	agent := func(account, app string) []byte {
		dir := filepath.Join(work, "agent-"+account)
		tr, err := kc.Client.CoreV1().ServiceAccounts("agents").CreateToken(ctx, account, &authnv1.TokenRequest{
			Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for file, content := range map[string]string{
			"var/run/secrets/tokens/istio-token":  tr.Status.Token,
			"var/run/secrets/istio/root-cert.pem": root,
			"etc/istio/pod/labels":                fmt.Sprintf("app=%q\n", app),
		} {
			p := filepath.Join(dir, file)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil { // the pod's volume
			t.Fatal(err)
		}
		bootstrap := filepath.Join(dir, "grpc-bootstrap.json")
		_, status, _ := net.SplitHostPort(testutil.FreeAddr(t))
		cmd := exec.CommandContext(ctx, filepath.Join(istioBin, "pilot-agent"), "proxy", "sidecar", "--domain", "agents.svc.cluster.local",
			"--log_output_level", "default:info")
		cmd.Env = append(os.Environ(),
			"DISABLE_ENVOY=true", "ISTIO_META_GENERATOR=grpc", "OUTPUT_CERTS="+filepath.Join(dir, "certs"), "GRPC_XDS_BOOTSTRAP="+bootstrap,
			"CA_ADDR="+discovery, "POD_NAME="+account+"-0", "POD_NAMESPACE=agents", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT="+account,
			"ISTIO_META_CLUSTER_ID=Kubernetes", "JWT_POLICY=third-party-jwt", "PILOT_CERT_PROVIDER=istiod",
			fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress": %q, "configPath": %q, "statusPort": %s}`, discovery, filepath.Join(dir, "etc/istio/proxy"), status))
		startProcess(t, "pilot-agent ("+account+")", cmd, dir)
		var contents []byte
		testutil.Eventually(t, time.Minute, account+"'s agent writes its bootstrap and certificate", func() (bool, string) {
			b, err := os.ReadFile(bootstrap)
			if err != nil {
				return false, err.Error()
			}
			if _, err := os.Stat(filepath.Join(dir, "certs", "cert-chain.pem")); err != nil {
				return false, err.Error()
			}
			contents = b
			return true, ""
		})
		return contents
	}

	serverBootstrap := agent("greeter", "greeter")
	serverCreds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	srv, err := xds.NewGRPCServer(grpc.Creds(serverCreds), xds.BootstrapContentsForTesting(serverBootstrap),
		xds.ServingModeCallback(func(_ net.Addr, args xds.ServingModeChangeArgs) {
			if args.Mode == connectivity.ServingModeServing {
				select {
				case <-serving:
				default:
					close(serving)
				}
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	select {
	case <-serving:
	case <-time.After(time.Minute):
		t.Fatal("the greeter never got its listener through its agent")
	}

	resolver, err := xds.NewXDSResolverWithConfigForTesting(agent("client", "client"))
	if err != nil {
		t.Fatal(err)
	}
	clientCreds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///greeter.agents.svc.cluster.local:50051", grpc.WithTransportCredentials(clientCreds), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testutil.Eventually(t, time.Minute, "the client calls the greeter over Istio's mutual TLS", func() (bool, string) {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		_, err := healthpb.NewHealthClient(conn).Check(rctx, &healthpb.HealthCheckRequest{})
		return err == nil, fmt.Sprint(err)
	})
	for i := range 20 {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := healthpb.NewHealthClient(conn).Check(rctx, &healthpb.HealthCheckRequest{})
		rcancel()
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	t.Log("Istio's agents got their certificates from the pushers' CA service and their configuration from the pushers; 20 calls over Istio's mutual TLS succeeded")
}
