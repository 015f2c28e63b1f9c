package ca_test

import (
	"crypto/x509"
	"encoding/pem"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
)

// verify checks that a workload certificate chains to root and names id.
func verify(t *testing.T, w *ca.Workload, rootPEM []byte, id identity.ID) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(w.CertPEM)
	if block == nil {
		t.Fatal("no certificate")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootPEM) {
		t.Fatal("no root")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the workload certificate does not chain to the root: %v", err)
	}
	if len(leaf.URIs) != 1 || leaf.URIs[0].String() != id.String() {
		t.Errorf("URIs %v, want %s", leaf.URIs, id)
	}
	return leaf
}

// TestRootInEtcd: replicas starting at once agree on one root, created
// once; a later start reads it.
func TestRootInEtcd(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	cas := make([]*ca.CA, 4)
	var wg sync.WaitGroup
	for i := range cas {
		wg.Go(func() {
			c, err := ca.FromEtcd(ctx, cli, "cluster.local")
			if err != nil {
				t.Error(err)
			}
			cas[i] = c
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, c := range cas[1:] {
		if string(c.RootPEM()) != string(cas[0].RootPEM()) {
			t.Fatal("replicas disagree on the root")
		}
	}
	later, err := ca.FromEtcd(ctx, cli, "cluster.local")
	if err != nil || string(later.RootPEM()) != string(cas[0].RootPEM()) {
		t.Fatalf("a later start: %v", err)
	}
	id := identity.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "reviews"}
	w, err := cas[2].Issue(id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := verify(t, w, cas[0].RootPEM(), id)
	if d := time.Until(leaf.NotAfter); d < 59*time.Minute || d > time.Hour {
		t.Errorf("valid for %s, want an hour", d)
	}
	if _, err := cli.Put(ctx, ca.RootKey, "not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.FromEtcd(ctx, cli, "cluster.local"); err == nil || !strings.Contains(err.Error(), ca.RootKey) {
		t.Errorf("a broken root: %v, want an error naming its key", err)
	}
}

// TestRootFromFiles: an operator's CA signs; a certificate that is not a
// CA's is refused.
func TestRootFromFiles(t *testing.T) {
	test := testutil.NewCA(t)
	leafCert, leafKey := test.Issue(t, "not-a-ca")
	if _, err := ca.FromFiles(leafCert, leafKey); err == nil || !strings.Contains(err.Error(), "not a CA") {
		t.Errorf("a leaf as the root: %v", err)
	}
	c, err := ca.FromFiles(test.CertFile, test.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	id := identity.ID{TrustDomain: "mesh.example", Namespace: "shop", ServiceAccount: "cart"}
	w, err := c.Issue(id, 10*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	verify(t, w, c.RootPEM(), id)
	if _, err := ca.FromFiles("/nonexistent.pem", "/nonexistent-key.pem"); err == nil {
		t.Error("missing files were accepted")
	}
}

// BenchmarkIssue measures one workload certificate with its key: what a
// pusher spends per identity (shared by its proxies) and per renewal.
func BenchmarkIssue(b *testing.B) {
	test := testutil.NewCA(b)
	c, err := ca.FromFiles(test.CertFile, test.KeyFile)
	if err != nil {
		b.Fatal(err)
	}
	id := identity.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "app"}
	for b.Loop() {
		if _, err := c.Issue(id, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
