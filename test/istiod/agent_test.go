package istiod

import (
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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// agentNamespace holds the workloads whose agents the test runs.
const agentNamespace = "agents"

// TestIstioAgent runs Istio's own agent (pilot-agent of ISTIO_BIN) in its
// proxyless mode, as the grpc-agent injection template runs it, against
// shardpilot's ingester and pusher and a kube-apiserver: each agent reads
// its service account token and the istio-ca-root-cert the ingester wrote
// (where the kubelet would mount them), gets its certificate from the
// pushers' CA service, verifies the pushers' ADS against that root, and
// writes a gRPC bootstrap and certificate files. A grpc-go server and
// client using them then talk Istio's mutual TLS, routed by the pushers.
// The server's agent names a WorkloadGroup (ISTIO_META_AUTO_REGISTER_GROUP)
// and the workload is registered: its WorkloadEntry appears in the API
// server, made from the group.
func TestIstioAgent(t *testing.T) {
	istioBin, ourBin := binaries(t, "e2e-istio-agent")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	kc, kubeconfig := startKube(t, work)
	kc.CreateNamespace(t, agentNamespace, nil)
	for _, sa := range []string{"greeter", "client"} {
		if _, err := kc.Client.CoreV1().ServiceAccounts(agentNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The greeter's agent names a WorkloadGroup (the chart's CRDs beside
	// it), as a VM's does: the pushers have it registered.
	a := &applier{kc: kc}
	crds, err := os.ReadFile(filepath.Join("..", "..", "deploy", "helm", "shardpilot", "crds", "istio-networking.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	a.apply(t, ctx, crds)
	a.apply(t, ctx, []byte(`apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: greeter, namespace: `+agentNamespace+`}
spec:
  metadata: {labels: {tier: vm}}
  template: {serviceAccount: greeter}
`))
	// The greeter listens where its WorkloadEntry says, on every interface
	// as gRPC servers do.
	lis, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	discovery, root := startAgentsShardpilot(t, ctx, kc, ourBin, kubeconfig, work, lis.Addr().(*net.TCPAddr).Port)
	agent := func(account, app string, env ...string) []byte {
		return runAgent(t, ctx, kc, istioBin, filepath.Join(work, "agent-"+account), discovery, root, account, app, env...)
	}
	serveGreeter(t, lis, agent("greeter", "greeter", "ISTIO_META_AUTO_REGISTER_GROUP=greeter"))
	entries := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}
	testutil.Eventually(t, time.Minute, "the greeter, connected through Istio's agent naming its group, has a WorkloadEntry", func() (bool, string) {
		u, err := kc.Dynamic.Resource(entries).Namespace(agentNamespace).Get(ctx, "greeter-127.0.0.1", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		address, _, _ := unstructured.NestedString(u.Object, "spec", "address")
		ok := address == "127.0.0.1" && u.GetLabels()["tier"] == "vm" && u.GetLabels()["app"] == "greeter" &&
			u.GetAnnotations()["istio.io/autoRegistrationGroup"] == "greeter"
		return ok, fmt.Sprint(u.Object["spec"], u.GetLabels(), u.GetAnnotations())
	})

	resolver, err := xds.NewXDSResolverWithConfigForTesting(agent("client", "client"))
	if err != nil {
		t.Fatal(err)
	}
	clientCreds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///greeter."+agentNamespace+".svc.cluster.local:50051", grpc.WithTransportCredentials(clientCreds), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	check := func() error {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		defer rcancel()
		_, err := healthpb.NewHealthClient(conn).Check(rctx, &healthpb.HealthCheckRequest{})
		return err
	}
	testutil.Eventually(t, time.Minute, "the client calls the greeter over Istio's mutual TLS", func() (bool, string) {
		err := check()
		return err == nil, fmt.Sprint(err)
	})
	for i := range 20 {
		if err := check(); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	t.Log("Istio's agents got their certificates from the pushers' CA service and their configuration from the pushers; 20 calls over Istio's mutual TLS succeeded")
}

// startAgentsShardpilot runs shardpilot's ingester (the greeter of
// testutil.StrictGreeter, listening on port, from a mesh directory) and a
// pusher whose ADS certificate the mesh's CA signs for the names agents
// dial and which authenticates them by their token; it returns the
// discovery address and the roots of istio-ca-root-cert once the ingester
// wrote them.
func startAgentsShardpilot(t *testing.T, ctx context.Context, kc *kubetest.Cluster, bin, kubeconfig, work string, port int) (discovery, root string) {
	t.Helper()
	meshDir := filepath.Join(work, "mesh")
	if err := os.MkdirAll(meshDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(meshDir, "greeter.yaml"), []byte(testutil.StrictGreeter(agentNamespace, port)), 0o644); err != nil {
		t.Fatal(err)
	}
	meshCA := testutil.NewCA(t)
	run := shardpilotRunner(t, ctx, bin, work)
	run("ingester", "--kubeconfig", "Kubernetes="+kubeconfig, "--mesh-dir", meshDir, "--leader-id", "")
	ads := testutil.FreeAddr(t)
	_, adsPort, _ := net.SplitHostPort(ads)
	// Istio's agents check istiod's name unless told otherwise.
	pusher := run("pusher", "--ads-addr", ads, "--ads-cert-names", "localhost,istiod.istio-system.svc", "--ads-client-ca-file", meshCA.CertFile,
		"--ca-cert-file", meshCA.CertFile, "--ca-key-file", meshCA.KeyFile, "--ads-tokens", "--kubeconfig", kubeconfig)
	testutil.Eventually(t, time.Minute, "the pusher ready", func() (bool, string) {
		return ready("http://" + pusher + "/readyz"), "not ready"
	})
	testutil.Eventually(t, time.Minute, "the ingester writes istio-ca-root-cert", func() (bool, string) {
		cm, err := kc.Client.CoreV1().ConfigMaps(agentNamespace).Get(ctx, "istio-ca-root-cert", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		root = cm.Data["root-cert.pem"]
		return root != "", "empty"
	})
	return "localhost:" + adsPort, root
}

// runAgent runs pilot-agent for a workload of agentNamespace in dir, with
// what the kubelet would mount there (its token, the mesh's roots, its
// labels), and returns the gRPC bootstrap it writes once it also wrote
// its certificate.
func runAgent(t *testing.T, ctx context.Context, kc *kubetest.Cluster, bin, dir, discovery, root, account, app string, env ...string) []byte {
	t.Helper()
	tr, err := kc.Client.CoreV1().ServiceAccounts(agentNamespace).CreateToken(ctx, account, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for file, content := range map[string]string{
		"var/run/secrets/tokens/istio-token":  tr.Status.Token,
		"var/run/secrets/istio/root-cert.pem": root,
		"etc/istio/pod/labels":                fmt.Sprintf("app=%q\n", app),
		"certs/.keep":                         "", // the pod's volume for the certificates
	} {
		p := filepath.Join(dir, file)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bootstrap := filepath.Join(dir, "grpc-bootstrap.json")
	_, status, _ := net.SplitHostPort(testutil.FreeAddr(t))
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pilot-agent"), "proxy", "sidecar", "--domain", agentNamespace+".svc.cluster.local",
		"--log_output_level", "default:info")
	cmd.Env = append(os.Environ(),
		"DISABLE_ENVOY=true", "ISTIO_META_GENERATOR=grpc", "OUTPUT_CERTS="+filepath.Join(dir, "certs"), "GRPC_XDS_BOOTSTRAP="+bootstrap,
		"CA_ADDR="+discovery, "POD_NAME="+account+"-0", "POD_NAMESPACE="+agentNamespace, "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT="+account,
		"ISTIO_META_CLUSTER_ID=Kubernetes", "JWT_POLICY=third-party-jwt", "PILOT_CERT_PROVIDER=istiod",
		fmt.Sprintf(`PROXY_CONFIG={"discoveryAddress": %q, "configPath": %q, "statusPort": %s}`, discovery, filepath.Join(dir, "etc/istio/proxy"), status))
	cmd.Env = append(cmd.Env, env...)
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

// serveGreeter serves the health service on lis through grpc-go's xDS
// server with an agent's bootstrap, once it has its listener.
func serveGreeter(t *testing.T, lis net.Listener, bootstrap []byte) {
	t.Helper()
	creds, err := xdscreds.NewServerCredentials(xdscreds.ServerOptions{FallbackCreds: insecure.NewCredentials()})
	if err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	srv, err := xds.NewGRPCServer(grpc.Creds(creds), xds.BootstrapContentsForTesting(bootstrap),
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
}
