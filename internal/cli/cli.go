// Package cli parses the commands' flags, each of which has an environment
// variable twin: --mesh-dir is also SHARDPILOT_MESH_DIR. A flag given on the
// command line wins over its twin.
package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"github.com/shardpilot/shardpilot/pkg/store"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/shardpilot/shardpilot/internal/version"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
)

// Prefix starts the environment twin of every shardpilot command's flags.
const Prefix = "SHARDPILOT_"

// EnvName returns the environment twin of a flag under a prefix.
func EnvName(prefix, flagName string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Parse parses args, then fills every flag not on the command line from its
// environment twin. It returns flag.ErrHelp after printing the help for -h.
func Parse(fs *flag.FlagSet, summary string, args []string) error {
	return ParsePrefixed(fs, Prefix, summary, args)
}

// ParsePrefixed is Parse with twins under another prefix, for a tool whose
// flags must not be confused with the product's (the load test's are
// SHARDPILOT_LOADTEST_*).
func ParsePrefixed(fs *flag.FlagSet, prefix, summary string, args []string) error {
	fs.Usage = func() { Usage(fs.Output(), fs, prefix, summary) }
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s (see --help)", strings.Join(fs.Args(), " "))
	}
	return fromEnv(fs, prefix)
}

// ParseArgs is Parse for a command that takes arguments, as kubectl does:
// flags may come before, between and after them. It returns the arguments.
func ParseArgs(fs *flag.FlagSet, summary string, args []string) ([]string, error) {
	if fs.Usage == nil {
		fs.Usage = func() { Usage(fs.Output(), fs, Prefix, summary) }
	}
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		// "--" ends the flags; the rest are arguments.
		if n := len(args) - fs.NArg(); n > 0 && args[n-1] == "--" {
			positional = append(positional, fs.Args()...)
			break
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
	return positional, fromEnv(fs, Prefix)
}

// fromEnv fills every flag not on the command line from its twin.
func fromEnv(fs *flag.FlagSet, prefix string) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil || len(f.Name) == 1 {
			return
		}
		if v, ok := os.LookupEnv(EnvName(prefix, f.Name)); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("$%s (twin of --%s): %w", EnvName(prefix, f.Name), f.Name, e)
			}
		}
	})
	return err
}

// Usage prints the summary and every flag with its default and twin.
func Usage(w io.Writer, fs *flag.FlagSet, prefix, summary string) {
	fmt.Fprintf(w, "%s\n\nUsage: %s [flags]\n       (--version alone prints the version)\n\nFlags (each also read from its environment variable):\n", summary, fs.Name())
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = fmt.Sprintf(" (default %q)", f.DefValue)
		}
		if len(f.Name) == 1 {
			// A short flag has no twin: its long form has.
			fmt.Fprintf(w, "  -%s%s\n      %s\n", f.Name, def, f.Usage)
			return
		}
		fmt.Fprintf(w, "  --%s  $%s%s\n      %s\n", f.Name, EnvName(prefix, f.Name), def, f.Usage)
	})
}

// Common holds the flags every command has.
type Common struct {
	LogLevel, LogFormat string
	AdminAddr           string
	AdminTokenFile      string
	// AdminTokenOnLoopback asks loopback callers for the token too.
	AdminTokenOnLoopback bool
	MemoryLimit          string
	AdvertiseHost        string
	// AdminTLSAddr, AdminCertFile and AdminKeyFile serve the admin
	// endpoints over TLS as well, where alone the token is then taken.
	AdminTLSAddr, AdminCertFile, AdminKeyFile string
}

