// Package app wires the concrete adapters — etcd store, NATS bus, YAML
// source, relay, pusher, xDS cache and server — into the parts the commands
// and the end-to-end tests run, one path for all of them. The pusher and
// the relay are built (Build) apart from running: what the caller reads
// (readiness, debug handlers) exists before anything runs. Every Run
// blocks until its context is done, returns the first error of what it
// started, and returns after everything it started has stopped.
package app

import (
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/internal/cli"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Conns are a process's connections to etcd and NATS.
type Conns struct {
	Etcd *clientv3.Client
	NATS *nats.Conn
}

// Connect connects to etcd and to NATS as the flags of r say (TLS and
// credentials included); name identifies the process to NATS.
func Connect(r cli.Remote, name string, log *slog.Logger) (*Conns, error) {
	ecfg, err := r.Etcd.Config(5 * time.Second)
	if err != nil {
		return nil, err
	}
	nopts, err := r.NATS.Options()
	if err != nil {
		return nil, err
	}
	etcd, err := clientv3.New(ecfg)
	if err != nil {
		return nil, fmt.Errorf("app: etcd %v: %w", ecfg.Endpoints, err)
	}
	nc, err := dialNATS(r.NATS.URL, name, log, nopts...)
	if err != nil {
		etcd.Close()
		return nil, err
	}
	return &Conns{Etcd: etcd, NATS: nc}, nil
}

// Close closes both connections.
func (c *Conns) Close() {
	c.NATS.Close()
	c.Etcd.Close()
}

// dialNATS connects to NATS and keeps reconnecting for as long as the
// connection is open.
func dialNATS(url, name string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", RedactURLs(c.ConnectedUrl())) }),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// A permissions violation, a slow consumer: said, not fatal.
			log.Warn("nats error", "err", err)
		}),
	}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("app: nats %s: %w", RedactURLs(url), err)
	}
	return nc, nil
}

// RedactURLs returns a comma-separated list of URLs with their user
// information (a NATS token, a user and password) replaced, for logs and
// errors.
func RedactURLs(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "(unparsable URL)"
			continue
		}
		if u.User != nil {
			u.User = url.User("REDACTED")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}
