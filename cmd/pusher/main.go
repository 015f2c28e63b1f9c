// Command pusher serves xDS to Envoy sidecars and proxyless gRPC clients
// from the mesh in etcd, following its changes on NATS JetStream. Pushers
// are stateless: run as many as the proxies need.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/internal/version"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"github.com/shardpilot/shardpilot/pkg/telemetry/statuspage"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/sds"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"k8s.io/client-go/kubernetes"
)

func main() { cli.Main("pusher", run) }

// options are the pusher's flags.
type options struct {
	common cli.Common
	remote cli.Remote
	name   string

	// ADS and its TLS, proxies' identities, and Istio's agents' tokens.
	adsAddr, adsCert, adsKey, adsCertNames, adsClientCA string
	plaintext, tokens                                   bool
	kubeconfig, tokenAudience                           string
	clusterID, remoteClusters                           *string
	xcfg                                                server.Config
	maxStreams                                          int
	maxPerIdentity, window                              *int

	// The mesh's CA and workload certificates.
	caCert, caKey, caSealKeys, caTrust string
	certTTL, maxCertTTL                time.Duration
	certEvery                          time.Duration
	certBurst                          int
	workloadCerts                      *string
	vhds                               bool

	// What is generated, and when.
	verifyKeyFile, trustDomain, rootNamespace, outbound string
	sharedGateways                                      *string
	autoMTLS                                            *bool
	namespaces, namespacesFile                          string
	scopeByProxies                                      bool
	quiet, maxDelay, maxHold, linger, scopeGrace        time.Duration
	storeCheck                                          time.Duration
	registrationHeartbeat                               time.Duration
	// checkOnly validates the flags and exits (--check-flags).
	checkOnly bool
}

