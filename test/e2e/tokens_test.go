package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/h2flood"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/sds"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// bearer sends a service account token with every RPC.
type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }

// TestServiceAccountTokens: a proxy without a client certificate presents
// its Kubernetes service account token; the pusher has the real API server
// review it and serves the proxy as that service account: its namespace's
// config, and a workload certificate for its SPIFFE identity over SDS (the
// way an agent bootstraps). A token for another audience, a forged token,
// a node claiming another namespace, and no credential at all are refused.
func TestServiceAccountTokens(t *testing.T) {
	kc := kubetest.Get(t)
	ns := kc.Namespace(t, nil)
	ctx := testutil.Context(t)
	if _, err := kc.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "client"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	token := func(audience string) string {
		tr, err := kc.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "client", &authnv1.TokenRequest{
			Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}

	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	tc, err := identity.ServerTLSOptionalCert(serverCert, serverKey, boot.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	policy := identity.Policy{TrustDomain: "cluster.local", Required: true,
		Tokens: &identity.Tokens{Client: kc.Client, Audiences: []string{"istio-ca"}, TrustDomain: "cluster.local"}}
	_, etcd := testutil.Etcd(t)
	root, err := ca.FromStore(ctx, store.New(etcd), "cluster.local", ca.SealKeys{make([]byte, 32)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	sec, err := sds.New(sds.Config{CA: root, TTL: time.Hour, Identify: policy.Identify})
	if err != nil {
		t.Fatal(err)
	}
	cp := NewCluster(t, Options{XDS: server.Config{
		GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))},
		Secrets:     sec,
	}, Policy: &policy}, yamlSource(t.TempDir()))

	d := tokenDialer{ads: cp.ads, caFile: boot.CertFile}
	leaf, err := d.certificate(t, token("istio-ca"), ns)
	if err != nil {
		t.Fatal(err)
	}
	if leaf == nil || len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/"+ns+"/sa/client" {
		t.Fatalf("workload certificate %v, want the service account's identity", leaf)
	}
	// CSDS on the ADS port identifies its callers as the proxies: one
	// without a token or certificate is refused, one with a token sees its
	// namespace's proxies only.
	csds := func(tok string) (int, error) {
		conn := d.dial(t, tok)
		defer conn.Close()
		resp, err := statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(ctx, &statusv3.ClientStatusRequest{})
		return len(resp.GetConfig()), err
	}
	if _, err := csds(""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("CSDS without a credential: %v, want Unauthenticated", err)
	}
	if _, err := csds(token("istio-ca")); err != nil {
		t.Errorf("CSDS with a token: %v", err)
	}
	for name, c := range map[string]struct {
		token, namespace string
		code             codes.Code
		says             string
	}{
		"another audience":       {token("other"), ns, codes.Unauthenticated, "audiences"},
		"a forged token":         {"eyJhbGciOiJSUzI1NiJ9.e30.c2ln", ns, codes.Unauthenticated, "not valid"},
		"another namespace":      {token("istio-ca"), "payments", codes.PermissionDenied, `claims namespace "payments"`},
		"neither token nor cert": {"", ns, codes.Unauthenticated, "service account token"},
	} {
		if _, err := d.certificate(t, c.token, c.namespace); status.Code(err) != c.code || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %s saying %q", name, err, c.code, c.says)
		}
	}
}

// tokenDialer connects to a pusher's ADS port over TLS, trusting caFile,
// presenting a service account token.
type tokenDialer struct{ ads, caFile string }

// dial connects presenting tok (none: "").
func (d tokenDialer) dial(t *testing.T, tok string) *grpc.ClientConn {
	c, err := (&transport.TLSInfo{TrustedCAFile: d.caFile}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c))}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(tok)))
	}
	conn, err := grpc.NewClient(d.ads, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// certificate asks for the workload certificate with tok (none: ""), as
// an agent whose node claims nodeNamespace.
func (d tokenDialer) certificate(t *testing.T, tok, nodeNamespace string) (*x509.Certificate, error) {
	conn := d.dial(t, tok)
	defer conn.Close()
	sctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
	if err != nil {
		return nil, err
	}
	node := &core.Node{Id: "agent~client", Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(nodeNamespace)}}}
	// A stream refused when it starts may end before the request is
	// sent (io.EOF): its status is what Recv returns.
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: []string{"default", "ROOTCA"}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	resp, err := s.Recv()
	if err != nil {
		return nil, err
	}
	for _, a := range resp.Resources {
		var sec tlsv3.Secret
		if err := a.UnmarshalTo(&sec); err != nil {
			t.Fatal(err)
		}
		if sec.Name == "default" {
			return parseLeaf(t, sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()), nil
		}
	}
	return nil, nil
}

