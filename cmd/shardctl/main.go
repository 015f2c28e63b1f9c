// Command shardctl inspects a running mesh, as istioctl does for Istio:
// which proxies are connected to which pusher and whether they are in
// sync, what one proxy is served, and what the ingesters rejected. It finds
// the pushers and ingesters where they announce themselves in etcd and asks
// each one's admin port.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardpilot/shardpilot/internal/cli"
)

func main() {
	cli.Main("shardctl", func(ctx context.Context, args []string) error { return run(ctx, args, os.Stdout, os.Stderr) })
}

const summary = `shardctl: inspect a running shardpilot mesh.

Commands:
  proxy-status [<proxy>]  (ps)       every connected proxy once, with its pusher and sync state per type
                                     (SYNCED, NACKED, STALE, NOT SENT); one proxy in detail, with its last NACK
  proxy-config <proxy> <what>  (pc)  what a proxy is served: clusters, routes, listeners, endpoints or secrets
  analyze [-f <file>]                the objects the ingesters rejected, where they are and why; with -f,
                                     YAML files checked offline
  members                            the pushers and ingesters announced in etcd
  security-check                     the weak settings of every pusher and ingester, and what each costs;
                                     exit status 1 when one is of high severity
  version                            shardctl's version and every announced pusher's and ingester's
  bug-report [<archive>]             an archive of what every replica says of itself, for a report
  log-level [<level>]                the level of every pusher's and ingester's logs; with a level, set it
                                     until they restart
  completion bash|zsh                a completion script for the shell (source <(shardctl completion bash))
  bus-permissions [<stream>]         the NATS permissions of each role (the ingester's relay, the pushers),
                                     as nats-server users and nsc commands; needs no etcd
  etcd-roles [apply <password-dir>]  the etcd role and user of each part (ingester, pusher, shardctl) with the
                                     least it needs, as etcdctl commands; "apply" makes them, signed in as root
                                     (--etcd-username root), the passwords in <password-dir>/<part>

Pushers and ingesters announce themselves in etcd; shardctl asks each one's admin port,
which answers loopback, or a bearer token (--admin-token-file, the token the pushers and
ingesters were given). Exit status 1 when a pusher or ingester could not be asked: what the
others answered is still printed.`

// command is one subcommand.
type command struct {
	usage, help string
	run         func(ctx context.Context, o *options, args []string) error
}

var commands = map[string]command{
	"proxy-status": {"proxy-status [<proxy>] [-n <namespace>]", `Every connected proxy once, named <pod>.<namespace> as istioctl names it, with its
pusher and each type's state: SYNCED (the last response ACKed), NACKED, STALE (sent,
not answered yet) or NOT SENT. With -n, the proxies of one namespace. With a proxy (its
node id, <pod>.<namespace>, or <pod> with -n), that proxy in detail, with its last NACK.
-o json or yaml prints every field.`, proxyStatus},
	"proxy-config": {"proxy-config <proxy> clusters|routes|listeners|endpoints|secrets", `What one proxy is served of one type, from the pusher it is connected to: a summary
table, or each resource whole with -o json or yaml. --name (a pattern), --fqdn and
--port keep some of them, as istioctl's filters do. Secrets are the certificates the
pushers serve the proxy's identity over SDS: their identity, serial and validity,
never a key. The proxy is its node id,
<pod>.<namespace>, or <pod> with -n.`, proxyConfig},
	"analyze": {"analyze [-f <file or directory>]...", `The inputs the ingesters rejected or warned of: where each is (file and document, or
Kubernetes object), the field and the reason. The last valid version of a rejected
input stays in effect. With -f, the YAML files and directories given instead, checked
as the ingesters check them, without a cluster or a store (before kubectl apply); exit
status 1 when one would be rejected.`, analyze},
	"members": {"members", "The pushers and ingesters announced in etcd, with their admin and ADS addresses.", members},
	"security-check": {"security-check", `The weak settings every pusher and ingester reports (/debug/security), each once
with the replicas that have it: NATS or etcd letting in clients without a credential
or reached in the clear, ADS in plaintext or without client authentication, change
events neither signed nor verified, /debug/ open to a port-forward. Each names the
flag (and chart value) that closes it and what it costs while open. Exit status 1
when one is of high severity.`, securityCheck},
	"bus-permissions": {"bus-permissions [<stream>]", `The NATS permissions of each role (the ingester's relay, the pushers) on the change
stream, as nats-server users and nsc commands. Needs no etcd.`, busPermissions},
	"etcd-roles": {"etcd-roles [apply <password-dir>]", `The etcd role and user of each part (ingester, pusher, shardctl) with the least it
needs, as etcdctl commands; "apply" makes them, signed in as root (--etcd-username
root), the passwords read from <password-dir>/<part>; with <password-dir>/root, an etcd
whose authentication is off (a new one) is given that root password and has it turned on.`, etcdRoles},
	"version": {"version", "shardctl's version, and every announced pusher's and ingester's.", versions},
	"bug-report": {"bug-report [<archive>]", `An archive (.tar.gz) of what every pusher and ingester says of itself, to attach to a
report of a problem: its readiness, metrics, proxies' state, rejected inputs, weak
settings, log level and goroutines, with shardctl's version and the members. No config
dump: no secret, certificate or key. The archive is written where the name says
(default shardpilot-bug-report-<time>.tar.gz here), never over a file.`, bugReport},
	"log-level": {"log-level [debug|info|warn|error]", `The level of every pusher's and ingester's logs; with a level, sets it on each of them
until it restarts (its --log-level then applies again). Each logs the change.`, logLevels},
}