// register defines the flags on fs.
func (o *options) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	o.common.Register(fs, ":15014")
	o.remote.Register(fs)
	fs.StringVar(&o.adsAddr, "ads-addr", ":15010", "address to serve ADS (gRPC) on")
	fs.BoolVar(&o.checkOnly, "check-flags", false, "check the flags and their environment twins, as the pusher does before it starts, then exit (0: it would start; files are not read)")
	fs.StringVar(&o.verifyKeyFile, "bus-verify-key-file", "", "PEM file of the ed25519 public key (openssl pkey -pubout) of the relay's --bus-signing-key-file (two while the key is rotated): change events without a signature of one of them are refused, and the mesh is read from the store instead")
	fs.StringVar(&o.adsCert, "ads-cert-file", "", "PEM certificate ADS is served with over TLS (with --ads-key-file; read again when it changes)")
	fs.StringVar(&o.adsKey, "ads-key-file", "", "PEM key of --ads-cert-file")
	fs.StringVar(&o.adsCertNames, "ads-cert-names", "", "instead of --ads-cert-file: comma-separated DNS names of a certificate the mesh's CA signs for ADS (the pushers' Services proxies dial, istiod.<namespace>.svc for a drop-in), so that Istio's agents verify it against the roots of istio-ca-root-cert; valid for --workload-cert-ttl, renewed after two thirds of it")
	fs.StringVar(&o.adsClientCA, "ads-client-ca-file", "", "PEM CA of the proxies' client certificates: every proxy must present one, and its SPIFFE ID (spiffe://<trust domain>/ns/<namespace>/sa/<account>) decides the namespace it is served; a node claiming another is refused")
	o.sharedGateways = fs.String("shared-gateway-namespaces", "istio-system,istio-ingress", `namespaces whose gateway proxies ("router~" nodes) any namespace's Gateways may select, as a shared ingress; a gateway proxy of another namespace is selected by its own namespace's Gateways alone, so that labels a node claims cannot take it into another namespace's Gateways ("*": any Gateway selects any gateway proxy, as istiod does by default)`)
	o.autoMTLS = fs.Bool("auto-mtls", true, "give Envoys Istio's mutual TLS to the endpoints that have a sidecar (labelled security.istio.io/tlsMode: istio) and plaintext to the rest, where no DestinationRule sets TLS; in effect only where proxies get workload certificates (an authenticated ADS with a CA). Given, it overrides the mesh's MeshConfig enableAutoMtls (on by default)")
	o.workloadCerts = fs.String("workload-certificates", "pushers", "where Envoys get their workload certificate and the mesh's root (SDS \"default\" and \"ROOTCA\"): pushers (over ADS, from the pushers' CA; shardpilot's own bootstrap) or agent (from Istio's agent beside each Envoy, on its sds-grpc cluster, as istiod configures injected sidecars)")
	fs.StringVar(&o.outbound, "outbound-traffic-policy", "", "what sidecars do with traffic to destinations no service names, unless their Sidecar says: ALLOW_ANY (passed through) or REGISTRY_ONLY (refused; HTTP answered 502); empty: the mesh's MeshConfig outboundTrafficPolicy (ALLOW_ANY by default)")
	fs.BoolVar(&o.tokens, "ads-tokens", false, "also authenticate proxies without a client certificate by a Kubernetes service account token (\"authorization: Bearer <token>\", reviewed by the API server of --kubeconfig), as istiod does")
	fs.StringVar(&o.tokenAudience, "ads-token-audience", "istio-ca", "the audience a service account token must be for (empty: the API server's own)")
	o.clusterID = fs.String("cluster-id", "Kubernetes", "ID of the cluster of --kubeconfig, as its proxies' agents name it (Istio's CLUSTER_ID): their tokens are reviewed by its API server, as are those of proxies that name no cluster")
	o.remoteClusters = fs.String("token-review-clusters", "", "with --ads-tokens, the other clusters whose proxies are served: comma-separated <cluster ID>=<kubeconfig path>; a proxy's token is reviewed by the API server of the cluster it names in its ClusterID request metadata, and a proxy naming a cluster not listed is refused")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", `Kubernetes cluster whose TLS Secrets are served as gateway credentials (a Gateway's credentialName, to the identities of the Secret's namespace) and which reviews tokens (--ads-tokens): a kubeconfig path, or "in-cluster" (empty: none)`)
	fs.BoolVar(&o.scopeByProxies, "scope-by-proxies", false, "serve the namespaces of the proxies connected (of --namespaces, when given): a namespace's scope is loaded when its first proxy comes (which retries until then) and released --scope-grace after its last one left")
	fs.DurationVar(&o.scopeGrace, "scope-grace", 5*time.Minute, "with --scope-by-proxies, how long a namespace stays loaded after its last proxy left (longer than a refused proxy takes to retry)")
	fs.StringVar(&o.namespaces, "namespaces", "", "comma-separated namespaces whose proxies this pusher serves (its shard): it loads and follows only what their Sidecars let them see, and refuses proxies of other namespaces (empty: every namespace, the whole mesh)")
	fs.StringVar(&o.namespacesFile, "namespaces-file", "", "file listing the namespaces whose proxies this pusher serves, as --namespaces (separated by commas, spaces or lines; # comments), read again every second: a shard's placement, changed at run time (a ConfigMap volume). On a change the pusher loads what its new namespaces see and ends the streams of proxies of namespaces it no longer serves, which reconnect to their new shard; an unreadable file keeps the last placement")
	fs.StringVar(&o.rootNamespace, "root-namespace", "istio-system", "the mesh's root namespace: its security policies apply to every namespace (its PeerAuthentication without selector is the mesh's default)")
	fs.StringVar(&o.trustDomain, "trust-domain", "cluster.local", "the mesh's SPIFFE trust domain: client certificates of another are refused")
	fs.StringVar(&o.caCert, "ca-cert-file", "", "PEM root (or intermediate) the mesh's workload certificates are signed with, with --ca-key-file: a Secret (or a KMS/CSI driver's file) mounted into the pushers alone")
	fs.StringVar(&o.caKey, "ca-key-file", "", "PEM key of --ca-cert-file")
	fs.StringVar(&o.caSealKeys, "ca-seal-key-file", "", "instead of --ca-cert-file: a root is made on the first start and kept in etcd under "+ca.SealedRootKey+", sealed (AES-256-GCM) with the key of this file, which the pushers alone hold: one key per line, 32 bytes in base64 (openssl rand -base64 32); the first seals, every one opens, to replace it")
	fs.StringVar(&o.caTrust, "ca-trust-file", "", "PEM CA certificates proxies trust beside the one that signs (\"ROOTCA\"): while the root is replaced, the next one before it signs and the previous one until what it signed has expired")
	fs.DurationVar(&o.certTTL, "workload-cert-ttl", 24*time.Hour, "lifetime of the workload certificates served over SDS (\"default\"; issued again after two thirds of it), and of those Istio's agents get from the CA service when they ask for none")
	fs.DurationVar(&o.certEvery, "ca-identity-every", 50*time.Millisecond, "Istio's CA service signs one identity (a service account) one certificate this often, after a burst of --ca-identity-burst (0: unbounded): its pods ask at start and at each rotation; a caller asking more is refused (ResourceExhausted) and retries")
	fs.IntVar(&o.certBurst, "ca-identity-burst", 1000, "certificates one identity may be signed at once before --ca-identity-every applies (a rollout of that many pods of one service account)")
	fs.DurationVar(&o.maxCertTTL, "workload-cert-max-ttl", 90*24*time.Hour, "longest lifetime of a certificate Istio's agents get from the CA service on the ADS port (istio.v1.auth.IstioCertificateService/CreateCertificate): what they ask for, capped")
	fs.BoolVar(&o.vhds, "vhds", true, "send the sidecar and gateway Envoys that speak Delta xDS their route configurations' virtual hosts apart (VHDS, over ADS): a route change sends each the one virtual host it changed, not its port's whole route configuration; false: every Envoy gets its route configurations whole, as istiod sends them")
	fs.BoolVar(&o.plaintext, "ads-plaintext", false, "serve ADS without TLS, where any client reads any namespace's config by claiming it (for trials and tests)")
	fs.StringVar(&o.name, "name", host, "this replica's name, announced in etcd for shardctl proxy-status (the pod name)")
	fs.DurationVar(&o.quiet, "debounce-quiet", 10*time.Millisecond, "quiet period before changes are generated (streams coalesce what arrives while a response is in flight)")
	fs.DurationVar(&o.maxDelay, "debounce-max", time.Second, "longest a change waits for the quiet period")
	fs.DurationVar(&o.registrationHeartbeat, "registration-heartbeat", 10*time.Second, "how often the workloads whose agents named a WorkloadGroup (AUTO_REGISTER_GROUP) are announced again to the ingesters while their streams last; an entry not announced for three of these is taken for disconnected")
	fs.DurationVar(&o.linger, "cluster-linger", 5*time.Second, "how long a cluster a proxy no longer has is still served, so that the routes that stop naming it arrive first (negative: removed at once)")
	fs.DurationVar(&o.storeCheck, "store-check", 5*time.Second, "how often to ask etcd whether it holds changes the change stream has not brought (a stuck relay, a broken stream: the pusher is then stale, behind the store) or went back (restored: the mesh is loaded again); negative: never")
	fs.DurationVar(&o.maxHold, "debounce-max-hold", 5*time.Second, "longest a change waits while the last generation's pushes are still being written (under load, batches last as long as a wave of pushes)")
	fs.DurationVar(&o.xcfg.MaxConnectionAge, "max-connection-age", 30*time.Minute, "close proxy connections after this long so load rebalances across replicas (negative: never)")
	fs.Float64Var(&o.xcfg.StreamRate, "stream-rate", 0, "new xDS streams accepted per second; the rest are told to retry (0: unlimited)")
	fs.IntVar(&o.xcfg.MaxConcurrentPushes, "max-concurrent-pushes", 100, "senders writing responses, so responses written at once across all proxies; the rest wait (negative: unlimited, a goroutine per proxy being written to)")
	fs.IntVar(&o.xcfg.ResponseBytesPerSecond, "response-bytes-per-second", 0, "bytes of one type a proxy is sent a second, on average: after a large response the next of its type waits, carrying every change made meanwhile, so that a route configuration of megabytes does not fill a proxy's stream ahead of its other changes; 1048576 for meshes of tens of thousands of hosts every proxy sees (0: no bound)")
	fs.IntVar(&o.xcfg.DeltaResponseBytes, "delta-response-bytes", 1<<20, "largest Delta response of many load assignments or virtual hosts, encoded (clusters and listeners go whole): past it, what is left goes in the next responses of the type, each after the proxy's answer and after what changed meanwhile (smallest change first), so that thousands of services arriving at once do not hold a proxy's other changes back behind them (0: no bound)")
	fs.DurationVar(&o.xcfg.SendTimeout, "send-timeout", 10*time.Second, "longest one response's write may take before the proxy's stream is ended (negative: no limit)")
	fs.DurationVar(&o.xcfg.AnswerWait, "answer-wait", time.Second, "longest the next generations wait for a proxy to answer (or read) a response; past it the proxy is reported unanswered and, until it answers, nothing due to it holds changes back (negative: wait for every answer, up to --debounce-max-hold)")
	fs.IntVar(&o.maxStreams, "max-streams-per-connection", 100, "concurrent streams one client connection may open (an Envoy opens one ADS stream)")
	fs.IntVar(&o.xcfg.MaxConnectionsPerSource, "max-connections-per-source", 1000, "open ADS connections one source address may hold; past it a new one is closed as it is accepted, before its TLS handshake (proxies behind one NAT or gateway share an address; negative: unbounded)")
	o.maxPerIdentity = fs.Int("max-streams-per-identity", 5000, "concurrent streams the proxies of one identity (SPIFFE ID or service account) may hold on this pusher; more are refused with RESOURCE_EXHAUSTED")
	fs.IntVar(&o.xcfg.MaxNodeBytes, "max-node-bytes", 64<<10, "largest node (id, metadata, locality) a proxy may send, encoded; a larger one ends its stream")
	fs.IntVar(&o.xcfg.MaxNames, "max-subscribed-names", 50000, "most resource names one stream may subscribe to of one type; more end its stream with RESOURCE_EXHAUSTED")
	fs.IntVar(&o.xcfg.MaxNameBytes, "max-subscribed-bytes", 4<<20, "most bytes the resource names one stream subscribes to of one type may take together; more end its stream with RESOURCE_EXHAUSTED")
	fs.IntVar(&o.xcfg.NameBudget.PerStream, "max-subscribed-bytes-per-stream", 16<<20, "most bytes the names one stream subscribes to may hold, every type together (each name's bytes and 32); more end its stream with RESOURCE_EXHAUSTED")
	fs.IntVar(&o.xcfg.NameBudget.PerConnection, "max-subscribed-bytes-per-connection", 32<<20, "most bytes the names the streams of one client connection subscribe to may hold together, as --max-subscribed-bytes-per-stream")
	fs.IntVar(&o.xcfg.NameBudget.PerIdentity, "max-subscribed-bytes-per-identity", 64<<20, "most bytes the names the streams of one identity subscribe to may hold together, on every connection: a set of names many of its streams ask for counts once")
	fs.IntVar(&o.xcfg.NameBudget.PerIdentityRate, "subscribed-bytes-per-identity-rate", 16<<20, "bytes of names one identity may newly hold each second (sets none of its streams held), after a burst of --max-subscribed-bytes-per-identity: past it the request's stream ends, and the identity's new streams are refused before any of their messages is read until the rate has paid for what it asked")
	fs.IntVar(&o.xcfg.NameBudget.Total, "max-subscribed-bytes-total", 512<<20, "most bytes the names every stream subscribes to may hold together, each set of names counted once (the chart sets a quarter of the memory limit)")
	fs.IntVar(&o.xcfg.MaxLocalities, "max-locality-classes", 1000, "most localities whose load assignments are kept apart (a table each); proxies of further localities are served the mesh-wide ones")
	fs.DurationVar(&o.xcfg.DrainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long proxies get to move to another replica before their streams are closed (the pod's termination grace period must exceed it)")
	fs.DurationVar(&o.xcfg.ClassIdle, "class-idle", 5*time.Minute, "how long the resources of a class of proxies are kept after its last proxy left (negative: for good)")
	fs.IntVar(&o.xcfg.ReadBufferSize, "grpc-read-buffer", 0, "bytes of each connection's gRPC read buffer (0: 32 KiB in plaintext, where gRPC takes it from a pool only while reading; 1 KiB over TLS, whose connections gRPC cannot pool and which buffers each record itself: 32 KiB there would be held by every connection)")
	fs.IntVar(&o.xcfg.WriteBufferSize, "grpc-write-buffer", 16<<10, "bytes of each connection's gRPC write buffer (pooled: held only while writing, so by each proxy slow to read while changes flow)")
	o.window = fs.Int("grpc-window", 1<<20, "HTTP/2 flow-control window, in bytes, granted to each proxy's requests per stream and per connection (negative: grown by gRPC's estimate)")
}

// validate checks the flags before anything starts, and returns the
// namespaces served (--namespaces) and the mesh settings given as flags.
func (o *options) validate(fs *flag.FlagSet) (served []string, overrides *meshv1.MeshConfig, err error) {
	if err := o.validateLimits(); err != nil {
		return nil, nil, err
	}
	if o.namespaces != "" && o.namespacesFile != "" {
		return nil, nil, errors.New("--namespaces and --namespaces-file are alternatives: give one")
	}
	served, err = app.ParseNamespaces(o.namespaces, "--namespaces")
	if err != nil {
		return nil, nil, err
	}
	if err := o.validateSecurity(); err != nil {
		return nil, nil, err
	}
	if *o.workloadCerts != "pushers" && *o.workloadCerts != "agent" {
		return nil, nil, fmt.Errorf("--workload-certificates %q: want pushers or agent", *o.workloadCerts)
	}
	if overrides, err = o.meshOverrides(fs); err != nil {
		return nil, nil, err
	}
	return served, overrides, nil
}

// validateLimits checks what bounds the proxies' streams and fills in
// the gRPC buffers' defaults.
func (o *options) validateLimits() error {
	if *o.maxPerIdentity < 1 || o.xcfg.MaxNodeBytes < 1 || o.xcfg.MaxNames < 1 || o.xcfg.MaxNameBytes < 1 || o.xcfg.MaxLocalities < 1 {
		return fmt.Errorf("--max-streams-per-identity %d, --max-node-bytes %d, --max-subscribed-names %d, --max-subscribed-bytes %d, --max-locality-classes %d: want positive numbers",
			*o.maxPerIdentity, o.xcfg.MaxNodeBytes, o.xcfg.MaxNames, o.xcfg.MaxNameBytes, o.xcfg.MaxLocalities)
	}
	if o.xcfg.MaxConnectionsPerSource == 0 {
		return errors.New("--max-connections-per-source 0: want a positive number, or a negative one for unbounded")
	}
	if o.maxStreams < 1 {
		return fmt.Errorf("--max-streams-per-connection %d: want at least 1", o.maxStreams)
	}
	if b := o.xcfg.NameBudget; b.PerStream < 1 || b.PerConnection < 1 || b.PerIdentity < 1 || b.Total < 1 || b.PerIdentityRate < 1 {
		return fmt.Errorf("--max-subscribed-bytes-per-stream %d, --max-subscribed-bytes-per-connection %d, --max-subscribed-bytes-per-identity %d, --max-subscribed-bytes-total %d, --subscribed-bytes-per-identity-rate %d: want positive numbers",
			b.PerStream, b.PerConnection, b.PerIdentity, b.Total, b.PerIdentityRate)
	}
	if o.xcfg.ReadBufferSize < 0 || o.xcfg.WriteBufferSize < 1 {
		return fmt.Errorf("--grpc-read-buffer %d, --grpc-write-buffer %d: want a read buffer of 0 (the default for the transport) or more, and a positive write buffer", o.xcfg.ReadBufferSize, o.xcfg.WriteBufferSize)
	}
	if o.xcfg.ReadBufferSize == 0 {
		// Measured with 1,000 proxies (loadtest run --tls): 63 KiB of heap
		// per proxy over TLS with 32 KiB, 32 KiB with 1 KiB; 16 KiB in
		// plaintext, where the 32 KiB are pooled.
		o.xcfg.ReadBufferSize = 32 << 10
		if !o.plaintext {
			o.xcfg.ReadBufferSize = 1 << 10
		}
	}
	if *o.window >= 0 && *o.window < 64<<10 || *o.window > math.MaxInt32 {
		return fmt.Errorf("--grpc-window %d: want from 65536 (HTTP/2's default) to %d, or negative", *o.window, math.MaxInt32)
	}
	o.xcfg.MaxStreamsPerConnection, o.xcfg.InitialWindowSize = uint32(o.maxStreams), int32(*o.window)
	return nil
}

// validateSecurity checks the flags of ADS's TLS, the CA, tokens, the
// workload certificates and the registrations, which go together.
func (o *options) validateSecurity() error {
	switch {
	case o.plaintext && (o.adsCert != "" || o.adsKey != "" || o.adsClientCA != ""):
		return errors.New("--ads-plaintext and --ads-cert-file, --ads-key-file, --ads-client-ca-file are alternatives: give one")
	case o.plaintext && o.adsCertNames != "":
		return errors.New("--ads-plaintext and --ads-cert-names are alternatives: give one")
	case o.adsCertNames != "" && (o.adsCert != "" || o.adsKey != ""):
		return errors.New("--ads-cert-names and --ads-cert-file are alternatives: give one")
	case o.adsCertNames != "" && o.adsClientCA == "":
		return errors.New("--ads-cert-names: the certificate comes from the mesh's CA, which serves authenticated proxies only; give --ads-client-ca-file and the CA")
	case *o.remoteClusters != "" && !o.tokens:
		return errors.New("--token-review-clusters: give --ads-tokens too")
	case !o.plaintext && o.adsCertNames == "" && (o.adsCert == "" || o.adsKey == ""):
		return errors.New("ADS is served over TLS: give --ads-cert-file and --ads-key-file, or --ads-cert-names for a certificate of the mesh's CA (and --ads-client-ca-file to authenticate proxies), or --ads-plaintext for a trial")
	}
	if (o.caCert == "") != (o.caKey == "") {
		return errors.New("--ca-cert-file and --ca-key-file go together")
	}
	if o.caCert != "" && o.caSealKeys != "" {
		return errors.New("--ca-cert-file and --ca-seal-key-file are alternatives: give one")
	}
	if o.adsClientCA != "" && o.caCert == "" && o.caSealKeys == "" {
		return errors.New("--ads-client-ca-file: authenticated proxies are served workload certificates, which need a CA: give --ca-cert-file and --ca-key-file (a Secret mounted into the pushers alone), or --ca-seal-key-file (a root made on the first start, kept in etcd sealed with that key)")
	}
	if o.tokens && (o.kubeconfig == "" || o.adsClientCA == "") {
		return errors.New("--ads-tokens: tokens are reviewed by the API server of --kubeconfig, beside client certificates of --ads-client-ca-file: give both")
	}
	if o.kubeconfig != "" && o.adsClientCA == "" {
		return errors.New("--kubeconfig: gateway credentials are served to authenticated proxies only; give --ads-client-ca-file too")
	}
	if (o.caCert != "" || o.caSealKeys != "" || o.caTrust != "") && o.adsClientCA == "" {
		return errors.New("--ca-cert-file, --ca-seal-key-file, --ca-trust-file: workload certificates are served to authenticated proxies only; give --ads-client-ca-file too")
	}
	if o.registrationHeartbeat <= 0 || o.registrationHeartbeat > model.MaxRegistrationHeartbeat {
		return fmt.Errorf("--registration-heartbeat %s: want above 0 and at most %s (the ingesters refuse longer)", o.registrationHeartbeat, model.MaxRegistrationHeartbeat)
	}
	if o.certEvery < 0 || (o.certEvery > 0 && o.certBurst < 1) {
		return fmt.Errorf("--ca-identity-every %s, --ca-identity-burst %d: want a positive burst, or --ca-identity-every 0 for no bound", o.certEvery, o.certBurst)
	}
	if o.certTTL < time.Minute || o.maxCertTTL < o.certTTL {
		return fmt.Errorf("--workload-cert-ttl %s, --workload-cert-max-ttl %s: want at least a minute, and the maximum no shorter", o.certTTL, o.maxCertTTL)
	}
	return nil
}

// meshOverrides are the mesh settings the flags set over the mesh's
// MeshConfig: --auto-mtls when given, --outbound-traffic-policy.
func (o *options) meshOverrides(fs *flag.FlagSet) (*meshv1.MeshConfig, error) {
	overrides := &meshv1.MeshConfig{}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "auto-mtls" {
			overrides.EnableAutoMtls = o.autoMTLS
		}
	})
	switch o.outbound {
	case "":
	case "ALLOW_ANY":
		overrides.OutboundTrafficPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_ALLOW_ANY
	case "REGISTRY_ONLY":
		overrides.OutboundTrafficPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY
	default:
		return nil, fmt.Errorf("--outbound-traffic-policy %q: want ALLOW_ANY, REGISTRY_ONLY or empty (the mesh's)", o.outbound)
	}
	return overrides, nil
}

