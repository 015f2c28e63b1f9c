package cli

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEtcdConfig: what the etcd flags combine into, and every bad
// combination refused with the flags at fault named.
func TestEtcdConfig(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := (&Etcd{Endpoints: "http://a:2379, http://b:2379", Username: "root", PasswordFile: pw}).Config(0)
	if err != nil || len(cfg.Endpoints) != 2 || cfg.Username != "root" || cfg.Password != "s3cret" || cfg.TLS != nil {
		t.Errorf("plain with a password: %+v %v", cfg, err)
	}
	if cfg, err := (&Etcd{Endpoints: "https://a:2379"}).Config(0); err != nil || cfg.TLS == nil {
		t.Errorf("https without files: %v, want TLS with the system's roots", err)
	}
	for _, c := range []struct {
		e    Etcd
		want string
	}{
		{Etcd{Endpoints: " , "}, "no endpoint"},
		{Etcd{Endpoints: "a:2379"}, "want URLs"},
		{Etcd{Endpoints: "http://a:2379", CAFile: "/ca.pem"}, "must be https://"},
		{Etcd{Endpoints: "https://a:2379", CertFile: "/c.pem"}, "--etcd-cert-file and --etcd-key-file go together"},
		{Etcd{Endpoints: "https://a:2379", CAFile: filepath.Join(dir, "missing.pem")}, "--etcd-ca-file"},
		{Etcd{Endpoints: "http://a:2379", Username: "root"}, "--etcd-username and --etcd-password-file go together"},
		{Etcd{Endpoints: "http://a:2379", Username: "root", PasswordFile: empty}, "is empty"},
	} {
		if _, err := c.e.Config(0); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.e, err, c.want)
		}
	}
}

// TestNATSOptions: one way to sign in at a time, files read up front.
func TestNATSOptions(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "pw")
	if err := os.WriteFile(pw, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if opts, err := (&NATS{User: "pusher", PasswordFile: pw}).Options(); err != nil || len(opts) != 1 {
		t.Errorf("user and password: %d options, %v", len(opts), err)
	}
	for _, c := range []struct {
		n    NATS
		want string
	}{
		{NATS{CertFile: "/c.pem"}, "--nats-cert-file and --nats-key-file go together"},
		{NATS{CAFile: filepath.Join(dir, "missing.pem")}, "--nats-ca-file"},
		{NATS{User: "u", CredsFile: pw}, "alternatives"},
		{NATS{User: "u"}, "--nats-user needs --nats-password-file"},
		{NATS{PasswordFile: pw}, "--nats-password-file needs --nats-user"},
		{NATS{CredsFile: filepath.Join(dir, "none.creds")}, "--nats-creds-file"},
		{NATS{NKeyFile: pw}, "--nats-nkey-file"},
	} {
		if _, err := c.n.Options(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.n, err, c.want)
		}
	}
}

// TestVerifyKeys: the relay's public key is read from a PUBLIC KEY block
// or a certificate carrying it (the chart makes one at install, since Helm
// can make a certificate of a key and not write its public key), and a
// private key is refused, naming the file and block.
func TestVerifyKeys(t *testing.T) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "shardpilot-events"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Unix(1, 0)} // long expired: its dates are not read
	cert, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, blocks ...*pem.Block) string {
		var b []byte
		for _, bl := range blocks {
			b = append(b, pem.EncodeToMemory(bl)...)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	keys, err := VerifyKeys("k", write("both.pem", &pem.Block{Type: "PUBLIC KEY", Bytes: der}, &pem.Block{Type: "CERTIFICATE", Bytes: cert}))
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || !keys[0].Equal(pub) || !keys[1].Equal(pub) {
		t.Errorf("VerifyKeys = %d keys, want the key twice", len(keys))
	}
	_, err = VerifyKeys("k", write("private.pem", &pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8}))
	if err == nil || !strings.Contains(err.Error(), "private.pem: key 1") || !strings.Contains(err.Error(), `"PRIVATE KEY"`) {
		t.Errorf("VerifyKeys(a private key) = %v, want a refusal naming the file and block", err)
	}
}
