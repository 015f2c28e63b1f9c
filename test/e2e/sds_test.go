package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/sds"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	xdscreds "google.golang.org/grpc/credentials/xds"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"
)

// secrets is what one SDS response carried.
type secrets struct {
	certPEM, keyPEM, rootPEM []byte
	leaf                     *x509.Certificate
	version                  string
}

// sdsClient is a proxy fetching its secrets over ADS with a bootstrap
// certificate, as an agent does: it ACKs each response and hands it on.
type sdsClient struct {
	rx   *receiver[*discovery.DiscoveryResponse]
	send func(*discovery.DiscoveryRequest) error
	// held is what it holds: a response carries the secrets that changed.
	held secrets
}

func newSDSClient(t *testing.T, ads, caFile, cert, key, nodeID string) *sdsClient {
	t.Helper()
	conn := dialTLS(t, ads, caFile, cert, key)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c := &sdsClient{rx: receive(s), send: s.Send}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: nodeID}, TypeUrl: resource.SecretType,
		ResourceNames: []string{sds.WorkloadSecret, sds.RootSecret}}); err != nil {
		t.Fatal(err)
	}
	return c
}

// next waits for the next response, ACKs it and returns its secrets.
func (c *sdsClient) next(t *testing.T, within time.Duration) secrets {
	t.Helper()
	resp, err := c.rx.next(within)
	if err != nil {
		t.Fatalf("SDS: %v", err)
	}
	if err := c.send(&discovery.DiscoveryRequest{TypeUrl: resource.SecretType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce,
		ResourceNames: []string{sds.WorkloadSecret, sds.RootSecret}}); err != nil {
		t.Fatal(err)
	}
	got := c.held
	got.version = resp.VersionInfo
	for _, a := range resp.Resources {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		switch s.Name {
		case sds.WorkloadSecret:
			got.certPEM = s.GetTlsCertificate().GetCertificateChain().GetInlineBytes()
			got.keyPEM = s.GetTlsCertificate().GetPrivateKey().GetInlineBytes()
		case sds.RootSecret:
			got.rootPEM = s.GetValidationContext().GetTrustedCa().GetInlineBytes()
		}
	}
	if block, _ := pem.Decode(got.certPEM); block != nil {
		got.leaf, _ = x509.ParseCertificate(block.Bytes)
	}
	if got.leaf == nil || got.rootPEM == nil || got.keyPEM == nil {
		t.Fatalf("SDS responses without a workload certificate, its key and the root: %d resources", len(resp.Resources))
	}
	c.held = got
	return got
}

// write puts the secrets where an agent puts them for grpc-go's
// file-watcher certificate provider, and returns the files.
func (s secrets) write(t *testing.T, dir string) (cert, key, root string) {
	t.Helper()
	cert, key, root = filepath.Join(dir, "cert-chain.pem"), filepath.Join(dir, "key.pem"), filepath.Join(dir, "root-cert.pem")
	for f, b := range map[string][]byte{cert: s.certPEM, key: s.keyPEM, root: s.rootPEM} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return cert, key, root
}