func run(ctx context.Context, args []string) (err error) {
	var o options
	fs := flag.NewFlagSet("pusher", flag.ContinueOnError)
	o.register(fs)
	if err := cli.Parse(fs, "shardpilot pusher: etcd + NATS JetStream → xDS (ADS) for every proxy.", args); err != nil {
		return err
	}
	served, overrides, err := o.validate(fs)
	if err != nil || o.checkOnly {
		return err
	}
	log, adminToken, err := o.common.Start()
	if err != nil {
		return err
	}
	reg := telemetry.NewRegistry(version.Collector())
	kube, policy, err := o.identities(reg)
	if err != nil {
		return err
	}
	busCfg, err := verifyingBus(o.remote.Stream, o.verifyKeyFile, log)
	if err != nil {
		return err
	}
	conns, err := app.Connect(o.remote, "shardpilot-pusher", log)
	if err != nil {
		return err
	}
	defer conns.Close()
	etcd, nc := conns.Etcd, conns.NATS
	adsLis, adminLis, adminTLSLis, adminTLS, err := o.common.ListenWithADS(log, o.adsAddr)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil { // the servers close them once they run
			cli.CloseAll(adsLis, adminLis, adminTLSLis)
		}
	}()

	ready := telemetry.NewReadiness()
	sec, err := o.secure(ctx, etcd, kube, policy, ready, log, reg)
	if err != nil {
		return err
	}
	secrets, certificates, readCredentials, clientCA := sec.secrets, sec.certificates, sec.readCredentials, sec.clientCA
	status := server.NewStreams()
	var authenticated *identity.Policy
	if o.adsClientCA != "" {
		authenticated = &policy
	}
	built, err := app.Pusher{Etcd: etcd, NATS: nc, Bus: busCfg, ADS: adsLis, RootNamespace: o.rootNamespace, Namespaces: served, NamespacesFile: o.namespacesFile, ScopeByProxies: o.scopeByProxies, ScopeGrace: o.scopeGrace, MeshOverrides: overrides, TrustDomain: o.trustDomain, AgentCertificates: *o.workloadCerts == "agent", WholeRoutes: !o.vhds, ClientCA: clientCA, SharedGatewayNamespaces: append([]string{}, cli.List(*o.sharedGateways)...), Policy: authenticated, Quiet: o.quiet, MaxDelay: o.maxDelay, MaxHold: o.maxHold, ClusterLinger: o.linger, StoreCheck: o.storeCheck,
		Name: o.name, RegistrationHeartbeat: o.registrationHeartbeat,
		XDS: o.xcfg, Certificates: certificates, Log: log, Registerer: reg, Streams: status}.Build()
	if err != nil {
		return err
	}
	ps := built.Pusher
	// Ready once a config is loaded, and ready it stays: with etcd or NATS
	// out of reach it serves its last config (stale is a metric, an alert
	// and a state of the status page), as a proxy is better served that
	// than refused.
	ready.Check("mesh loaded", func() bool { return ps.GeneratedRevision() > 0 })
	ready.Detail(ps.StaleReason)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return built.Run(ctx) })
	me := o.common.Member("pusher", o.name, adsLis, adminLis, adminTLSLis)
	g.Go(func() error { return store.Announce(ctx, etcd, me, 0, log) })
	if secrets != nil {
		g.Go(func() error { return secrets.Run(ctx) })
	}
	if readCredentials != nil {
		g.Go(func() error { return readCredentials(ctx) })
	}
	page := statuspage.New(statuspage.Config{Title: "pusher", Version: version.String(), Gatherer: reg, Streams: app.PageStreams(status), Stale: ps.Stale, StaleReason: ps.StaleReason})
	g.Go(func() error { return page.Run(ctx) })
	admin := &telemetry.Admin{Listener: adminLis, TLSListener: adminTLSLis, TLS: adminTLS, Gatherer: reg, Ready: ready, Log: log, DebugToken: adminToken,
		TokenOnLoopback: o.common.AdminTokenOnLoopback, Page: page, Debug: map[string]http.Handler{"/debug/syncz": status, "/debug/config_dump": built.Dump,
			"/debug/security": telemetry.WeaknessHandler(func(ctx context.Context) []telemetry.Weakness {
				return append(o.common.Weaknesses(ctx, &o.remote, nc, etcd), o.weaknesses()...)
			})}}
	g.Go(func() error { return admin.Run(ctx) })
	return g.Wait()
}

