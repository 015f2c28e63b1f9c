package ca_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shardpilot/shardpilot/internal/pki"
	"math"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// newCSR returns a PEM certificate request naming uris (and dns names) as
// Istio's agent makes one.
func newCSR(t *testing.T, uris []string, dns ...string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{DNSNames: dns}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
}

// TestCertificateService: a caller gets a certificate for its own
// identity over its CSR's key, with the chain Istio returns (the
// certificate, then the root), valid for what it asked up to the maximum;
// a caller without an identity, a CSR naming another identity or a DNS
// name, and garbage are refused with a reason.
func TestCertificateService(t *testing.T) {
	test := testutil.NewCA(t)
	root, err := ca.FromFiles(test.CertFile, test.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	id := identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
	var caller struct {
		id  identity.ID
		ok  bool
		err error
	}
	svc, err := ca.NewService(&ca.Service{CA: root, TTL: time.Hour, MaxTTL: 24 * time.Hour, Log: testutil.Log(t),
		Identify: func(context.Context) (identity.ID, bool, error) { return caller.id, caller.ok, caller.err }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	caller.id, caller.ok = id, true
	ask := func(csr string, seconds int64) (*pb.IstioCertificateResponse, error) {
		return svc.CreateCertificate(context.Background(), &pb.IstioCertificateRequest{Csr: csr, ValidityDuration: seconds})
	}
	resp, err := ask(newCSR(t, []string{id.String()}), 7*24*3600)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CertChain) != 2 || resp.CertChain[1] != string(root.TrustPEM()) {
		t.Fatalf("chain of %d: want the certificate and the root", len(resp.CertChain))
	}
	leaf := verify(t, &ca.Workload{CertPEM: []byte(resp.CertChain[0])}, root.RootPEM(), id)
	if ttl := time.Until(leaf.NotAfter); ttl > 24*time.Hour || ttl < 23*time.Hour {
		t.Errorf("asked for a week, valid for %v: want the maximum, a day", ttl)
	}
	// A validity past what a Duration holds in nanoseconds is the maximum,
	// not an overflow into an already expired certificate.
	for _, huge := range []int64{math.MaxInt64, math.MaxInt64 / 1000, 1 << 34} {
		resp, err := ask(newCSR(t, []string{id.String()}), huge)
		if err != nil {
			t.Fatal(err)
		}
		leaf := verify(t, &ca.Workload{CertPEM: []byte(resp.CertChain[0])}, root.RootPEM(), id)
		if ttl := time.Until(leaf.NotAfter); ttl > 24*time.Hour || ttl < 23*time.Hour {
			t.Errorf("asked for %d s, valid for %v: want the maximum, a day", huge, ttl)
		}
	}
	if resp, err = ask(newCSR(t, nil), 0); err != nil {
		t.Fatalf("a CSR naming nothing: %v", err)
	}
	leaf = verify(t, &ca.Workload{CertPEM: []byte(resp.CertChain[0])}, root.RootPEM(), id)
	if ttl := time.Until(leaf.NotAfter); ttl > time.Hour {
		t.Errorf("asked for nothing, valid for %v: want the default, an hour", ttl)
	}

	for _, c := range []struct {
		name string
		csr  string
		code codes.Code
		set  func()
	}{
		{"another identity", newCSR(t, []string{"spiffe://cluster.local/ns/payments/sa/api"}), codes.PermissionDenied, nil},
		{"a DNS name", newCSR(t, []string{id.String()}, "cart.shop.svc"), codes.PermissionDenied, nil},
		{"garbage", "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", codes.InvalidArgument, nil},
		{"not PEM", "hello", codes.InvalidArgument, nil},
		{"no identity", newCSR(t, []string{id.String()}), codes.Unauthenticated, func() { caller.ok = false }},
		{"a bad token", newCSR(t, []string{id.String()}), codes.Unauthenticated, func() { caller.ok, caller.err = true, errors.New("the token is not valid") }},
	} {
		if c.set != nil {
			c.set()
		}
		if _, err := ask(c.csr, 0); status.Code(err) != c.code {
			t.Errorf("%s: %v, want %v", c.name, err, c.code)
		}
	}
}

// TestPerIdentityRate: one identity is signed a burst of certificates,
// then refused (ResourceExhausted, counted as "rate") until its interval
// passes; another identity is not held back by it.
func TestPerIdentityRate(t *testing.T) {
	test := testutil.NewCA(t)
	root, err := ca.FromFiles(test.CertFile, test.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	var caller identity.ID
	svc, err := ca.NewService(&ca.Service{CA: root, TTL: time.Hour, MaxTTL: time.Hour, PerIdentity: time.Hour, PerIdentityBurst: 3, Log: testutil.Log(t),
		Identify: func(context.Context) (identity.ID, bool, error) { return caller, true, nil }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	greedy := identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "greedy"}
	other := identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
	ask := func(id identity.ID) error {
		caller = id
		_, err := svc.CreateCertificate(context.Background(), &pb.IstioCertificateRequest{Csr: newCSR(t, []string{id.String()})})
		return err
	}
	for i := range 3 {
		if err := ask(greedy); err != nil {
			t.Fatalf("certificate %d of the burst: %v", i+1, err)
		}
	}
	if err := ask(greedy); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a fourth certificate within the hour: %v, want ResourceExhausted", err)
	}
	if err := ask(other); err != nil {
		t.Errorf("another identity held back: %v", err)
	}
	if _, err := ca.NewService(&ca.Service{CA: root, TTL: time.Hour, MaxTTL: time.Hour, PerIdentity: time.Second, Identify: svc.Identify}, nil); err == nil {
		t.Error("a rate without a burst was taken")
	}
}

// TestIntermediateUnderIstiosRoot: during a migration the pushers sign
// with an intermediate under the organization's Istio root (as istiod
// does from cacerts) and trust that root too: a certificate they issue
// verifies against Istio's root alone with the chain they return, and a
// certificate istiod's intermediate issues verifies against the roots
// they give their proxies. Proxies of both trust each other.
func TestIntermediateUnderIstiosRoot(t *testing.T) {
	istio := testutil.NewCA(t)
	oursCert, oursKey := istio.IssueCA(t, "shardpilot")
	theirsCert, theirsKey := istio.IssueCA(t, "istiod")
	ours, err := ca.FromFiles(oursCert, oursKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := ours.AlsoTrust(istio.CertFile); err != nil {
		t.Fatal(err)
	}
	id := identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
	svc, err := ca.NewService(&ca.Service{CA: ours, TTL: time.Hour, MaxTTL: time.Hour,
		Identify: func(context.Context) (identity.ID, bool, error) { return id, true, nil }}, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := svc.CreateCertificate(context.Background(), &pb.IstioCertificateRequest{Csr: newCSR(t, []string{id.String()})})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.CertChain) != 3 {
		t.Fatalf("chain of %d: want the certificate, the intermediate and the roots", len(resp.CertChain))
	}
	chainTo := func(leafPEM string, intermediates []string, rootsPEM []byte) error {
		block, _ := pem.Decode([]byte(leafPEM))
		leaf, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return err
		}
		inter, roots := x509.NewCertPool(), x509.NewCertPool()
		for _, c := range intermediates {
			inter.AppendCertsFromPEM([]byte(c))
		}
		roots.AppendCertsFromPEM(rootsPEM)
		_, err = leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err
	}
	istioRoot, err := os.ReadFile(istio.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := chainTo(resp.CertChain[0], resp.CertChain[1:2], istioRoot); err != nil {
		t.Errorf("istiod's proxies (trusting Istio's root) refuse ours: %v", err)
	}
	theirs, err := ca.FromFiles(theirsCert, theirsKey)
	if err != nil {
		t.Fatal(err)
	}
	w, err := theirs.Issue(identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "api"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	rest := w.CertPEM
	var parts []string
	for {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		parts = append(parts, string(pem.EncodeToMemory(block)))
	}
	if err := chainTo(parts[0], parts[1:], ours.TrustPEM()); err != nil {
		t.Errorf("our proxies refuse istiod's: %v", err)
	}
}

// TestMigrationGuideIntermediate runs the openssl commands of
// docs/migrating-from-istiod.md (step 2) against a root of Istio's, and
// checks that the intermediate they make is one the pushers sign with:
// its workload certificates chain to Istio's root.
func TestMigrationGuideIntermediate(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Skip("no openssl on PATH")
	}
	guide, err := os.ReadFile(filepath.Join("..", "..", "docs", "migrating-from-istiod.md"))
	if err != nil {
		t.Fatal(err)
	}
	var commands []string
	for _, block := range regexp.MustCompile("(?s)```\n(.*?)```").FindAllStringSubmatch(string(guide), -1) {
		if !strings.Contains(block[1], "openssl req") {
			continue
		}
		for _, line := range strings.Split(strings.ReplaceAll(block[1], "\\\n", ""), "\n") {
			// The root comes from the cluster and the root's keeper: here,
			// from the test.
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "kubectl ") {
				commands = append(commands, line)
			}
		}
	}
	if len(commands) < 2 {
		t.Fatalf("the guide's openssl commands were not found: %q", commands)
	}
	istio := testutil.NewCA(t)
	dir := t.TempDir()
	for from, to := range map[string]string{istio.CertFile: "root-cert.pem", istio.KeyFile: "root-key.pem"} {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", strings.Join(commands, "\n"))
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "PATH="+filepath.Dir(openssl)+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the guide's commands: %v\n%s", err, out)
	}
	ours, err := ca.FromFiles(filepath.Join(dir, "shardpilot-intermediate.pem"), filepath.Join(dir, "shardpilot-intermediate-key.pem"))
	if err != nil {
		t.Fatalf("the pushers refuse the guide's intermediate: %v", err)
	}
	w, err := ours.Issue(identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(w.CertPEM)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	rootPEM, _ := os.ReadFile(istio.CertFile)
	roots.AppendCertsFromPEM(rootPEM)
	interPEM, _ := os.ReadFile(filepath.Join(dir, "shardpilot-intermediate.pem"))
	inter.AppendCertsFromPEM(interPEM)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("a workload certificate of the guide's intermediate does not chain to Istio's root: %v", err)
	}
}

// TestCertificatesCut: a workload certificate the signing certificate's
// expiry cuts short is counted (shardpilot_ca_certificates_cut_total);
// one that it does not, is not.
func TestCertificatesCut(t *testing.T) {
	for _, c := range []struct {
		root time.Duration
		want float64
	}{{30 * time.Minute, 1}, {24 * time.Hour, 0}} {
		short, err := pki.NewCA(t.TempDir(), "root", c.root)
		if err != nil {
			t.Fatal(err)
		}
		root, err := ca.FromFiles(short.CertFile, short.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		id := identity.ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "cart"}
		reg := prometheus.NewRegistry()
		svc, err := ca.NewService(&ca.Service{CA: root, TTL: time.Hour, MaxTTL: time.Hour, Log: testutil.Log(t),
			Identify: func(context.Context) (identity.ID, bool, error) { return id, true, nil }}, reg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.CreateCertificate(context.Background(), &pb.IstioCertificateRequest{Csr: newCSR(t, []string{id.String()})}); err != nil {
			t.Fatal(err)
		}
		n, err := promtest.GatherAndCount(reg, "shardpilot_ca_certificates_cut_total")
		if err != nil || n != 1 {
			t.Fatalf("the counter is not registered: %d, %v", n, err)
		}
		mfs, _ := reg.Gather()
		got := 0.0
		for _, mf := range mfs {
			if mf.GetName() == "shardpilot_ca_certificates_cut_total" {
				got = mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		if got != c.want {
			t.Errorf("a root of %s, certificates of an hour: %v cut, want %v", c.root, got, c.want)
		}
	}
}
