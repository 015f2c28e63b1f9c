package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/relay"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Relay runs the relay from the store to the bus.
type Relay struct {
	Etcd       *clientv3.Client
	NATS       *nats.Conn
	Bus        bus.Config
	Election   Election
	Log        *slog.Logger
	Registerer prometheus.Registerer
	// RepairAfter is relay.Config.RepairAfter.
	RepairAfter time.Duration
}

// BuiltRelay is a relay built and ready to run: the caller reads its
// health before and while it runs.
type BuiltRelay struct {
	Relay *relay.Relay
	cfg   Relay
}

// Build makes the relay.
func (r Relay) Build() (*BuiltRelay, error) {
	b, err := bus.New(r.NATS, r.Bus)
	if err != nil {
		return nil, err
	}
	rl, err := relay.New(relay.Config{Watcher: store.New(r.Etcd), Publisher: b, Log: r.Log.With("part", "relay"), Registerer: r.Registerer, RepairAfter: r.RepairAfter})
	if err != nil {
		return nil, err
	}
	return &BuiltRelay{Relay: rl, cfg: r}, nil
}

// Run relays until ctx is done. The relay only reads the store; the
// election keeps one relay publishing (a second would double nothing,
// only waste work).
func (b *BuiltRelay) Run(ctx context.Context) error {
	return led(ctx, b.cfg.Etcd, b.cfg.Election, "relay", b.cfg.Log, nil, b.Relay.Run)
}

// Run builds the relay and relays until ctx is done.
func (r Relay) Run(ctx context.Context) error {
	b, err := r.Build()
	if err != nil {
		return err
	}
	return b.Run(ctx)
}