// weaknesses are the pusher's own weak settings (shardctl security-check).
func (o *options) weaknesses() []telemetry.Weakness {
	var ws []telemetry.Weakness
	switch {
	case o.plaintext:
		ws = append(ws, telemetry.Weakness{Severity: telemetry.High, Setting: "--ads-cert-file and --ads-client-ca-file instead of --ads-plaintext (chart: pusher.ads.tls)",
			Risk: "ADS is served in plaintext: any client reads any namespace's config by claiming to be there, and the config crosses the network readable"})
	case o.adsClientCA == "":
		ws = append(ws, telemetry.Weakness{Severity: telemetry.High, Setting: "--ads-client-ca-file (chart: pusher.ads.tls.authenticateClients)",
			Risk: "ADS proxies are not authenticated: any client reads any namespace's config by claiming it"})
	}
	if o.verifyKeyFile == "" {
		ws = append(ws, telemetry.Weakness{Severity: telemetry.High, Setting: "--bus-verify-key-file (chart: nats.signing)",
			Risk: "change events are not verified: a NATS credential that may publish into the stream forges any namespace's config"})
	}
	return ws
}

// identities makes what identifies proxies: the Kubernetes client of
// --kubeconfig (nil without), and the policy, with the streams each
// identity may hold and, with --ads-tokens, the clusters that review
// tokens.
func (o *options) identities(reg prometheus.Registerer) (kubernetes.Interface, identity.Policy, error) {
	var kube kubernetes.Interface
	if o.kubeconfig != "" {
		kc, err := cli.KubeConfig(o.kubeconfig)
		if err == nil {
			kube, err = kubernetes.NewForConfig(kc)
		}
		if err != nil {
			return nil, identity.Policy{}, fmt.Errorf("--kubeconfig %s: %w", o.kubeconfig, err)
		}
	}
	streams, err := identity.NewStreamLimit(*o.maxPerIdentity, reg)
	if err != nil {
		return nil, identity.Policy{}, err
	}
	policy := identity.Policy{TrustDomain: o.trustDomain, Required: true, Streams: streams}
	if o.tokens {
		if policy.Tokens, err = tokenReview(kube, *o.clusterID, *o.remoteClusters, o.tokenAudience, o.trustDomain); err != nil {
			return nil, identity.Policy{}, err
		}
	}
	return kube, policy, nil
}

