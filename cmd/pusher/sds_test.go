package main

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestPusherServesCertificates runs the pusher with ADS over mTLS: a proxy
// with a bootstrap certificate for demo/reviews is served a workload
// certificate for that identity, signed by the root the pusher created and
// kept in etcd.
func TestPusherServesCertificates(t *testing.T) {
	etcd, cli := testutil.Etcd(t)
	nats, _ := testutil.NATS(t)
	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	proxyCert, proxyKey := boot.Issue(t, "reviews", "spiffe://cluster.local/ns/demo/sa/reviews")
	ads, admin := testutil.FreeAddr(t), testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--etcd-endpoints", etcd.Endpoint, "--nats-url", nats.URL,
			"--ads-cert-file", serverCert, "--ads-key-file", serverKey, "--ads-client-ca-file", boot.CertFile,
			"--ads-addr", ads, "--admin-addr", admin, "--log-level", "warn"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pusher: %v", err)
		}
	}()

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
	for _, a := range resp.Resources {
		var s tlsv3.Secret
		if err := a.UnmarshalTo(&s); err != nil {
			t.Fatal(err)
		}
		if s.Name == "default" {
			block, _ := pem.Decode(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
			if leaf, err = x509.ParseCertificate(block.Bytes); err != nil {
				t.Fatal(err)
			}
		}
	}
	stored, err := cli.Get(context.Background(), ca.RootKey)
	if err != nil || len(stored.Kvs) != 1 {
		t.Fatalf("no root in etcd: %v", err)
	}
	var root struct{ Cert string }
	if err := json.Unmarshal(stored.Kvs[0].Value, &root); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(root.Cert))
	if leaf == nil || len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/demo/sa/reviews" {
		t.Fatalf("workload certificate %v", leaf)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("not signed by the root in etcd: %v", err)
	}
}