// securedControlPlane serves ADS over mTLS with bootstrap certificates of
// the test CA, and workload certificates of the mesh's CA (its root kept
// in etcd) over SDS.
func securedControlPlane(t *testing.T, ttl time.Duration, sources ...source) (*Cluster, *testutil.CA) {
	t.Helper()
	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	tc, err := identity.ServerTLS(serverCert, serverKey, boot.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	_, etcd := testutil.Etcd(t)
	root, err := ca.FromStore(testutil.Context(t), store.New(etcd), "cluster.local", ca.SealKeys{make([]byte, 32)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := sds.New(sds.Config{CA: root, TTL: ttl, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sec.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	cp := NewCluster(t, Options{XDS: server.Config{
		GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))},
		Secrets:     sec,
	}, Policy: &identity.Policy{TrustDomain: "cluster.local", Required: true}}, sources...)
	return cp, boot
}

// TestWorkloadCertificates: an authenticated proxy is served a workload
// certificate for its own SPIFFE identity and the mesh's root over SDS;
// proxies of one identity share it; it is issued again before it expires
// and the new one reaches the proxy without a request.
func TestWorkloadCertificates(t *testing.T) {
	const ttl = 6 * time.Second // renewed after 4 s
	cp, boot := securedControlPlane(t, ttl, yamlSource(t.TempDir()))
	cert, key := boot.Issue(t, "reviews", "spiffe://cluster.local/ns/demo/sa/reviews")
	a := newSDSClient(t, cp.ads, boot.CertFile, cert, key, "sidecar~10.0.0.1~reviews-a.demo~demo.svc.cluster.local")
	first := a.next(t, 10*time.Second)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(first.rootPEM)
	if _, err := first.leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("the workload certificate does not chain to ROOTCA: %v", err)
	}
	if len(first.leaf.URIs) != 1 || first.leaf.URIs[0].String() != "spiffe://cluster.local/ns/demo/sa/reviews" {
		t.Errorf("issued for %v, want the proxy's identity", first.leaf.URIs)
	}
	if _, err := tls.X509KeyPair(first.certPEM, first.keyPEM); err != nil {
		t.Errorf("the key does not match the certificate: %v", err)
	}
	if life := first.leaf.NotAfter.Sub(first.leaf.NotBefore); life > ttl+6*time.Minute {
		t.Errorf("valid for %s, want the %s lifetime (plus the backdating)", life, ttl)
	}

	// The config dump (shardctl proxy-config secrets) shows the proxy's
	// certificates, never a key.
	rec := httptest.NewRecorder()
	cp.dump.ServeHTTP(rec, httptest.NewRequest("GET", "/debug/config_dump?proxy="+url.QueryEscape("sidecar~10.0.0.1~reviews-a.demo~demo.svc.cluster.local"), nil))
	var dump struct {
		Identity  string `json:"identity"`
		Resources struct {
			Secret []app.SecretSummary `json:"Secret"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &dump); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range dump.Resources.Secret {
		if len(s.Certificates) > 0 {
			c := s.Certificates[0]
			got[s.Name] = s.Kind + " " + c.Serial + " " + strings.Join(c.URIs, ",")
		}
	}
	rootBlock, _ := pem.Decode(first.rootPEM)
	root, err := x509.ParseCertificate(rootBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"default": "certificate " + first.leaf.SerialNumber.Text(16) + " spiffe://cluster.local/ns/demo/sa/reviews",
		"ROOTCA": "trust " + root.SerialNumber.Text(16) + " "}
	if dump.Identity != "spiffe://cluster.local/ns/demo/sa/reviews" || !maps.Equal(got, want) {
		t.Errorf("the config dump's secrets: identity %q, %v, want %v", dump.Identity, got, want)
	}
	if body := rec.Body.String(); strings.Contains(body, "PRIVATE KEY") || strings.Contains(body, "privateKey") || strings.Contains(body, "private_key") {
		t.Error("the config dump holds a private key")
	}

	b := newSDSClient(t, cp.ads, boot.CertFile, cert, key, "sidecar~10.0.0.2~reviews-b.demo~demo.svc.cluster.local")
	if shared := b.next(t, 10*time.Second); shared.leaf.SerialNumber.Cmp(first.leaf.SerialNumber) != 0 {
		t.Error("two proxies of one identity were issued two certificates")
	}

	// Before two thirds of its life have passed, a new one is pushed.
	renewed := a.next(t, ttl)
	if renewed.leaf.SerialNumber.Cmp(first.leaf.SerialNumber) == 0 || renewed.version == first.version {
		t.Error("the renewal pushed the same certificate")
	}
	if !renewed.leaf.NotAfter.After(first.leaf.NotAfter) || time.Now().After(first.leaf.NotAfter) {
		t.Errorf("renewed at %s, the old one expires at %s", time.Now().Format(time.TimeOnly), first.leaf.NotAfter.Format(time.TimeOnly))
	}
	if string(renewed.rootPEM) != string(first.rootPEM) {
		t.Error("the root changed")
	}
}

// TestIstioMutual: a DestinationRule with ISTIO_MUTUAL makes a grpc-go xDS
// client call its backend over mTLS with workload certificates served over
// SDS: an agent fetches them and writes them where the client's file-watcher
// certificate provider reads them; the backend, with its own workload
// certificate, requires a client certificate of the mesh's root and sees
// the client's SPIFFE identity. A client without one is refused.
func TestIstioMutual(t *testing.T) {
	dir := t.TempDir()
	cp, boot := securedControlPlane(t, time.Hour, yamlSource(dir))

	// The backend's agent, then the backend over mTLS.
	bCert, bKey := boot.Issue(t, "greeter", "spiffe://cluster.local/ns/demo/sa/greeter")
	backendSecrets := newSDSClient(t, cp.ads, boot.CertFile, bCert, bKey, "sidecar~127.0.0.1~greeter.demo~demo.svc.cluster.local").next(t, 10*time.Second)
	b, roots, caller := mutualBackend(t, backendSecrets)
	// rule is the greeter's ISTIO_MUTUAL DestinationRule, with subject alt
	// names when any are given.
	rule := func(sans ...string) string {
		names := ""
		if len(sans) > 0 {
			names = fmt.Sprintf(", subjectAltNames: [%q]", sans[0])
		}
		return fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: demo}
spec:
  host: greeter.demo.svc.cluster.local
  trafficPolicy:
    tls: {mode: ISTIO_MUTUAL%s}
`, names)
	}
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b), rule()))

	// The client's agent writes its workload certificate.
	cCert, cKey := boot.Issue(t, "client", "spiffe://cluster.local/ns/demo/sa/client")
	files := t.TempDir()
	wCert, wKey, wRoot := newSDSClient(t, cp.ads, boot.CertFile, cCert, cKey, "agent~client.demo").next(t, 10*time.Second).write(t, files)
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "server_features": ["xds_v3"],
			"channel_creds": [{"type": "tls", "config": {"ca_certificate_file": %q, "certificate_file": %q, "private_key_file": %q}}]}],
		"node": {"id": "sidecar~127.0.0.1~client.demo~demo.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}},
		"certificate_providers": {"default": {"plugin_name": "file_watcher",
			"config": {"certificate_file": %q, "private_key_file": %q, "ca_certificate_file": %q, "refresh_interval": "1s"}}}
	}`, cp.ads, boot.CertFile, cCert, cKey, wCert, wKey, wRoot)
	creds, err := xdscreds.NewClientCredentials(xdscreds.ClientOptions{FallbackCreds: credentials.NewTLS(&tls.Config{RootCAs: roots})})
	if err != nil {
		t.Fatal(err)
	}
	dial := func() *grpc.ClientConn {
		resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient("xds:///greeter.demo.svc.cluster.local:50051", grpc.WithTransportCredentials(creds), grpc.WithResolvers(resolver))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	conn := dial()
	allOn(t, conn, b.addr, "the client calls the greeter over ISTIO_MUTUAL")
	if got := caller.Load(); got != "spiffe://cluster.local/ns/demo/sa/client" {
		t.Errorf("the backend saw %v, want the client's workload identity", got)
	}

	// subjectAltNames: the client accepts only a server certificate that
	// names one of them.
	client := "sidecar~127.0.0.1~client.demo~demo.svc.cluster.local"
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b), rule("spiffe://cluster.local/ns/demo/sa/impostor")))
	cp.serving(t, client, "spiffe://cluster.local/ns/demo/sa/impostor")
	wrong := dial() // a new connection, made under the new rule
	testutil.Eventually(t, 20*time.Second, "a server whose certificate names another identity to be refused", func() (bool, string) {
		addr, err := call(wrong)
		return err != nil, "served by " + addr
	})
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b), rule("spiffe://cluster.local/ns/demo/sa/greeter")))
	cp.serving(t, client, "spiffe://cluster.local/ns/demo/sa/greeter")
	allOn(t, dial(), b.addr, "the server whose certificate names the identity is called")

	// A client without a workload certificate is refused by the backend.
	plain, err := grpc.NewClient(b.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := call(plain); err == nil {
		t.Error("a client without a workload certificate was served")
	}
}

// mutualBackend serves the health service over mutual TLS with the
// secrets an agent fetched, requiring a client certificate of the mesh's
// root; caller holds the SPIFFE ID of the last client.
func mutualBackend(t *testing.T, backendSecrets secrets) (backend, *x509.CertPool, *atomic.Value) {
	t.Helper()
	pair, err := tls.X509KeyPair(backendSecrets.certPEM, backendSecrets.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(backendSecrets.rootPEM)
	var caller atomic.Value
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert,
		VerifyPeerCertificate: func(_ [][]byte, chains [][]*x509.Certificate) error {
			if len(chains) > 0 && len(chains[0][0].URIs) > 0 {
				caller.Store(chains[0][0].URIs[0].String())
			}
			return nil
		},
	})))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	b := backend{addr: lis.Addr().String(), port: lis.Addr().(*net.TCPAddr).Port}
	return b, roots, &caller
}
