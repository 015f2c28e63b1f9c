package ca_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"github.com/prometheus/client_golang/prometheus"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// newRoots counts the warnings that a new root was created.
type newRoots struct{ n atomic.Int32 }

func (h *newRoots) Enabled(context.Context, slog.Level) bool { return true }
func (h *newRoots) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *newRoots) WithGroup(string) slog.Handler            { return h }
func (h *newRoots) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn && strings.HasPrefix(r.Message, "a new root was created") {
		h.n.Add(1)
	}
	return nil
}

// TestSealedRoot: replicas starting at once agree on one root, created
// once (and said so, in a warning: on any start but the first, etcd lost
// it) and kept in etcd sealed: no key in the clear, under the prefix the
// pushers' etcd user alone may read. A later start reads it; a start
// without its seal key fails naming the key; a new first seal key seals it
// again.
func TestSealedRoot(t *testing.T) {
	_, root, as := testutil.EtcdWithRoles(t)
	cli := as("pusher")
	ctx := testutil.Context(t)
	old, next := sealKey(1), sealKey(2)
	cas := make([]*ca.CA, 4)
	var wg sync.WaitGroup
	created := &newRoots{}
	for i := range cas {
		wg.Go(func() {
			c, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{old}, slog.New(created))
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
	all, err := root.Get(ctx, "/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Kvs) != 1 || string(all.Kvs[0].Key) != ca.SealedRootKey || !strings.HasPrefix(ca.SealedRootKey, store.PusherPrefix) {
		t.Fatalf("etcd holds %d keys, want the sealed root alone, under %s", len(all.Kvs), store.PusherPrefix)
	}
	if v := all.Kvs[0].Value; bytes.Contains(v, []byte("PRIVATE KEY")) || bytes.Contains(v, []byte("CERTIFICATE")) {
		t.Fatalf("the root is kept in the clear: %.80s", v)
	}
	for _, part := range []string{"ingester", "shardctl"} {
		if _, err := as(part).Get(ctx, ca.SealedRootKey); !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("the %s reads the sealed root: %v", part, err)
		}
	}

	later, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{old}, slog.New(created))
	if err != nil || string(later.RootPEM()) != string(cas[0].RootPEM()) {
		t.Fatalf("a later start: %v", err)
	}
	if n := created.n.Load(); n != 1 {
		t.Errorf("a new root was said %d times, want once: by the replica that created it", n)
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

	// Without its seal key the root cannot be opened, and is not replaced.
	if _, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{next}, nil); err == nil || !strings.Contains(err.Error(), "not among the seal keys") {
		t.Errorf("the wrong seal key: %v, want an error saying the root's key is not given", err)
	}
	// A new first key: the root is the same, sealed with the new key, and
	// the old key alone no longer opens it.
	rotated, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{next, old}, testutil.Log(t))
	if err != nil || string(rotated.RootPEM()) != string(cas[0].RootPEM()) {
		t.Fatalf("with a new first seal key: %v", err)
	}
	if _, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{old}, nil); err == nil {
		t.Error("the root is still sealed with the old key")
	}
	if again, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{next}, nil); err != nil || string(again.RootPEM()) != string(cas[0].RootPEM()) {
		t.Errorf("with the new key alone: %v", err)
	}

	if _, err := cli.Put(ctx, ca.SealedRootKey, "not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{next}, nil); err == nil || !strings.Contains(err.Error(), ca.SealedRootKey) {
		t.Errorf("a broken root: %v, want an error naming its key", err)
	}
}