// security is what authenticates proxies and serves their certificates.
type security struct {
	secrets         *sds.Secrets
	certificates    *ca.Service
	readCredentials func(context.Context) error
	clientCA        *identity.ClientCA
}

// secure sets up ADS's TLS in o.xcfg and, for authenticated proxies, the
// mesh's CA, their workload certificates and Istio's CA service.
func (o *options) secure(ctx context.Context, etcd *clientv3.Client, kube kubernetes.Interface, policy identity.Policy, ready *telemetry.Readiness,
	log *slog.Logger, reg prometheus.Registerer) (security, error) {
	var sec security
	var root *ca.CA
	var err error
	if o.adsClientCA != "" {
		// Authenticated proxies are served their workload certificates,
		// and Istio's agents ask the same CA on the same port.
		if root, err = meshCA(ctx, etcd, o.caCert, o.caKey, o.caSealKeys, o.caTrust, o.trustDomain, log); err != nil {
			return sec, err
		}
		if reg != nil {
			if err := reg.Register(ca.ExpiryCollector(root)); err != nil {
				return sec, err
			}
		}
		var check func() bool
		if sec.secrets, sec.certificates, sec.readCredentials, check, err = workloadCertificates(root, policy, kube,
			ca.Service{TTL: o.certTTL, MaxTTL: o.maxCertTTL, PerIdentity: o.certEvery, PerIdentityBurst: o.certBurst}, log, reg); err != nil {
			return sec, err
		}
		o.xcfg.Secrets = sec.secrets
		if check != nil {
			ready.Check("gateway credentials read", check)
		}
	}
	if o.plaintext {
		return sec, nil
	}
	tc, cca, err := adsTLS(o.adsCert, o.adsKey, o.adsCertNames, o.adsClientCA, root, o.certTTL, o.tokens, log)
	if err != nil {
		return sec, err
	}
	o.xcfg.GRPCOptions = append(o.xcfg.GRPCOptions, grpc.Creds(credentials.NewTLS(tc)))
	if o.adsClientCA != "" {
		sec.clientCA = cca
	} else {
		log.Warn("ADS proxies are not authenticated: any client reads any namespace's config by claiming it; give --ads-client-ca-file")
	}
	return sec, nil
}

