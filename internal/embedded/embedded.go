// Package embedded runs etcd and a NATS JetStream server inside the
// process, for the standalone mode and for tests. Both listen on loopback
// ports chosen at start. Close stops them and waits for them to stop.
package embedded

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// Etcd is an embedded etcd member.
type Etcd struct {
	e *embed.Etcd
	// Endpoint is the client URL.
	Endpoint string
	closed   sync.Once
}

// freePort returns a loopback port nobody listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// TLS makes a server speak TLS with a certificate and, when ClientCAFile is
// given, require client certificates that CA signed.
type TLS struct {
	CertFile, KeyFile, ClientCAFile string
}

// EtcdOptions secure an embedded etcd.
type EtcdOptions struct {
	// TLS, when set, serves clients over https.
	TLS *TLS
	// ClientPort, when set, is the port clients reach it on (else a free
	// one): an etcd started again where its clients still look.
	ClientPort int
	// Restore, when set, makes its data directory (emptied first) from a
	// snapshot for a single member of that name, initial cluster and
	// peer address, before it starts: etcd restored from a snapshot.
	Restore func(dataDir, name, initialCluster string, peer url.URL) error
}

// StartEtcd starts a single-member etcd with its data in dir.
func StartEtcd(dir string) (*Etcd, error) { return StartEtcdWith(dir, EtcdOptions{}) }

// StartEtcdWith starts a single-member etcd with its data in dir, secured
// as opts say.
func StartEtcdWith(dir string, opts EtcdOptions) (*Etcd, error) {
	cfg := embed.NewConfig()
	scheme := "http"
	if t := opts.TLS; t != nil {
		scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile,
			TrustedCAFile: t.ClientCAFile, ClientCertAuth: t.ClientCAFile != ""}
	}
	cfg.Dir = filepath.Join(dir, "etcd")
	// etcd logs its own orderly shutdown at error level; what matters
	// reaches shardpilot through the client.
	cfg.LogLevel = "fatal"
	cfg.AutoCompactionMode = "revision"
	cfg.AutoCompactionRetention = "100000"
	var lastErr error
	for range 5 {
		cp, err := freePort()
		if opts.ClientPort != 0 {
			cp, err = opts.ClientPort, nil
		}
		if err != nil {
			return nil, fmt.Errorf("embedded: etcd port: %w", err)
		}
		pp, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("embedded: etcd port: %w", err)
		}
		curl := url.URL{Scheme: scheme, Host: fmt.Sprintf("127.0.0.1:%d", cp)}
		purl := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", pp)}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{curl}, []url.URL{curl}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{purl}, []url.URL{purl}
		cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
		if opts.Restore != nil {
			// The member is made anew from the snapshot, at this
			// attempt's peer address.
			if err := os.RemoveAll(cfg.Dir); err != nil {
				return nil, fmt.Errorf("embedded: restore: %w", err)
			}
			if err := opts.Restore(cfg.Dir, cfg.Name, cfg.InitialCluster, purl); err != nil {
				return nil, fmt.Errorf("embedded: restore: %w", err)
			}
		}
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			// Another process may have taken the port in the meantime.
			lastErr = err
			continue
		}
		select {
		case <-e.Server.ReadyNotify():
			return &Etcd{e: e, Endpoint: curl.String()}, nil
		case <-time.After(30 * time.Second):
			e.Close()
			return nil, errors.New("embedded: etcd did not become ready within 30s")
		}
	}
	return nil, fmt.Errorf("embedded: start etcd: %w", lastErr)
}

// Close stops etcd; a second Close does nothing.
func (e *Etcd) Close() {
	e.closed.Do(func() {
		e.e.Close()
		<-e.e.Server.StopNotify()
	})
}

// NATS is an embedded NATS server with JetStream.
type NATS struct {
	s   *natsserver.Server
	dir string
	// URL is the client URL.
	URL string
}

// NATSOptions secure an embedded NATS server.
type NATSOptions struct {
	// TLS, when set, makes the server require TLS.
	TLS *TLS
	// Users, when set, are the only ones who may connect, each with their
	// permissions.
	Users []*natsserver.User
}

// RoleUser is a NATS user with a password holding a role's permissions on
// the default stream and nothing more (see bus.RolePermissions).
func RoleUser(name, password string, role bus.Role) (*natsserver.User, error) {
	p, err := bus.RolePermissions(role, "")
	if err != nil {
		return nil, err
	}
	return &natsserver.User{Username: name, Password: password, Permissions: &natsserver.Permissions{
		Publish: &natsserver.SubjectPermission{Allow: p.Publish}, Subscribe: &natsserver.SubjectPermission{Allow: p.Subscribe}}}, nil
}

// StartNATS starts NATS with JetStream storing into dir, on port (0 picks one).
func StartNATS(dir string, port int) (*NATS, error) { return StartNATSWith(dir, port, NATSOptions{}) }

// StartNATSWith starts NATS as StartNATS does, secured as secure says.
func StartNATSWith(dir string, port int, secure NATSOptions) (*NATS, error) {
	if port == 0 {
		port = -1 // nats-server: a random port
	}
	opts := &natsserver.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  filepath.Join(dir, "nats"),
		NoLog:     true,
		NoSigs:    true,
		Users:     secure.Users,
	}
	if t := secure.TLS; t != nil {
		tc, err := natsserver.GenTLSConfig(&natsserver.TLSConfigOpts{CertFile: t.CertFile, KeyFile: t.KeyFile,
			CaFile: t.ClientCAFile, Verify: t.ClientCAFile != ""})
		if err != nil {
			return nil, fmt.Errorf("embedded: nats TLS: %w", err)
		}
		opts.TLSConfig, opts.TLS, opts.TLSVerify = tc, true, t.ClientCAFile != ""
	}
	s, err := natsserver.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: nats: %w", err)
	}
	s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded: nats did not become ready within 30s")
	}
	return &NATS{s: s, dir: dir, URL: s.ClientURL()}, nil
}

// Traffic returns the messages and bytes the server has received from its
// clients (published, acknowledged) and sent to them (delivered) so far.
func (n *NATS) Traffic() (inMsgs, inBytes, outMsgs, outBytes int64, err error) {
	v, err := n.s.Varz(nil)
	if err != nil {
		return 0, 0, 0, 0, fmt.Errorf("embedded: nats traffic: %w", err)
	}
	return v.InMsgs, v.InBytes, v.OutMsgs, v.OutBytes, nil
}

// Port returns the client port.
func (n *NATS) Port() int { return n.s.Addr().(*net.TCPAddr).Port }

// Close stops NATS and waits for it.
func (n *NATS) Close() {
	n.s.Shutdown()
	n.s.WaitForShutdown()
}
