package cli

import (
	"crypto/tls"
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
