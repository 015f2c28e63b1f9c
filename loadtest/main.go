// Command loadtest load-tests shardpilot with simulated Envoys and compares
// it, in the same run, with a go-control-plane snapshot-cache baseline fed
// the same changes.
//
//	loadtest [run] [flags]      the scenario: shardpilot (ingester and pushers as
//	                            processes, etcd and NATS embedded), then the baseline
//	loadtest proxies [flags]    simulated proxies only, against running pushers
//	                            (--shard i/n spreads them over processes)
//	loadtest baseline [flags]   the baseline control plane alone
//
// Every flag also reads an environment variable: --proxies is
// SHARDPILOT_LOADTEST_PROXIES.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/shardpilot/shardpilot/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "run":
		return runScenario(ctx, args, stdout, stderr)
	case "proxies":
		return runProxies(ctx, args, stdout, stderr)
	case "baseline":
		return runBaseline(ctx, args, stderr)
	case "store":
		return runStore(ctx, args, stderr)
	}
	return fmt.Errorf("unknown command %q: want run, proxies, baseline or store", cmd)
}

// parse parses flags, filling those not given from their environment
// twins (SHARDPILOT_LOADTEST_<NAME>).
func parse(fs *flag.FlagSet, summary string, args []string) error {
	return cli.ParsePrefixed(fs, "SHARDPILOT_LOADTEST_", summary, args)
}
