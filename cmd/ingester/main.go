// Command ingester reads the mesh's sources — for now a directory of Istio
// YAML — normalizes them into etcd, and relays every committed change to
// NATS JetStream for the pushers.
package main

import (
	"context"
	"errors"
	"flag"
	"os"

	"github.com/shardpilot/shardpilot/cmd/internal/app"
	"github.com/shardpilot/shardpilot/cmd/internal/cli"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"golang.org/x/sync/errgroup"
)

func main() { cli.Main("ingester", run) }

func run(ctx context.Context, args []string) error {
	var common cli.Common
	var remote cli.Remote
	var meshDir, domainSuffix string
	fs := flag.NewFlagSet("ingester", flag.ContinueOnError)
	common.Register(fs, ":15015")
	remote.Register(fs)
	fs.StringVar(&meshDir, "mesh-dir", "", "directory of Istio YAML to ingest (required)")
	fs.StringVar(&domainSuffix, "domain-suffix", "cluster.local", "DNS suffix that completes short host names")
	if err := cli.Parse(fs, "shardpilot ingester: sources → etcd, and etcd → NATS JetStream.", args); err != nil {
		return err
	}
	if meshDir == "" {
		return errors.New("--mesh-dir is required")
	}
	log, err := telemetry.NewLogger(os.Stderr, common.LogLevel, common.LogFormat)
	if err != nil {
		return err
	}
	conns, err := app.Connect(remote.Endpoints(), remote.NATSURL, "shardpilot-ingester", log)
	if err != nil {
		return err
	}
	defer conns.Close()
	etcd, nc := conns.Etcd, conns.NATS
	adminLis, err := cli.Listen(log, "admin", "admin-addr", common.AdminAddr)
	if err != nil {
		return err
	}

	reg := telemetry.NewRegistry()
	ready := telemetry.NewReadiness("mesh directory synced")
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return app.Source{Etcd: etcd, MeshDir: meshDir, DomainSuffix: domainSuffix, Log: log, Registerer: reg,
			OnSynced: func(ingest.Result) { ready.Set("mesh directory synced", true) }}.Run(ctx)
	})
	g.Go(func() error {
		return app.Relay{Etcd: etcd, NATS: nc, Bus: bus.Config{Stream: remote.Stream}, Log: log, Registerer: reg}.Run(ctx)
	})
	g.Go(func() error {
		return (&telemetry.Admin{Listener: adminLis, Gatherer: reg, Ready: ready, Log: log}).Run(ctx)
	})
	return g.Wait()
}