// TestLegacyRootSealed: a root an earlier release kept unsealed is sealed
// and adopted (the certificates it signed stay trusted), and its unsealed
// copy deleted.
func TestLegacyRootSealed(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	test := testutil.NewCA(t)
	cert, err := os.ReadFile(test.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(test.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	legacy, err := json.Marshal(map[string]string{"cert": string(cert), "key": string(key)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, ca.LegacyRootKey, string(legacy)); err != nil {
		t.Fatal(err)
	}
	got, err := ca.FromStore(ctx, store.New(cli), "cluster.local", ca.SealKeys{sealKey(1)}, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	if string(got.RootPEM()) != string(cert) {
		t.Error("the legacy root was not adopted")
	}
	resp, err := cli.Get(ctx, ca.LegacyRootKey)
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the unsealed copy is still there (%v)", err)
	}
}

// TestReadSealKeys: a seal key file's garbage is refused naming the file
// and line.
func TestReadSealKeys(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "# the next key\n"+base64.StdEncoding.EncodeToString(sealKey(2))+"\n\n"+base64.StdEncoding.EncodeToString(sealKey(1))+"\n")
	keys, err := ca.ReadSealKeys(good)
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], sealKey(2)) {
		t.Errorf("ReadSealKeys: %d keys, %v", len(keys), err)
	}
	for name, content := range map[string]string{
		"short": base64.StdEncoding.EncodeToString(make([]byte, 16)) + "\n",
		"junk":  "\nnot base64!\n",
		"empty": "# nothing\n",
	} {
		p := write(name, content)
		if _, err := ca.ReadSealKeys(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want an error naming the file", name, err)
		}
	}
	if _, err := ca.ReadSealKeys(filepath.Join(dir, "junk")); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("junk: %v, want its line", err)
	}
}

func sealKey(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

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

// TestAlsoTrust: while a root is replaced proxies trust both, the one
// that signs first; a file of anything but CA certificates is refused.
func TestAlsoTrust(t *testing.T) {
	c, next := trustingNext(t)
	nextPEM, err := os.ReadFile(next.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(c.TrustPEM(), c.RootPEM()) || !bytes.HasSuffix(c.TrustPEM(), nextPEM) {
		t.Errorf("trust bundle:\n%s", c.TrustPEM())
	}
	leafCert, _ := next.Issue(t, "not-a-ca")
	if err := c.AlsoTrust(leafCert); err == nil || !strings.Contains(err.Error(), "not a CA certificate") {
		t.Errorf("a leaf: %v", err)
	}
	if err := c.AlsoTrust(next.KeyFile); err == nil || !strings.Contains(err.Error(), next.KeyFile) {
		t.Errorf("a key: %v", err)
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

// TestPublishTrust: the pushers' etcd user publishes the roots proxies
// trust, which the ingesters' user reads (and may not write); publishing
// what is there already writes nothing.
func TestPublishTrust(t *testing.T) {
	_, _, as := testutil.EtcdWithRoles(t)
	ctx := testutil.Context(t)
	c, err := ca.FromStore(ctx, store.New(as("pusher")), "cluster.local", ca.SealKeys{sealKey(1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.PublishTrust(ctx, store.New(as("pusher")), c); err != nil {
		t.Fatal(err)
	}
	resp, err := as("ingester").Get(ctx, store.TrustKey)
	if err != nil || len(resp.Kvs) != 1 || !bytes.Equal(resp.Kvs[0].Value, c.TrustPEM()) {
		t.Fatalf("the ingesters read %v (%v), want the roots", resp, err)
	}
	rev := resp.Kvs[0].ModRevision
	if err := ca.PublishTrust(ctx, store.New(as("pusher")), c); err != nil {
		t.Fatal(err)
	}
	if resp, _ := as("ingester").Get(ctx, store.TrustKey); resp.Kvs[0].ModRevision != rev {
		t.Error("the same roots were written again")
	}
	if _, err := as("ingester").Put(ctx, store.TrustKey, "forged"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("the ingesters wrote the roots: %v", err)
	}
}

// TestExpiryCollector: the signing certificate's expiry and that of each
// other certificate proxies trust are reported, each once.
func TestExpiryCollector(t *testing.T) {
	c, _ := trustingNext(t)
	reg := prometheus.NewRegistry()
	reg.MustRegister(ca.ExpiryCollector(c))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] += 1
			if m.GetLabel()[0].GetValue() == "signing" && m.GetGauge().GetValue() != float64(c.Root().NotAfter.Unix()) {
				t.Errorf("signing certificate expires at %v, want %v", m.GetGauge().GetValue(), c.Root().NotAfter.Unix())
			}
		}
	}
	if got["signing"] != 1 || got["trusted"] != 1 {
		t.Errorf("certificates reported %v, want the signing one and the other trusted root", got)
	}
}

// trustingNext is a CA that also trusts the next root (a rotation's first
// step), and that next root.
func trustingNext(t *testing.T) (*ca.CA, *testutil.CA) {
	t.Helper()
	signing, next := testutil.NewCA(t), testutil.NewCA(t)
	c, err := ca.FromFiles(signing.CertFile, signing.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AlsoTrust(next.CertFile); err != nil {
		t.Fatal(err)
	}
	return c, next
}