func parseLeaf(t *testing.T, chain []byte) *x509.Certificate {
	t.Helper()
	certs, err := parsePEM(chain)
	if err != nil || len(certs) == 0 {
		t.Fatalf("certificate chain: %v", err)
	}
	return certs[0]
}

func parsePEM(b []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return out, nil
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}

// TestUnadmittedCallsReadNothing: a caller that identities are required
// of, with neither a client certificate nor a token that could be a
// service account's, is refused when its call starts, before gRPC reads
// what it sends (a 3 MB request was read whole and refused for its size
// before), and a flood of such calls with unfinished messages makes the
// pusher hold nothing; it held about 400 MiB per connection.
func TestUnadmittedCallsReadNothing(t *testing.T) {
	boot := testutil.NewCA(t)
	serverCert, serverKey := boot.Issue(t, "pusher")
	tc, err := identity.ServerTLSOptionalCert(serverCert, serverKey, boot.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	policy := identity.Policy{TrustDomain: "cluster.local", Required: true,
		Tokens: &identity.Tokens{Client: fake.NewClientset(), Audiences: []string{"istio-ca"}, TrustDomain: "cluster.local"}}
	cp := NewCluster(t, Options{XDS: server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}}, Policy: &policy},
		yamlSource(t.TempDir()))
	d := tokenDialer{ads: cp.ads, caFile: boot.CertFile}
	big := &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, Node: &core.Node{Id: "sidecar~10.0.0.1~a.default~default.svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"PAD": structpb.NewStringValue(strings.Repeat("x", 3<<20))}}}}
	for name, c := range map[string]struct {
		token string
		code  codes.Code
	}{
		"no credential":         {"", codes.Unauthenticated},
		"not a token":           {"garbage", codes.Unauthenticated},
		"a token of no account": {"eyJhbGciOiJSUzI1NiJ9.e30.c2ln", codes.Unauthenticated},
	} {
		t.Run(name, func(t *testing.T) {
			conn := d.dial(t, c.token)
			defer conn.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The send may or may not see the end first: gRPC queues
			// a message without waiting for the server's window.
			_ = s.Send(big)
			if _, err := s.Recv(); status.Code(err) != c.code {
				t.Errorf("the caller was told %v, want %s", err, c.code)
			}
		})
	}
	t.Run("a flood of unfinished messages", func(t *testing.T) { unfinishedFlood(t, cp.ads, boot.CertFile) })
}

// unfinishedFlood: what the red team ran, 3 connections of 100 streams
// each sending an unfinished 4 MB message without a credential, makes the
// pusher hold next to nothing (it held about 400 MiB per connection).
func unfinishedFlood(t *testing.T, ads, caFile string) {
	tc, err := (&transport.TLSInfo{TrustedCAFile: caFile}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	tc.NextProtos = []string{"h2"}
	before := heapInUse()
	f, err := h2flood.Start(ads, tc, "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources", 3, 100, 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	sent := f.Settle()
	grown := heapInUse() - before
	t.Logf("3 connections × 100 streams of unfinished 4 MiB messages: %d KiB sent, %d streams ended by the server, heap %+d MiB",
		sent>>10, f.Reset(), grown>>20)
	// Each refused stream may have had up to a window (1 MiB) in flight
	// when it was refused; the server drops it unread.
	if grown > 64<<20 {
		t.Errorf("the pusher's heap grew by %d MiB under the flood", grown>>20)
	}
}

// heapInUse is the process's heap in use after a collection.
func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}