// verifyingBus returns the configuration of the bus a pusher reads: the
// stream, and the relay's keys its events must be signed with, when given.
func verifyingBus(stream, verifyKeyFile string, log *slog.Logger) (bus.Config, error) {
	cfg := bus.Config{Stream: stream}
	if verifyKeyFile != "" {
		keys, err := cli.VerifyKeys("bus-verify-key-file", verifyKeyFile)
		if err != nil {
			return cfg, err
		}
		cfg.Verify = keys
	} else {
		log.Warn("change events are not verified: a NATS credential that may publish into the stream can forge config; give --bus-verify-key-file")
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("--stream: %w", err)
	}
	return cfg, nil
}

// meshCA loads the mesh's CA (an operator's root or intermediate, or one
// kept in etcd sealed), adds the roots proxies also trust, and publishes
// them for Istio's agents in every namespace (the ingesters' part).
func meshCA(ctx context.Context, etcd *clientv3.Client, certFile, keyFile, sealKeysFile, trustFile, trustDomain string, log *slog.Logger) (*ca.CA, error) {
	var root *ca.CA
	var err error
	if certFile != "" {
		root, err = ca.FromFiles(certFile, keyFile)
	} else {
		var keys ca.SealKeys
		if keys, err = ca.ReadSealKeys(sealKeysFile); err == nil {
			root, err = ca.FromStore(ctx, store.New(etcd), trustDomain, keys, log.With("part", "ca"))
		}
	}
	if err == nil && trustFile != "" {
		err = root.AlsoTrust(trustFile)
	}
	if err == nil {
		err = ca.PublishTrust(ctx, store.New(etcd), root)
	}
	return root, err
}

