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
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
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
	}
	return fmt.Errorf("unknown command %q: want run, proxies or baseline", cmd)
}

// parse parses flags, filling those not given from their environment
// variables (SHARDPILOT_LOADTEST_<NAME>).
func parse(fs *flag.FlagSet, summary string, args []string) error {
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s\n\nUsage: loadtest %s [flags]\n\nFlags (each also read from its environment variable):\n", summary, fs.Name())
		fs.VisitAll(func(f *flag.Flag) {
			fmt.Fprintf(fs.Output(), "  --%s  $%s (default %q)\n      %s\n", f.Name, envName(f.Name), f.DefValue, f.Usage)
		})
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s (see --help)", strings.Join(fs.Args(), " "))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(f.Name)); ok && !set[f.Name] && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("$%s: %w", envName(f.Name), e)
			}
		}
	})
	return err
}

func envName(flagName string) string {
	return "SHARDPILOT_LOADTEST_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func logger(w io.Writer, level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}
