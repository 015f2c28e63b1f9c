package cli

import (
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Etcd holds the flags for reaching etcd: endpoints, TLS and credentials.
type Etcd struct {
	Endpoints                 string
	CAFile, CertFile, KeyFile string
	Username, PasswordFile    string
}

// Register adds the etcd flags.
func (e *Etcd) Register(fs *flag.FlagSet) {
	fs.StringVar(&e.Endpoints, "etcd-endpoints", "http://127.0.0.1:2379", "comma-separated etcd client URLs (https:// with the TLS flags)")
	fs.StringVar(&e.CAFile, "etcd-ca-file", "", "PEM file of the CA that signed etcd's server certificate (default: the system's roots)")
	fs.StringVar(&e.CertFile, "etcd-cert-file", "", "PEM client certificate for an etcd that requires one (with --etcd-key-file)")
	fs.StringVar(&e.KeyFile, "etcd-key-file", "", "PEM key of --etcd-cert-file")
	fs.StringVar(&e.Username, "etcd-username", "", "etcd user, for an etcd with authentication enabled (with --etcd-password-file)")
	fs.StringVar(&e.PasswordFile, "etcd-password-file", "", "file holding the password of --etcd-username")
}

// List returns the endpoints as a list.
func (e *Etcd) List() []string {
	var out []string
	for _, ep := range strings.Split(e.Endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

// Config returns the etcd client configuration the flags describe, with
// every file read and every combination checked.
func (e *Etcd) Config(dialTimeout time.Duration) (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: e.List(), DialTimeout: dialTimeout, Logger: zap.NewNop()}
	if len(cfg.Endpoints) == 0 {
		return cfg, errors.New("--etcd-endpoints: no endpoint given")
	}
	secure := e.CAFile != "" || e.CertFile != ""
	for _, ep := range cfg.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || u.Host == "" {
			return cfg, fmt.Errorf("--etcd-endpoints %q: want URLs such as https://etcd-0:2379", ep)
		}
		if secure && u.Scheme != "https" {
			return cfg, fmt.Errorf("--etcd-endpoints %q: the TLS flags are given, so the endpoint must be https://", ep)
		}
		if u.Scheme == "https" {
			secure = true
		}
	}
	if (e.CertFile == "") != (e.KeyFile == "") {
		return cfg, errors.New("--etcd-cert-file and --etcd-key-file go together")
	}
	if secure {
		info := transport.TLSInfo{TrustedCAFile: e.CAFile, CertFile: e.CertFile, KeyFile: e.KeyFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return cfg, fmt.Errorf("etcd TLS (--etcd-ca-file, --etcd-cert-file, --etcd-key-file): %w", err)
		}
		cfg.TLS = tc
	}
	if (e.Username == "") != (e.PasswordFile == "") {
		return cfg, errors.New("--etcd-username and --etcd-password-file go together")
	}
	if e.Username != "" {
		pw, err := secretFile("etcd-password-file", e.PasswordFile)
		if err != nil {
			return cfg, err
		}
		cfg.Username, cfg.Password = e.Username, pw
	}
	return cfg, nil
}

// NATS holds the flags for reaching NATS: URL, TLS and credentials.
type NATS struct {
	URL                       string
	CAFile, CertFile, KeyFile string
	CredsFile, NKeyFile       string
	User, PasswordFile        string
}

// Register adds the NATS flags.
func (n *NATS) Register(fs *flag.FlagSet) {
	fs.StringVar(&n.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL (comma-separated for a cluster; tls:// or the TLS flags for TLS)")
	fs.StringVar(&n.CAFile, "nats-ca-file", "", "PEM file of the CA that signed the NATS server's certificate (makes the connection TLS)")
	fs.StringVar(&n.CertFile, "nats-cert-file", "", "PEM client certificate for a NATS server that verifies clients (with --nats-key-file)")
	fs.StringVar(&n.KeyFile, "nats-key-file", "", "PEM key of --nats-cert-file")
	fs.StringVar(&n.CredsFile, "nats-creds-file", "", "NATS credentials file (a user JWT and its nkey seed, as nsc writes)")
	fs.StringVar(&n.NKeyFile, "nats-nkey-file", "", "file holding an nkey seed to sign in with")
	fs.StringVar(&n.User, "nats-user", "", "NATS user, for a server with user and password authorization (with --nats-password-file)")
	fs.StringVar(&n.PasswordFile, "nats-password-file", "", "file holding the password of --nats-user")
}

// Options returns the connection options the flags describe, with every
// file read and every combination checked.
func (n *NATS) Options() ([]nats.Option, error) {
	var opts []nats.Option
	if (n.CertFile == "") != (n.KeyFile == "") {
		return nil, errors.New("--nats-cert-file and --nats-key-file go together")
	}
	if n.CAFile != "" || n.CertFile != "" {
		info := transport.TLSInfo{TrustedCAFile: n.CAFile, CertFile: n.CertFile, KeyFile: n.KeyFile}
		tc, err := info.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("NATS TLS (--nats-ca-file, --nats-cert-file, --nats-key-file): %w", err)
		}
		tc.MinVersion = tls.VersionTLS12
		opts = append(opts, nats.Secure(tc))
	}
	given := 0
	for _, f := range []string{n.CredsFile, n.NKeyFile, n.User} {
		if f != "" {
			given++
		}
	}
	if given > 1 {
		return nil, errors.New("--nats-creds-file, --nats-nkey-file and --nats-user are alternatives: give one")
	}
	switch {
	case n.CredsFile != "":
		if _, err := os.Stat(n.CredsFile); err != nil {
			return nil, fmt.Errorf("--nats-creds-file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	case n.NKeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(n.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey-file: %w", err)
		}
		opts = append(opts, opt)
	case n.User != "":
		if n.PasswordFile == "" {
			return nil, errors.New("--nats-user needs --nats-password-file")
		}
		pw, err := secretFile("nats-password-file", n.PasswordFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, nats.UserInfo(n.User, pw))
	case n.PasswordFile != "":
		return nil, errors.New("--nats-password-file needs --nats-user")
	}
	return opts, nil
}

// secretFile reads a one-line secret (a password) from a file.
func secretFile(flagName, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("--%s %s: the file is empty", flagName, path)
	}
	return s, nil
}

// Remote holds the flags of a command that talks to external etcd and NATS.
type Remote struct {
	Etcd   Etcd
	NATS   NATS
	Stream string
}

// Register adds the flags for reaching etcd and NATS.
func (r *Remote) Register(fs *flag.FlagSet) {
	r.Etcd.Register(fs)
	r.NATS.Register(fs)
	fs.StringVar(&r.Stream, "stream", "SHARDPILOT_MESH", "JetStream stream that carries mesh changes")
}

// KubeConfig reads a kubeconfig path, or the pod's own service account for
// "in-cluster"; the caller names the flag in an error.
func KubeConfig(path string) (*rest.Config, error) {
	if path == "in-cluster" {
		return rest.InClusterConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

// SigningKey reads an ed25519 private key from a PEM file (PKCS #8, "PRIVATE
// KEY", as `openssl genpkey -algorithm ed25519` writes it); flagName names
// the flag in errors.
func SigningKey(flagName, path string) (ed25519.PrivateKey, error) {
	block, err := pemFile(flagName, path)
	if err != nil {
		return nil, err
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("--%s %s: %w", flagName, path, err)
	}
	k, ok := key.(ed25519.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("--%s %s: a %T, want an ed25519 key", flagName, path, key)
	}
	return k, nil
}

// VerifyKeys reads ed25519 public keys from a PEM file of one or more PKIX
// "PUBLIC KEY" blocks (as `openssl pkey -pubout` writes one; two while a
// key is rotated) or certificates carrying the key (as the chart makes
// them at install: only their key is read, not their names or dates);
// flagName names the flag in errors.
func VerifyKeys(flagName, path string) ([]ed25519.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	var keys []ed25519.PublicKey
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			break
		}
		key, err := publicKey(block)
		if err != nil {
			return nil, fmt.Errorf("--%s %s: key %d: %w", flagName, path, len(keys)+1, err)
		}
		k, ok := key.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("--%s %s: key %d is a %T, want an ed25519 key", flagName, path, len(keys)+1, key)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--%s %s: no PEM block", flagName, path)
	}
	return keys, nil
}

// publicKey is the key of a PUBLIC KEY or CERTIFICATE block.
func publicKey(block *pem.Block) (any, error) {
	switch block.Type {
	case "PUBLIC KEY":
		return x509.ParsePKIXPublicKey(block.Bytes)
	case "CERTIFICATE":
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		return c.PublicKey, nil
	}
	return nil, fmt.Errorf("a PEM %q block, want PUBLIC KEY or CERTIFICATE blocks alone (the private key belongs to the relay)", block.Type)
}

// pemFile reads the first PEM block of a file.
func pemFile(flagName, path string) (*pem.Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("--%s %s: no PEM block", flagName, path)
	}
	return block, nil
}