// workloadCertificates serves root's workload certificates over SDS and
// Istio's CA service, and, with a Kubernetes client, its TLS Secrets as
// gateway credentials: readCredentials then follows them, and read says
// whether they were read. limits holds the CA service's TTLs and per-identity rate.
func workloadCertificates(root *ca.CA, policy identity.Policy, kube kubernetes.Interface, limits ca.Service, log *slog.Logger,
	reg prometheus.Registerer) (secrets *sds.Secrets, certificates *ca.Service, readCredentials func(context.Context) error, read func() bool, err error) {
	var creds *sds.KubeCredentials
	scfg := sds.Config{CA: root, TTL: limits.TTL, Identify: policy.Identify, Log: log.With("part", "sds"), Registerer: reg}
	if kube != nil {
		creds = sds.NewKubeCredentials(kube, log.With("part", "credentials"))
		scfg.Credentials = creds
	}
	if secrets, err = sds.New(scfg); err != nil {
		return nil, nil, nil, nil, err
	}
	if certificates, err = ca.NewService(&ca.Service{CA: root, Identify: policy.Identify, TTL: limits.TTL, MaxTTL: limits.MaxTTL,
		PerIdentity: limits.PerIdentity, PerIdentityBurst: limits.PerIdentityBurst, Log: log.With("part", "ca")}, reg); err != nil {
		return nil, nil, nil, nil, err
	}
	if creds != nil {
		done := &atomic.Bool{}
		readCredentials = func(ctx context.Context) error {
			return creds.Run(ctx, secrets.CredentialsChanged, func() { done.Store(true) })
		}
		read = done.Load
	}
	return secrets, certificates, readCredentials, read, nil
}

