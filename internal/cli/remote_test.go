package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
