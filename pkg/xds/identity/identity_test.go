package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestParse(t *testing.T) {
	u, _ := url.Parse("spiffe://cluster.local/ns/demo/sa/reviews")
	if id, err := Parse(u); err != nil || id != (ID{"cluster.local", "demo", "reviews"}) || id.String() != u.String() {
		t.Errorf("Parse(%s) = %v, %v", u, id, err)
	}
	for _, bad := range []string{"https://cluster.local/ns/demo/sa/x", "spiffe:///ns/demo/sa/x", "spiffe://td/ns/demo", "spiffe://td/ns//sa/x", "spiffe://td/sa/x/ns/demo", "spiffe://td/ns/a/sa/b/c"} {
		u, _ := url.Parse(bad)
		if _, err := Parse(u); err == nil {
			t.Errorf("Parse(%s) succeeded", bad)
		}
	}
}

// peerWith returns a context whose peer presented the certificate in file.
func peerWith(t *testing.T, certFile string) context.Context {
	t.Helper()
	if certFile == "" {
		return peer.NewContext(context.Background(), &peer.Peer{})
	}
	pair, err := tls.LoadX509KeyPair(certFile, strings.Replace(certFile, ".pem", "-key.pem", 1))
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	info := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: info})
}

func node(ns string) *core.Node {
	n := &core.Node{Id: "proxy-1"}
	if ns != "" {
		n.Metadata = &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(ns)}}
	}
	return n
}

func TestAuthorize(t *testing.T) {
	ca := testutil.NewCA(t)
	demo, _ := ca.Issue(t, "demo", "spiffe://cluster.local/ns/demo/sa/app")
	two, _ := ca.Issue(t, "two", "spiffe://cluster.local/ns/demo/sa/app", "spiffe://cluster.local/ns/other/sa/app")
	p := Policy{TrustDomain: "cluster.local", Required: true}

	got, err := p.Authorize(peerWith(t, demo), node(""))
	if err != nil || got.GetMetadata().GetFields()["NAMESPACE"].GetStringValue() != "demo" {
		t.Errorf("a node claiming no namespace: %v %v, want demo's", got, err)
	}
	in := node("demo")
	if got, err := p.Authorize(peerWith(t, demo), in); err != nil || got != in {
		t.Errorf("a node claiming its own namespace: %v, want it served as it is", err)
	}
	for name, c := range map[string]struct {
		ctx  context.Context
		node *core.Node
		code codes.Code
	}{
		"another namespace":    {peerWith(t, demo), node("payments"), codes.PermissionDenied},
		"two SPIFFE IDs":       {peerWith(t, two), node("demo"), codes.PermissionDenied},
		"no certificate":       {peerWith(t, ""), node("demo"), codes.Unauthenticated},
		"no peer at all":       {context.Background(), node("demo"), codes.Unauthenticated},
		"another trust domain": {peerWith(t, demo), node("demo"), codes.PermissionDenied},
	} {
		pol := p
		if name == "another trust domain" {
			pol.TrustDomain = "mesh.example"
		}
		if _, err := pol.Authorize(c.ctx, c.node); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %s", name, err, c.code)
		}
	}
	if _, err := (Policy{}).Authorize(peerWith(t, ""), node("x")); err != nil {
		t.Errorf("not required, no certificate: %v", err)
	}
}

// TestServerTLSReloads: a rotated certificate is served without a restart;
// a broken one keeps the last good one.
func TestServerTLSReloads(t *testing.T) {
	defer func(d time.Duration) { recheck = d }(recheck)
	recheck = 0
	ca := testutil.NewCA(t)
	certA, keyA := ca.Issue(t, "first")
	cfg, err := ServerTLS(certA, keyA, ca.CertFile, nil)
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		c, err := cfg.GetConfigForClient(nil)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(c.Certificates[0].Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if c.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Error("client certificates are not required")
		}
		return leaf.Subject.CommonName
	}
	if got := served(); got != "first" {
		t.Fatalf("serves %s", got)
	}
	certB, keyB := ca.Issue(t, "second")
	for from, to := range map[string]string{certB: certA, keyB: keyA} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := served(); got != "second" {
		t.Errorf("after rotation serves %s", got)
	}
	if err := os.WriteFile(certA, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := served(); got != "second" {
		t.Errorf("after a broken rotation serves %s, want the last good one", got)
	}
	if _, err := ServerTLS(certA, keyA, "", nil); err == nil {
		t.Error("a broken certificate was accepted at start")
	}
}