// tokenReview reviews proxies' service account tokens for audience with
// the API server of their cluster: local's (clusterID), or one of remote,
// a list of <cluster ID>=<kubeconfig path>.
func tokenReview(local kubernetes.Interface, clusterID, remote, audience, trustDomain string) (*identity.Tokens, error) {
	if clusterID == "" {
		return nil, errors.New("--cluster-id: want the ID of the cluster of --kubeconfig (Istio's default is Kubernetes)")
	}
	t := &identity.Tokens{Client: local, Cluster: clusterID, TrustDomain: trustDomain, Remote: map[string]kubernetes.Interface{}}
	if audience != "" {
		t.Audiences = []string{audience}
	}
	for _, item := range cli.List(remote) {
		id, path, ok := strings.Cut(item, "=")
		if id, path = strings.TrimSpace(id), strings.TrimSpace(path); !ok || id == "" || path == "" {
			return nil, fmt.Errorf("--token-review-clusters: %q: want <cluster ID>=<kubeconfig path>", item)
		}
		if _, dup := t.Remote[id]; dup || id == clusterID {
			return nil, fmt.Errorf("--token-review-clusters: cluster %q is given twice (--cluster-id is %q)", id, clusterID)
		}
		kc, err := cli.KubeConfig(path)
		if err == nil {
			t.Remote[id], err = kubernetes.NewForConfig(kc)
		}
		if err != nil {
			return nil, fmt.Errorf("--token-review-clusters: cluster %s: %w", id, err)
		}
	}
	return t, nil
}

// adsTLS is ADS's TLS configuration: the files' certificate, or one the
// mesh's CA signs for names (as Istio's agents verify istiod's), and
// client certificates of clientCA required (optional with tokens).
func adsTLS(certFile, keyFile, names, clientCA string, root *ca.CA, ttl time.Duration, tokens bool, log *slog.Logger) (*tls.Config, *identity.ClientCA, error) {
	var tc *tls.Config
	var cca *identity.ClientCA
	var err error
	if certFile != "" {
		tc, cca, err = identity.ServerTLSWithClientCA(certFile, keyFile, clientCA, tokens, log)
	} else {
		tc, cca, err = identity.ServerTLSFromSource(root.ServingCertificate(cli.List(names), ttl), clientCA, tokens, log)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("--ads-cert-file, --ads-key-file, --ads-cert-names, --ads-client-ca-file: %w", err)
	}
	return tc, cca, nil
}