// Register adds the common flags, with the command's admin address default.
func (c *Common) Register(fs *flag.FlagSet, adminAddr string) {
	fs.StringVar(&c.AdminAddr, "admin-addr", adminAddr, "address to serve /healthz, /readyz, /metrics and /debug/ on")
	fs.StringVar(&c.AdminTokenFile, "admin-token-file", "", "file holding a bearer token that opens the admin port's /debug/ (profiles, config dumps, proxy status) to other hosts; without it /debug/ answers loopback only")
	fs.BoolVar(&c.AdminTokenOnLoopback, "admin-token-on-loopback", false, "ask loopback callers for the token of --admin-token-file too: in a Kubernetes pod, kubectl port-forward (anyone allowed pods/portforward) arrives from loopback (the chart sets it)")
	fs.StringVar(&c.AdminTLSAddr, "admin-tls-addr", "", "address to serve the admin endpoints on over TLS too (with --admin-cert-file and --admin-key-file); the token of --admin-token-file is then taken there alone, never in the clear, and shardctl is told to use it")
	fs.StringVar(&c.AdminCertFile, "admin-cert-file", "", "PEM certificate of --admin-tls-addr (read again when it changes)")
	fs.StringVar(&c.AdminKeyFile, "admin-key-file", "", "PEM key of --admin-cert-file")
	fs.StringVar(&c.AdvertiseHost, "advertise-host", "", "host or IP other hosts (the shardctl CLI) reach this replica's ports at, as announced in etcd (the pod IP; default: the address listened on, or the host name)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.MemoryLimit, "memory-limit", "", "the container's memory limit (bytes, or with Ki, Mi, Gi): the garbage collector keeps the heap under 90% of it (empty: GOMEMLIMIT, or no limit)")
}

// AdminToken reads --admin-token-file ("" when not given), refusing a
// token telemetry.CheckToken refuses.
func (c *Common) AdminToken() (string, error) {
	if c.AdminTokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(c.AdminTokenFile)
	if err != nil {
		return "", fmt.Errorf("--admin-token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if err := telemetry.CheckToken(tok); err != nil {
		return "", fmt.Errorf("--admin-token-file %s: %w", c.AdminTokenFile, err)
	}
	return tok, nil
}

// Start applies --memory-limit and returns the logger of --log-level and
// --log-format and the admin token of --admin-token-file (nil when not
// given): what every long-running command does first.
func (c *Common) Start() (*slog.Logger, telemetry.TokenSource, error) {
	if err := c.ApplyMemoryLimit(); err != nil {
		return nil, nil, err
	}
	log, err := telemetry.NewLogger(os.Stderr, c.LogLevel, c.LogFormat)
	if err != nil {
		return nil, nil, err
	}
	token, err := c.AdminTokens(log)
	if err != nil {
		return nil, nil, err
	}
	return log, token, nil
}

// AdminTokens returns the token of --admin-token-file, read again when the
// file changes (nil when not given).
func (c *Common) AdminTokens(log *slog.Logger) (telemetry.TokenSource, error) {
	if c.AdminTokenOnLoopback && c.AdminTokenFile == "" {
		return nil, errors.New("--admin-token-on-loopback needs --admin-token-file: without a token /debug/ and the status page would answer no one")
	}
	if c.AdminTokenFile == "" {
		return nil, nil
	}
	f, err := telemetry.NewTokenFile(c.AdminTokenFile, log)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	return f, nil
}

// ListenWithADS opens the ADS listener at adsAddr, the admin one and the
// admin's over TLS when asked: all of them, or none.
func (c *Common) ListenWithADS(log *slog.Logger, adsAddr string) (ads, admin, adminTLS net.Listener, tlsCfg *tls.Config, err error) {
	if ads, err = Listen(log, "ADS", "ads-addr", adsAddr); err != nil {
		return nil, nil, nil, nil, err
	}
	if admin, err = Listen(log, "admin", "admin-addr", c.AdminAddr); err != nil {
		ads.Close()
		return nil, nil, nil, nil, err
	}
	if adminTLS, tlsCfg, err = c.AdminTLS(log); err != nil {
		ads.Close()
		admin.Close()
		return nil, nil, nil, nil, err
	}
	return ads, admin, adminTLS, tlsCfg, nil
}

// Member is how a process announces itself in etcd under role and name:
// its admin address (and the admin's over TLS, when it listens there) and,
// for one that serves ADS (ads not nil), its ADS address, as the other
// hosts reach them (--advertise-host).
func (c *Common) Member(role, name string, ads, admin, adminTLS net.Listener) store.Member {
	me := store.Member{Role: role, Name: name, Admin: Advertised(c.AdvertiseHost, admin), Started: time.Now(), Version: version.String()}
	if ads != nil {
		me.ADS = Advertised(c.AdvertiseHost, ads)
	}
	if adminTLS != nil {
		me.AdminTLS = Advertised(c.AdvertiseHost, adminTLS)
	}
	return me
}

// CloseAll closes the listeners that are not nil.
func CloseAll(ls ...net.Listener) {
	for _, l := range ls {
		if l != nil {
			l.Close()
		}
	}
}

// AdminTLS returns the TLS listener and configuration of --admin-tls-addr
// (nil, nil when not given); the certificate is read again when it changes.
func (c *Common) AdminTLS(log *slog.Logger) (net.Listener, *tls.Config, error) {
	if c.AdminTLSAddr == "" {
		if c.AdminCertFile != "" || c.AdminKeyFile != "" {
			return nil, nil, errors.New("--admin-cert-file and --admin-key-file are for --admin-tls-addr: give it too")
		}
		return nil, nil, nil
	}
	if c.AdminCertFile == "" || c.AdminKeyFile == "" {
		return nil, nil, errors.New("--admin-tls-addr needs --admin-cert-file and --admin-key-file")
	}
	tc, err := identity.ServerTLS(c.AdminCertFile, c.AdminKeyFile, "", log)
	if err != nil {
		return nil, nil, fmt.Errorf("--admin-cert-file, --admin-key-file: %w", err)
	}
	tc.NextProtos = []string{"h2", "http/1.1"}
	lis, err := Listen(log, "admin over TLS", "admin-tls-addr", c.AdminTLSAddr)
	if err != nil {
		return nil, nil, err
	}
	return lis, tc, nil
}

// ApplyMemoryLimit sets the Go runtime's soft memory limit to 90% of
// --memory-limit, when given, so that the collector works harder before a
// pod reaches its limit rather than after.
func (c *Common) ApplyMemoryLimit() error {
	if c.MemoryLimit == "" {
		return nil
	}
	n, err := ParseSize(c.MemoryLimit)
	if err != nil {
		return fmt.Errorf("--memory-limit: %w", err)
	}
	debug.SetMemoryLimit(n / 10 * 9)
	return nil
}

// ParseSize reads a size in bytes: a number, optionally followed by Ki,
// Mi, Gi or Ti (with or without a trailing B), as Kubernetes writes them.
func ParseSize(s string) (int64, error) {
	units := []struct {
		suffix string
		shift  uint
	}{{"Ti", 40}, {"Gi", 30}, {"Mi", 20}, {"Ki", 10}, {"", 0}}
	t := strings.TrimSuffix(strings.TrimSpace(s), "B")
	for _, u := range units {
		num, ok := strings.CutSuffix(t, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n <= 0 || n > (1<<62)>>u.shift {
			return 0, fmt.Errorf("%q: want a positive number of bytes, optionally followed by Ki, Mi, Gi or Ti", s)
		}
		return n << u.shift, nil
	}
	return 0, fmt.Errorf("%q: want a positive number of bytes, optionally followed by Ki, Mi, Gi or Ti", s)
}

// Main runs a command: run gets a context cancelled on SIGINT or SIGTERM,
// and an error other than a request for help exits with status 1.
func Main(name string, run func(ctx context.Context, args []string) error) {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println(version.String())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		os.Exit(1)
	}
}

// Advertised returns the host:port other hosts reach a listener at: on
// host when given, else on the IP the listener is bound to, else (bound to
// every interface) on this machine's host name.
func Advertised(host string, lis net.Listener) string {
	ip, port, err := net.SplitHostPort(lis.Addr().String())
	if err != nil {
		return lis.Addr().String()
	}
	if host == "" {
		if addr := net.ParseIP(ip); addr != nil && !addr.IsUnspecified() {
			host = ip
		} else if name, err := os.Hostname(); err == nil {
			host = name
		} else {
			host = "localhost"
		}
	}
	return net.JoinHostPort(host, port)
}

// Listen listens on the address a flag gave and logs where, so an operator
// (or a test) finds the port even when the flag asked for port 0.
func Listen(log *slog.Logger, what, flagName, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", flagName, err)
	}
	log.Info(what+" listening", "addr", lis.Addr().String())
	return lis, nil
}

// List splits a comma-separated flag value, leaving out empty items and
// surrounding spaces (nil for an empty value).
func List(value string) []string {
	var out []string
	for _, item := range strings.Split(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