func init() {
	// Added here: completion lists the commands, so the map's initializer
	// cannot name it.
	commands["completion"] = command{"completion bash|zsh", "A completion script for the shell: source <(shardctl completion bash).", completion}
	// istioctl's short names.
	commands["ps"], commands["pc"] = commands["proxy-status"], commands["proxy-config"]
}

// fileList is a flag given once per file.
type fileList []string

func (l *fileList) String() string     { return strings.Join(*l, ",") }
func (l *fileList) Set(v string) error { *l = append(*l, v); return nil }

func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" }

// options are the flags every command takes.
type options struct {
	etcd      cli.Etcd
	admin     string
	tokenFile string
	caFile    string
	output    string
	timeout   time.Duration
	namespace string
	// filter keeps some of proxy-config's resources.
	filter resourceFilter
	// files are analyze's, read offline.
	files fileList
	// kube, when set, finds the pushers and ingesters as pods.
	kube *kube

	token          string
	client         *http.Client
	stdout, stderr io.Writer
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := &options{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("shardctl <command> [<arguments>]", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.etcd.Register(fs)
	fs.StringVar(&o.admin, "admin-addrs", "", "comma-separated host:port admin addresses to ask instead of those announced in etcd (a port-forward, the standalone)")
	fs.StringVar(&o.tokenFile, "admin-token-file", "", "file holding the bearer token the admin ports were given (needed unless they are on this host); it is sent over TLS, to loopback or to --admin-addrs alone, never in the clear to an address etcd announces")
	fs.StringVar(&o.caFile, "admin-ca-file", "", "PEM CA of the admin ports' TLS certificates (--admin-tls-addr on the pushers and ingesters; default: the system's roots); with --admin-addrs, the addresses are asked over TLS")
	fs.StringVar(&o.output, "output", "table", "output format: table, json or yaml")
	fs.StringVar(&o.output, "o", "table", "short for --output")
	fs.StringVar(&o.namespace, "namespace", "", "proxy-status: only the proxies of this namespace (default all); a proxy named <pod> alone is looked for in it")
	fs.StringVar(&o.namespace, "n", "", "short for --namespace")
	var all bool
	fs.BoolVar(&all, "all-namespaces", false, "proxy-status: the proxies of every namespace (the default; kubectl's -A)")
	fs.BoolVar(&all, "A", false, "short for --all-namespaces")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "how long to wait for etcd and for every admin port")
	fs.Var(&o.files, "f", "analyze: a YAML file or directory to check offline, as the ingesters would (repeat it for more)")
	fs.Var(&o.files, "filename", "long for -f")
	fs.StringVar(&o.filter.name, "name", "", "proxy-config: only the resources whose name matches this pattern (path.Match: * and ?), as istioctl's --name")
	fs.StringVar(&o.filter.fqdn, "fqdn", "", "proxy-config clusters and endpoints: only those of this host (outbound|<port>|<subset>|<fqdn>), as istioctl's --fqdn")
	fs.UintVar(&o.filter.port, "port", 0, "proxy-config clusters, endpoints and listeners: only those of this port, as istioctl's --port")
	k := &kube{}
	fs.StringVar(&k.namespace, "kube-namespace", "", "find the pushers and ingesters as the ready pods of this namespace (the chart's release namespace) instead of in etcd, as istioctl finds istiod: labelled app.kubernetes.io/component=pusher or ingester, asked at their admin port")
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig for --kube-namespace (default: $KUBECONFIG, then ~/.kube/config, then the pod's service account)")
	fs.StringVar(&k.context, "context", "", "the kubeconfig context for --kube-namespace (default: its current context)")
	fs.StringVar(&k.selector, "kube-selector", "", "more labels the pods must have, with --kube-namespace (app.kubernetes.io/instance=<release> when two releases share the namespace)")
	fs.StringVar(&k.reach, "kube-reach", reachPortForward, "how the pods found are reached: port-forward (through the API server, as kubectl port-forward, from anywhere) or pod-ip (their IPs, from a pod in the cluster)")
	fs.Usage = func() { cli.Usage(fs.Output(), fs, cli.Prefix, summary) }
	if len(args) > 1 && slices.ContainsFunc(args[1:], isHelp) {
		if cmd, ok := commands[args[0]]; ok {
			fmt.Fprintf(stdout, "Usage: shardctl %s [flags]\n\n%s\n\nThe flags every command takes: shardctl --help.\n", cmd.usage, cmd.help)
			return nil
		}
	}
	args, err := cli.ParseArgs(fs, summary, args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		fs.Usage()
		return errors.New("no command given")
	}
	cmd, ok := commands[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q: want proxy-status, proxy-config, analyze, members, version, bus-permissions, etcd-roles or completion (see --help)", args[0])
	}
	if all && o.namespace != "" {
		return fmt.Errorf("--all-namespaces and --namespace %q: one or the other", o.namespace)
	}
	if o.output != "table" && o.output != "json" && o.output != "yaml" {
		return fmt.Errorf("--output %q: want table, json or yaml", o.output)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s: want a positive duration", o.timeout)
	}
	if o.tokenFile != "" {
		common := cli.Common{AdminTokenFile: o.tokenFile}
		if o.token, err = common.AdminToken(); err != nil {
			return err
		}
	}
	if o.client, err = adminClient(o.caFile); err != nil {
		return err
	}
	if k.namespace == "" && (k.kubeconfig != "" || k.context != "" || k.selector != "") {
		return errors.New("--kubeconfig, --context and --kube-selector find the pushers and ingesters in Kubernetes: give --kube-namespace, the release's namespace, too")
	}
	if k.namespace != "" {
		if o.admin != "" {
			return errors.New("--kube-namespace and --admin-addrs: the pushers are found one way or the other, not both")
		}
		if k.reach != reachPortForward && k.reach != reachPodIP {
			return fmt.Errorf("--kube-reach %q: want %s or %s", k.reach, reachPortForward, reachPodIP)
		}
		k.tls, o.kube = o.caFile != "", k
		defer k.close()
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	if err := cmd.run(ctx, o, args[1:]); err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	return nil
}

// table writes aligned columns.
type table struct{ w *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{w: tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.w, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.w.Flush() }

// age prints how long ago t was, as kubectl does.
func age(t time.Time) string {
	d := time.Since(t)
	switch {
	case t.IsZero():
		return ""
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// adminClient returns the HTTP client of the admin ports: TLS verified
// against caFile when given, else the system's roots.
func adminClient(caFile string) (*http.Client, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--admin-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--admin-ca-file %s: no PEM certificate", caFile)
		}
		tc.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tc
	return &http.Client{Transport: tr}, nil
}
