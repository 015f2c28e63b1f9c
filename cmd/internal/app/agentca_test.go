package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/sds"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	accounts := kc.Client.CoreV1().ServiceAccounts(ns)
	if _, err := accounts.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "agent"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(audience string, bound *authnv1.BoundObjectReference) string {
		tr, err := accounts.CreateToken(ctx, "agent", &authnv1.TokenRequest{
			Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}, BoundObjectRef: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	_, etcd := testutil.Etcd(t)
	root, err := ca.FromStore(ctx, etcd, "cluster.local", ca.SealKeys{make([]byte, 32)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Proxies' certificates from the mesh's CA authenticate them.
	meshRoot := filepath.Join(t.TempDir(), "root.pem")
	if err := os.WriteFile(meshRoot, root.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	tc, err := identity.ServerTLSOptionalCert(serverCert, serverKey, meshRoot, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	policy := identity.Policy{TrustDomain: "cluster.local", Required: true,
		Tokens: &identity.Tokens{Client: kc.Client, Audiences: []string{"istio-ca"}, TrustDomain: "cluster.local"}}
	sec, err := sds.New(sds.Config{CA: root, TTL: time.Hour, Identify: policy.Identify})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := ca.NewService(&ca.Service{CA: root, Identify: policy.Identify, TTL: time.Hour, MaxTTL: 24 * time.Hour, Log: testutil.Log(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlaneWith(t, cpOptions{xds: server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))},
		Authorize: policy.Authorize, Secrets: sec}, policy: &policy, certificates: certs}, yamlSource(t.TempDir()))

	// ask calls CreateCertificate over TLS with a token ("": none) or a
	// client certificate (nil: none).
	ask := func(tok string, cert *tls.Certificate, csr string) (*pb.IstioCertificateResponse, error) {
		roots := x509.NewCertPool()
		pemBytes, err := os.ReadFile(boot.CertFile)
		if err != nil {
			t.Fatal(err)
		}
		roots.AppendCertsFromPEM(pemBytes)
		cfg := &tls.Config{RootCAs: roots, ServerName: "pusher", MinVersion: tls.VersionTLS12}
		if cert != nil {
			cfg.Certificates = []tls.Certificate{*cert}
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}
		if tok != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
		}
		conn, err := grpc.NewClient(cp.ads, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return pb.NewIstioCertificateServiceClient(conn).CreateCertificate(rctx, &pb.IstioCertificateRequest{Csr: csr, ValidityDuration: 3600})
	}
	me := "spiffe://cluster.local/ns/" + ns + "/sa/agent"
	csr, key := agentCSR(t, me)
	resp, err := ask(token("istio-ca", nil), nil, csr)
	if err != nil {
		t.Fatalf("the agent's first certificate: %v", err)
	}
	leaf := parseLeaf(t, []byte(resp.CertChain[0]))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM([]byte(resp.CertChain[len(resp.CertChain)-1]))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the certificate does not chain to the root returned last: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != me || !leaf.PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatalf("certificate for %v over another key, want %s over the agent's", leaf.URIs, me)
	}

	// Renewal: the certificate is the credential.
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	current, err := tls.X509KeyPair([]byte(resp.CertChain[0]), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
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
	orphan := token("istio-ca", &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID})
	if err := kc.Client.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	other, _ := agentCSR(t, "spiffe://cluster.local/ns/kube-system/sa/agent")
	for _, c := range []struct {
		name, token, csr string
		code             codes.Code
	}{
		{"another audience", token("kubernetes", nil), csr, codes.Unauthenticated},
		{"a forged token", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6a3ViZS1zeXN0ZW06YWRtaW4ifQ.c2lnbmF0dXJl", csr, codes.Unauthenticated},
		{"a token whose pod is gone", orphan, csr, codes.Unauthenticated},
		{"a CSR naming another namespace's identity", token("istio-ca", nil), other, codes.PermissionDenied},
		{"no credential", "", csr, codes.Unauthenticated},
	} {
		if _, err := ask(c.token, nil, c.csr); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
}
