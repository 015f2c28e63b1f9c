package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/store"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestPusherServesCertificates runs the pusher with ADS over mTLS: a proxy
// with a bootstrap certificate for demo/reviews is served a workload
// certificate for that identity, signed by the root the pusher created and
// kept in etcd sealed with --ca-seal-key-file's key: etcd holds no key in
// the clear.
func TestPusherServesCertificates(t *testing.T) {
	etcd, cli := testutil.Etcd(t)
	nats, _ := testutil.NATS(t)
	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	proxyCert, proxyKey := boot.Issue(t, "reviews", "spiffe://cluster.local/ns/demo/sa/reviews")
	ads := runSealedPusher(t, etcd.Endpoint, nats.URL, "--ads-cert-file", serverCert, "--ads-key-file", serverKey, "--ads-client-ca-file", boot.CertFile)

	tc, err := (&transport.TLSInfo{TrustedCAFile: boot.CertFile, CertFile: proxyCert, KeyFile: proxyKey}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(ads, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var resp *discovery.DiscoveryResponse
	testutil.Eventually(t, 30*time.Second, "the pusher serves the proxy its certificate", func() (bool, string) {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
		if err != nil {
			return false, err.Error()
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "sidecar~10.0.0.1~reviews-1.demo~demo.svc.cluster.local"},
			TypeUrl: resource.SecretType, ResourceNames: []string{"default", "ROOTCA"}}); err != nil {
			return false, err.Error()
		}
		resp, err = s.Recv()
		if err != nil {
			return false, err.Error()
		}
		return len(resp.Resources) == 2, "not both secrets"
	})
	var leaf *x509.Certificate
	pool := x509.NewCertPool()
	for _, a := range resp.Resources {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		if s.Name == "ROOTCA" {
			pool.AppendCertsFromPEM(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
		}
		if s.Name == "default" {
			block, _ := pem.Decode(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			if leaf, err = x509.ParseCertificate(block.Bytes); err != nil {
				t.Fatal(err)
			}
		}
	}
	stored, err := cli.Get(context.Background(), "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	var sealed bool
	for _, kv := range stored.Kvs {
		if bytes.Contains(kv.Value, []byte("PRIVATE KEY")) {
			t.Errorf("etcd holds a key in the clear at %s", kv.Key)
		}
		sealed = sealed || string(kv.Key) == ca.SealedRootKey
	}
	if !sealed {
		t.Errorf("no root at %s", ca.SealedRootKey)
	}
	if leaf == nil || len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/demo/sa/reviews" {
		t.Fatalf("workload certificate %v", leaf)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("not signed by the root served as ROOTCA: %v", err)
	}
}

// TestADSCertificateFromTheMeshCA runs the pusher with --ads-cert-names: it
// serves ADS with a certificate its own CA signs for those names, which a
// client verifies against the roots the pusher published for the
// istio-ca-root-cert ConfigMaps (as Istio's agent verifies istiod), and
// which a client dialling another name refuses.
func TestADSCertificateFromTheMeshCA(t *testing.T) {
	etcd, cli := testutil.Etcd(t)
	nats, _ := testutil.NATS(t)
	boot := testutil.NewCA(t)
	proxyCert, proxyKey := boot.Issue(t, "reviews", "spiffe://cluster.local/ns/demo/sa/reviews")
	ads := runSealedPusher(t, etcd.Endpoint, nats.URL, "--ads-cert-names", "shardpilot-pusher.mesh.svc,istiod.istio-system.svc", "--ads-client-ca-file", boot.CertFile)
	var roots []byte
	testutil.Eventually(t, 30*time.Second, "the pusher publishes the mesh's roots", func() (bool, string) {
		resp, err := cli.Get(context.Background(), store.TrustKey)
		if err != nil || len(resp.Kvs) == 0 {
			return false, fmt.Sprint("nothing at ", store.TrustKey, err)
		}
		roots = resp.Kvs[0].Value
		return true, ""
	})
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(roots) {
		t.Fatalf("%s holds no certificate", store.TrustKey)
	}
	proxy, err := tls.LoadX509KeyPair(proxyCert, proxyKey)
	if err != nil {
		t.Fatal(err)
	}
	handshake := func(name string) error {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ads, &tls.Config{RootCAs: pool, ServerName: name,
			Certificates: []tls.Certificate{proxy}, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS12})
		if err != nil {
			return err
		}
		return c.Close()
	}
	testutil.Eventually(t, 30*time.Second, "ADS verifies as istiod.istio-system.svc", func() (bool, string) {
		err := handshake("istiod.istio-system.svc")
		return err == nil, fmt.Sprint(err)
	})
	if err := handshake("shardpilot-pusher.mesh.svc"); err != nil {
		t.Errorf("the pushers' Service name: %v", err)
	}
	if err := handshake("elsewhere.example.com"); err == nil {
		t.Error("a client dialling another name accepted the certificate")
	}
}

// runSealedPusher runs the pusher with a CA whose root it keeps in etcd
// sealed, and the flags given, until the test ends; it returns the ADS
// address.
func runSealedPusher(t *testing.T, etcd, nats string, flags ...string) string {
	t.Helper()
	ads, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	seal := filepath.Join(t.TempDir(), "seal")
	if err := os.WriteFile(seal, []byte(base64.StdEncoding.EncodeToString(make([]byte, 32))+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"--etcd-endpoints", etcd, "--nats-url", nats, "--ca-seal-key-file", seal,
			"--ads-addr", ads, "--admin-addr", admin, "--log-level", "warn"}, flags...))
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pusher: %v", err)
		}
	})
	return ads
}
