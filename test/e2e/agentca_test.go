package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/sds"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

// agentCSR makes a key and a CSR for a SPIFFE identity, as Istio's agent
// does before it asks its caAddress.
func agentCSR(t *testing.T, spiffe string) (string, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(spiffe)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})), key
}

// agentControlPlane serves ADS with tc to proxies authenticated by their
// certificate or their service account token (reviewed as tokens says),
// workload certificates over SDS and Istio's CA service, both from root,
// for the mesh in dir.
func agentControlPlane(t *testing.T, tokens *identity.Tokens, root *ca.CA, tc *tls.Config, dir string) *Cluster {
	t.Helper()
	policy := identity.Policy{TrustDomain: "cluster.local", Required: true, Tokens: tokens}
	sec, err := sds.New(sds.Config{CA: root, TTL: time.Hour, Identify: policy.Identify})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.NewService(&ca.Service{CA: root, Identify: policy.Identify, TTL: time.Hour, MaxTTL: 24 * time.Hour, Log: testutil.Log(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return NewCluster(t, Options{XDS: server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))},
		Secrets: sec}, Policy: &policy, Certificates: certs}, yamlSource(dir))
}

// caControlPlane is an agentControlPlane with a sealed CA and a serving
// certificate for "pusher" from a test root, which accepts client
// certificates of the mesh's root; client is what verifies it.
func caControlPlane(t *testing.T, tokens *identity.Tokens) (cp *Cluster, client *tls.Config) {
	t.Helper()
	root, _, meshRoot := sealedCA(t)
	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	tc, err := identity.ServerTLSOptionalCert(serverCert, serverKey, meshRoot, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	bootRoot, err := os.ReadFile(boot.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	return agentControlPlane(t, tokens, root, tc, t.TempDir()), &tls.Config{RootCAs: pemPool(t, bootRoot), ServerName: "pusher", MinVersion: tls.VersionTLS12}
}

// clusterTokens reviews tokens for Istio's audience with kc, the cluster
// "Kubernetes".
func clusterTokens(kc *kubetest.Cluster) *identity.Tokens {
	return &identity.Tokens{Client: kc.Client, Cluster: "Kubernetes", Audiences: []string{"istio-ca"}, TrustDomain: "cluster.local"}
}

// sealedCA is the mesh's CA with its root kept in etcd, the etcd client,
// and a file holding the root (what authenticates proxies' certificates).
func sealedCA(t *testing.T) (*ca.CA, *clientv3.Client, string) {
	t.Helper()
	_, etcd := testutil.Etcd(t)
	root, err := ca.FromStore(testutil.Context(t), store.New(etcd), "cluster.local", ca.SealKeys{make([]byte, 32)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(file, root.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return root, etcd, file
}

// serviceAccounts creates service accounts in ns.
func serviceAccounts(t *testing.T, kc *kubetest.Cluster, ns string, names ...string) {
	t.Helper()
	for _, sa := range names {
		if _, err := kc.Client.CoreV1().ServiceAccounts(ns).Create(testutil.Context(t), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// saToken is a service account's token for an audience, bound to an
// object when bound is set.
func saToken(t *testing.T, kc *kubetest.Cluster, ns, account, audience string, bound *authnv1.BoundObjectReference) string {
	t.Helper()
	tr, err := kc.Client.CoreV1().ServiceAccounts(ns).CreateToken(testutil.Context(t), account, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, BoundObjectRef: bound}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// createCertificate asks the CA service at addr over TLS (tc) for a
// certificate over csr, with a token ("": none) and tc's client
// certificate, if any.
func createCertificate(ctx context.Context, t *testing.T, addr string, tc *tls.Config, token, csr string) (*pb.IstioCertificateResponse, error) {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return pb.NewIstioCertificateServiceClient(conn).CreateCertificate(rctx, &pb.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
}

// pemPool is a pool of a PEM bundle's certificates.
func pemPool(t *testing.T, bundle []byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("no PEM certificate")
	}
	return pool
}

// TestIstioAgentCertificates: what Istio's agent does at its caAddress,
// against the real API server: a service account token for audience
// istio-ca gets a certificate for the account's SPIFFE identity over the
// agent's own key (the chain ending in the mesh's root); that certificate
// alone renews it. Another audience, a forged token, a token whose pod is
// gone, a CSR naming another namespace's identity, and no credential are
// refused.
func TestIstioAgentCertificates(t *testing.T) {
	kc := kubetest.Get(t)
	ns := kc.Namespace(t, nil)
	ctx := testutil.Context(t)
	serviceAccounts(t, kc, ns, "agent")
	cp, client := caControlPlane(t, clusterTokens(kc))
	// ask calls CreateCertificate with a token ("": none) or a client
	// certificate (nil: none).
	ask := func(tok string, cert *tls.Certificate, csr string) (*pb.IstioCertificateResponse, error) {
		cfg := client.Clone()
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		return createCertificate(ctx, t, cp.ads, cfg, tok, csr)
	}
	me := "spiffe://cluster.local/ns/" + ns + "/sa/agent"
	csr, key := agentCSR(t, me)
	resp, err := ask(saToken(t, kc, ns, "agent", "istio-ca", nil), nil, csr)
	if err != nil {
		t.Fatalf("the agent's first certificate: %v", err)
	}
	leaf := parseLeaf(t, []byte(resp.CertChain[0]))
	roots := pemPool(t, []byte(resp.CertChain[len(resp.CertChain)-1]))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the certificate does not chain to the root returned last: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != me || !leaf.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatalf("certificate for %v over another key, want %s over the agent's", leaf.URIs, me)
	}

	// Renewal: the certificate is the credential.
	current, err := tls.X509KeyPair([]byte(resp.CertChain[0]), keyPEM(t, key))
	if err != nil {
		t.Fatal(err)
	}
	renewCSR, _ := agentCSR(t, me)
	if _, err := ask("", &current, renewCSR); err != nil {
		t.Errorf("renewal with the current certificate: %v", err)
	}

	// A token bound to a pod that is gone is no credential.
	pod, err := kc.Client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-0"},
		Spec: corev1.PodSpec{ServiceAccountName: "agent", Containers: []corev1.Container{{Name: "app", Image: "app"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	orphan := saToken(t, kc, ns, "agent", "istio-ca", &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	if err := kc.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	other, _ := agentCSR(t, "spiffe://cluster.local/ns/kube-system/sa/agent")
	for _, c := range []struct {
		name, token, csr string
		code             codes.Code
	}{
		{"another audience", saToken(t, kc, ns, "agent", "kubernetes", nil), csr, codes.Unauthenticated},
		{"a forged token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06YWRtaW4ifQ.c2lnbmF0dXJl", csr, codes.Unauthenticated},
		{"a token whose pod is gone", orphan, csr, codes.Unauthenticated},
		{"a CSR naming another namespace's identity", saToken(t, kc, ns, "agent", "istio-ca", nil), other, codes.PermissionDenied},
		{"no credential", "", csr, codes.Unauthenticated},
	} {
		if _, err := ask(c.token, nil, c.csr); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
}

// TestTokensOfSeveralClusters: Istio's agent names its cluster in the
// ClusterID request metadata, and that cluster's API server reviews its
// token (two real apiservers here, "Kubernetes" and "east"). A token of one
// cluster presented as the other's, and a cluster the pushers do not
// serve, are refused.
func TestTokensOfSeveralClusters(t *testing.T) {
	local, east := kubetest.Get(t), kubetest.StartAnother(t)
	ns := local.Namespace(t, nil)
	east.CreateNamespace(t, ns, nil)
	serviceAccounts(t, local, ns, "agent")
	serviceAccounts(t, east, ns, "agent")
	ctx := testutil.Context(t)
	tokens := clusterTokens(local)
	tokens.Remote = map[string]kubernetes.Interface{"east": east.Client}
	cp, client := caControlPlane(t, tokens)
	csr, _ := agentCSR(t, "spiffe://cluster.local/ns/"+ns+"/sa/agent")
	localToken, eastToken := saToken(t, local, ns, "agent", "istio-ca", nil), saToken(t, east, ns, "agent", "istio-ca", nil)
	for _, c := range []struct {
		name, cluster, token string
		code                 codes.Code
	}{
		{"east's token, naming east", "east", eastToken, codes.OK},
		{"the local token, naming its cluster", "Kubernetes", localToken, codes.OK},
		{"the local token, naming none", "", localToken, codes.OK},
		{"east's token, naming none", "", eastToken, codes.Unauthenticated},
		{"the local token, naming east", "east", localToken, codes.Unauthenticated},
		{"a cluster not served", "west", eastToken, codes.Unauthenticated},
	} {
		cctx := ctx
		if c.cluster != "" {
			cctx = metadata.AppendToOutgoingContext(ctx, "ClusterID", c.cluster)
		}
		_, err := createCertificate(cctx, t, cp.ads, client, c.token, csr)
		if status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
		if c.cluster == "west" && !strings.Contains(fmt.Sprint(err), `cluster "west"`) {
			t.Errorf("%s: %v, want a reason naming the cluster", c.name, err)
		}
	}
}

// keyPEM encodes a private key as PEM.
func keyPEM(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

// agentFiles writes what an agent writes for grpc-go from its CA's answer
// and the roots of istio-ca-root-cert, and returns the bootstrap's channel
// credentials and certificate provider over them.
func agentFiles(t *testing.T, resp *pb.IstioCertificateResponse, key *ecdsa.PrivateKey, rootPEM string) (channel, providers string) {
	t.Helper()
	out := t.TempDir()
	cert, keyFile, rootFile := filepath.Join(out, "cert-chain.pem"), filepath.Join(out, "key.pem"), filepath.Join(out, "root-cert.pem")
	for file, content := range map[string][]byte{cert: []byte(strings.Join(resp.CertChain[:len(resp.CertChain)-1], "")),
		keyFile: keyPEM(t, key), rootFile: []byte(rootPEM)} {
		if err := os.WriteFile(file, content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	channel = fmt.Sprintf(`{"type": "tls", "config": {"ca_certificate_file": %q, "certificate_file": %q, "private_key_file": %q}}`, rootFile, cert, keyFile)
	providers = fmt.Sprintf(`, "certificate_providers": {"default": {"plugin_name": "file_watcher",
		"config": {"certificate_file": %q, "private_key_file": %q, "ca_certificate_file": %q, "refresh_interval": "1s"}}}`, cert, keyFile, rootFile)
	return channel, providers
}

// publishedRoots runs the ingesters' publisher of the mesh's roots for
// the namespaces selector selects, and returns the roots of ns's
// istio-ca-root-cert once written.
func publishedRoots(t *testing.T, kc *kubetest.Cluster, etcd *clientv3.Client, selector map[string]string, ns string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(testutil.Context(t))
	published := make(chan error, 1)
	go func() {
		published <- (&kube.RootCerts{Client: kc.Client, Store: store.New(etcd), NamespaceSelector: labels.SelectorFromSet(selector), Log: testutil.Log(t)}).Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-published })
	var roots string
	testutil.Eventually(t, 30*time.Second, "the ingester writes istio-ca-root-cert", func() (bool, string) {
		cm, err := kc.Client.CoreV1().ConfigMaps(ns).Get(ctx, kube.RootCertConfigMap, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		roots = cm.Data[kube.RootCertKey]
		return roots != "", "empty"
	})
	return roots
}

// TestIstioAgentFlow does what Istio's agent does for a proxyless gRPC
// workload, step by step, against the real API server: it reads the
// mesh's roots from the istio-ca-root-cert ConfigMap the ingester wrote,
// verifies the pushers' ADS certificate (signed by the mesh's CA for the
// name it dials) against them, gets a certificate for its service account
// with a token for audience istio-ca, and writes the files grpc-go reads.
// A grpc-go xDS server and client, each with what its agent got, then talk
// Istio's mutual TLS (ISTIO_MUTUAL, STRICT), routed by the pushers.
func TestIstioAgentFlow(t *testing.T) {
	kc := kubetest.Get(t)
	selector := map[string]string{"agent-flow": fmt.Sprint(time.Now().UnixNano())}
	ns := kc.Namespace(t, selector)
	ctx := testutil.Context(t)
	serviceAccounts(t, kc, ns, "greeter", "client")
	root, etcd, meshRoot := sealedCA(t)
	// The pushers publish the roots; an ingester writes the ConfigMaps.
	if err := ca.PublishTrust(ctx, store.New(etcd), root); err != nil {
		t.Fatal(err)
	}
	rootPEM := publishedRoots(t, kc, etcd, selector, ns)

	// The pushers: ADS with a certificate of the mesh's CA, proxies
	// authenticated by their token or their certificate.
	tc, _, err := identity.ServerTLSFromSource(root.ServingCertificate([]string{"localhost", "istiod.istio-system.svc"}, time.Hour), meshRoot, true, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cp := agentControlPlane(t, clusterTokens(kc), root, tc, dir)
	_, port, _ := net.SplitHostPort(cp.ads)
	discovery := "localhost:" + port // the name the certificate carries

	// agent gets an account's certificate, verifying the pushers against
	// istio-ca-root-cert, and writes what grpc-go reads.
	agent := func(account string) (channel, providers string) {
		csr, key := agentCSR(t, "spiffe://cluster.local/ns/"+ns+"/sa/"+account)
		resp, err := createCertificate(ctx, t, discovery, &tls.Config{RootCAs: pemPool(t, []byte(rootPEM)), MinVersion: tls.VersionTLS12},
			saToken(t, kc, ns, account, "istio-ca", nil), csr)
		if err != nil {
			t.Fatalf("%s's agent: CreateCertificate, verifying the pushers against istio-ca-root-cert: %v", account, err)
		}
		return agentFiles(t, resp, key, rootPEM)
	}

	serverChannel, serverProviders := agent("greeter")
	srv := startXDSServerIn(t, ns, discovery, "sidecar~127.0.0.1~greeter-1."+ns+"~"+ns+".svc.cluster.local", serverChannel, serverProviders)
	writeMesh(t, dir, "greeter.yaml", testutil.StrictGreeter(ns, srv.backend.port))
	srv.waitServing(t)

	channel, providers := agent("client")
	conn := dialMutualXDS(t, discovery, ns, "client-1", channel, providers, "xds:///greeter."+ns+".svc.cluster.local:50051")
	waitFor(t, conn, codes.OK, codes.OK, "the client calls the greeter over Istio's mutual TLS")
}
