package istiod

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/types/known/structpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// minPercent is the share of facts each case must have equal.
const minPercent = 95.0

// TestAgainstIstiod gives istiod (ISTIO_BIN, built by
// hack/istio-binaries.sh) and shardpilot (the binaries of SHARDPILOT_BIN,
// default .bin) one kube-apiserver holding every case of testdata/cases,
// each in a namespace of its own beside Bookinfo, then asks both, as the
// same sidecar of the case's namespace, for its configuration, and
// compares the facts that concern the case's hosts. make diff-istiod runs
// it; without ISTIO_BIN it is skipped.
func TestAgainstIstiod(t *testing.T) {
	differential(t, "", func(string) bool { return true })
}

// telemetryProviders are the tracing and access log providers of the
// cases that compare them (their collector is a service of the case
// 23-telemetry).
const telemetryProviders = `extensionProviders:
- name: otel
  opentelemetry: {service: reviews.case-telemetry.svc.cluster.local, port: 9080}
- name: zipkin
  zipkin: {service: ratings.case-telemetry.svc.cluster.local, port: 9080}
- name: json-log
  envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {method: "%REQ(:METHOD)%", code: "%RESPONSE_CODE%"}}}
`

// meshSettings are a MeshConfig whose every field the pushers act on
// differs from istiod's default.
const meshSettings = `connectTimeout: 3s
protocolDetectionTimeout: 100ms
dnsRefreshRate: 30s
h2UpgradePolicy: UPGRADE
enableAutoMtls: false
outboundTrafficPolicy: {mode: REGISTRY_ONLY}
pathNormalization: {normalization: MERGE_SLASHES}
defaultHttpRetryPolicy: {attempts: 4, retryOn: "5xx,503", perTryTimeout: 2s}
localityLbSetting: {enabled: true, failover: [{from: us-east, to: us-west}]}
defaultConfig: {gatewayTopology: {numTrustedProxies: 2, forwardClientCertDetails: APPEND_FORWARD}}
`

// TestAgainstIstiodMeshConfig compares some cases again under a MeshConfig
// that changes every default the pushers take from it: istiod reads it
// from its file, shardpilot from the ConfigMap istio of istio-system.
func TestAgainstIstiodMeshConfig(t *testing.T) {
	differential(t, meshSettings, func(name string) bool {
		return slices.Contains([]string{"01-bookinfo", "05-timeouts-retries", "08-subset-port-policy", "10-serviceentry-dns",
			"11-locality-failover", "13-sidecar-scope", "17-ingress-gateway", "18-gateway-tls", "19-websocket"}, name)
	})
}

// differential runs both control planes with the mesh's settings (YAML
// of Istio's MeshConfig) and compares the facts of the cases named.
func differential(t *testing.T, settings string, named func(string) bool) {
	istioBin, ourBin := binaries(t, "diff-istiod")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	work := t.TempDir()
	settings = "rootNamespace: istio-system\ntrustDomain: cluster.local\n" + telemetryProviders + settings
	kubeconfig, cases := startCases(t, ctx, istioSource(t, istioBin), work, settings)
	cases = slices.DeleteFunc(cases, func(c testCase) bool { return !named(c.name) })
	istiod := startIstiod(t, ctx, istioBin, kubeconfig, work, settings)
	ours := startShardpilot(t, ctx, ourBin, kubeconfig, work)

	var failed []string
	var report strings.Builder
	fmt.Fprintf(&report, "%-28s %8s %8s %7s\n", "case", "facts", "equal", "%")
	for _, c := range cases {
		theirs, mine := settledFacts(t, ctx, c, istiod, ours)
		checkHosts(t, c, map[string]Facts{"istiod": theirs, "shardpilot": mine})
		diff := Compare(theirs, mine)
		fmt.Fprintf(&report, "%-28s %8d %8d %6.1f%%\n", c.name, diff.Compared, diff.Equal, diff.Percent())
		if out := os.Getenv("DIFF_ISTIOD_OUT"); out != "" {
			if err := os.MkdirAll(out, 0o755); err == nil {
				_ = os.WriteFile(filepath.Join(out, c.name+".diff"), []byte(strings.Join(diff.Differences, "\n")+"\n"), 0o644)
			}
		}
		if diff.Percent() < minPercent {
			failed = append(failed, c.name)
			for _, d := range diff.Differences[:min(len(diff.Differences), 40)] {
				t.Logf("%s: %s", c.name, d)
			}
		}
	}
	t.Logf("facts istiod and shardpilot send a sidecar, per case:\n%s", report.String())
	if len(failed) > 0 {
		t.Errorf("below %.0f%% equal facts: %v (DIFF_ISTIOD_OUT=<dir> writes every difference)", minPercent, failed)
	}
}

// istioSource is Istio's source tree: ISTIO_SRC, else the one the
// binaries of bin were built from.
func istioSource(t *testing.T, bin string) string {
	t.Helper()
	if src := os.Getenv("ISTIO_SRC"); src != "" {
		return src
	}
	b, err := os.ReadFile(filepath.Join(bin, "source"))
	if err != nil {
		t.Fatalf("ISTIO_SRC is not set and %s/source does not name Istio's tree: %v", bin, err)
	}
	return strings.TrimSpace(string(b))
}

// testCase is one case: its file's name, its namespace and its network
// (10.<net>.0.0/16); gateway says its proxy is the namespace's ingress
// gateway (the file's first line says "# proxy: gateway"), not a sidecar.
type testCase struct {
	name, ns string
	net      int
	gateway  bool
	// logs compares access logs and tracing too (a case whose text has
	// the line "# compare: logs").
	logs bool
	// present and absent are the hosts (before ".<ns>.svc") whose facts
	// both control planes must send, or neither (the lines "# present:
	// <host>" and "# absent: <host>"): what a share of equal facts
	// would not tell.
	present, absent []string
}

// directives are the values of a case's lines "# <key>: <value>".
func directives(body []byte, key string) []string {
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "# "+key+": "); ok {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// checkHosts: both control planes send facts of the case's present hosts,
// and neither of its absent ones.
func checkHosts(t *testing.T, c testCase, facts map[string]Facts) {
	t.Helper()
	for who, f := range facts {
		has := func(host string) bool {
			for k := range f {
				if strings.Contains(k, host+"."+c.ns+".svc.") {
					return true
				}
			}
			return false
		}
		for _, h := range c.present {
			if !has(h) {
				t.Errorf("%s: %s sends nothing of %s.%s, which the case's proxy sees", c.name, who, h, c.ns)
			}
		}
		for _, h := range c.absent {
			if has(h) {
				t.Errorf("%s: %s sends %s.%s, which the case's proxy must not see", c.name, who, h, c.ns)
			}
		}
	}
}

// binaries returns the folders of Istio's binaries (ISTIO_BIN) and of
// shardpilot's (SHARDPILOT_BIN, else the repository's .bin), skipping the
// test without Istio's: make target builds them.
func binaries(t *testing.T, target string) (istio, ours string) {
	t.Helper()
	istio = os.Getenv("ISTIO_BIN")
	if istio == "" {
		t.Skip("ISTIO_BIN is not set: make " + target + " ISTIO_BIN=$(hack/istio-binaries.sh <istio source>)")
	}
	ours, err := filepath.Abs(cmp.Or(os.Getenv("SHARDPILOT_BIN"), filepath.Join("..", "..", ".bin")))
	if err != nil {
		t.Fatal(err)
	}
	return istio, ours
}

// startKube starts a kube-apiserver for the test and writes its
// kubeconfig into work.
func startKube(t *testing.T, work string) (*kubetest.Cluster, string) {
	t.Helper()
	kc, err := kubetest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Stop)
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := kc.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kc, kubeconfig
}

// startCases starts a kube-apiserver holding Istio's CRDs (from Istio's
// tree src) and every case of testdata/cases beside Bookinfo, each in a
// namespace of its own, and returns its kubeconfig and the cases.
func startCases(t *testing.T, ctx context.Context, src, work, settings string) (string, []testCase) {
	t.Helper()
	kc, kubeconfig := startKube(t, work)
	a := &applier{kc: kc}
	crds, err := os.ReadFile(filepath.Join(src, "manifests", "charts", "base", "files", "crd-all.gen.yaml"))
	if err != nil {
		t.Fatalf("Istio's CRDs: %v", err)
	}
	a.apply(t, ctx, crds)
	a.apply(t, ctx, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: istio-system}\n"))
	a.create(t, ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "istio", "namespace": "istio-system"}, "data": map[string]any{"mesh": settings}}})
	testutil.Eventually(t, time.Minute, "Istio's CRDs served", func() (bool, string) {
		_, err := kc.Client.Discovery().ServerResourcesForGroupVersion("networking.istio.io/v1")
		return err == nil, fmt.Sprint(err)
	})
	files, err := filepath.Glob(filepath.Join("testdata", "cases", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no cases: %v", err)
	}
	bookinfo, err := os.ReadFile(filepath.Join("testdata", "bookinfo.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	gateway, err := os.ReadFile(filepath.Join("testdata", "gateway.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []testCase
	for i, file := range files {
		name := strings.TrimSuffix(filepath.Base(file), ".yaml")
		ns := "case-" + strings.ToLower(strings.SplitN(name, "-", 2)[1])
		body, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		c := testCase{name: name, ns: ns, net: 100 + i, gateway: bytes.HasPrefix(body, []byte("# proxy: gateway\n")),
			logs: bytes.Contains(body, []byte("\n# compare: logs\n")), present: directives(body, "present"), absent: directives(body, "absent")}
		fill := strings.NewReplacer("{{ns}}", ns, "{{net}}", strconv.Itoa(c.net))
		a.apply(t, ctx, []byte(fill.Replace(string(bookinfo))))
		if c.gateway {
			a.apply(t, ctx, []byte(fill.Replace(string(gateway))))
		}
		a.apply(t, ctx, []byte(fill.Replace(string(body))))
		cases = append(cases, c)
	}
	return kubeconfig, cases
}

// settledFacts returns the facts of a case's sidecar from istiod and from
// shardpilot once both serve the case and neither changed since the
// previous look.
func settledFacts(t *testing.T, ctx context.Context, c testCase, istiod, ours string) (theirs, mine Facts) {
	t.Helper()
	node := sidecar(c.ns)
	if c.gateway {
		node = gatewayProxy(c.ns, c.net)
	}
	testutil.Eventually(t, 2*time.Minute, c.name+": both control planes serve the case, settled", func() (bool, string) {
		t1, err1 := caseFacts(ctx, istiod, node, c)
		m1, err2 := caseFacts(ctx, ours, node, c)
		if err1 != nil || err2 != nil {
			return false, fmt.Sprintf("istiod: %v; shardpilot: %v", err1, err2)
		}
		settled := theirs != nil && sameFacts(theirs, t1) && sameFacts(mine, m1)
		theirs, mine = t1, m1
		return settled && hasClusters(theirs) && hasClusters(mine),
			fmt.Sprintf("settled %v, clusters: istiod %v, shardpilot %v", settled, hasClusters(theirs), hasClusters(mine))
	})
	return theirs, mine
}

// sidecar is a proxy of namespace ns as Istio's agent announces it.
func sidecar(ns string) *core.Node {
	const ip = "10.250.0.9"
	meta, _ := structpb.NewStruct(map[string]any{
		"NAMESPACE": ns, "LABELS": map[string]any{"app": "client", "version": "v1"}, "ISTIO_VERSION": "1.30.3",
		"CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local", "SERVICE_ACCOUNT": "default", "WORKLOAD_NAME": "client",
		"INSTANCE_IPS": ip, "NAME": "client-0", "INTERCEPTION_MODE": "REDIRECT", "PROXY_CONFIG": map[string]any{},
	})
	return &core.Node{Id: "sidecar~" + ip + "~client-0." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta,
		UserAgentName: "envoy", Cluster: "client." + ns}
}

// gatewayProxy is the ingress gateway of namespace ns (testdata/gateway.yaml)
// as Istio's agent announces it.
func gatewayProxy(ns string, net int) *core.Node {
	ip := fmt.Sprintf("10.%d.0.50", net)
	meta, _ := structpb.NewStruct(map[string]any{
		"NAMESPACE": ns, "LABELS": map[string]any{"istio": "ingressgateway-" + ns, "app": "ingressgateway"}, "ISTIO_VERSION": "1.30.3",
		"CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local", "SERVICE_ACCOUNT": "ingressgateway", "WORKLOAD_NAME": "ingressgateway",
		"INSTANCE_IPS": ip, "NAME": "ingressgateway-0", "PROXY_CONFIG": map[string]any{},
	})
	return &core.Node{Id: "router~" + ip + "~ingressgateway-0." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta,
		UserAgentName: "envoy", Cluster: "ingressgateway." + ns}
}

// caseFacts fetches a proxy's configuration and keeps the facts of the
// resources that concern the hosts of its namespace: their clusters, load
// assignments, virtual hosts, and the outbound listeners of their ports
// (a gateway's listeners, all of them).
func caseFacts(ctx context.Context, addr string, node *core.Node, c testCase) (Facts, error) {
	ns := c.ns
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cfg, err := Fetch(ctx, addr, node)
	if err != nil {
		return nil, err
	}
	mine := func(host string) bool {
		return strings.Contains(host, "."+ns+".svc.") || strings.Contains(host, "-"+ns+".example.com")
	}
	out := Facts{}
	of := Of
	if c.logs {
		of = WithLogs
	}
	add := func(f Facts, err error) error {
		if err != nil {
			return err
		}
		for k, v := range f {
			out[k] = v
		}
		return nil
	}
	for name, c := range cfg.Clusters {
		if host, _, _, ok := generate.ParseClusterName(name); ok && mine(host) {
			if err := add(of("cluster "+name, c)); err != nil {
				return nil, err
			}
			if la := cfg.Endpoints[name]; la != nil {
				if err := add(Of("endpoints "+name, la)); err != nil {
					return nil, err
				}
			}
		}
	}
	// The outbound listeners of the case's service ports: on 0.0.0.0, and
	// on a virtual IP those that send to the case's services.
	ports := map[string]bool{}
	for name := range cfg.Clusters {
		if host, port, _, ok := generate.ParseClusterName(name); ok && mine(host) {
			ports["_"+strconv.FormatUint(uint64(port), 10)] = true
		}
	}
	for name, l := range cfg.Listeners {
		addr, port, _ := strings.Cut(name, "_")
		ours := ports["_"+port] && (addr == "0.0.0.0" || strings.Contains(prototext.Format(l), "."+ns+".svc."))
		if ours || c.gateway {
			if err := add(of("listener "+name, l)); err != nil {
				return nil, err
			}
		}
	}
	for name, rc := range cfg.RouteConfig {
		for _, vh := range rc.VirtualHosts {
			host, _, _ := strings.Cut(vh.Name, ":")
			if mine(host) {
				if err := add(Of("routes "+name+" vhost "+vh.Name, vh)); err != nil {
					return nil, err
				}
			}
		}
	}
	return out, nil
}

func hasClusters(f Facts) bool {
	for k := range f {
		if strings.HasPrefix(k, "cluster ") {
			return true
		}
	}
	return false
}

func sameFacts(a, b Facts) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// applier creates the objects of YAML documents in the apiserver.
type applier struct {
	kc     *kubetest.Cluster
	mapper meta.RESTMapper
}

func (a *applier) apply(t *testing.T, ctx context.Context, docs []byte) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(docs), 4096)
	for {
		obj := &unstructured.Unstructured{}
		if err := dec.Decode(&obj.Object); err == io.EOF {
			return
		} else if err != nil {
			t.Fatal(err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		a.create(t, ctx, obj)
	}
}

func (a *applier) create(t *testing.T, ctx context.Context, obj *unstructured.Unstructured) {
	t.Helper()
	gvk := obj.GroupVersionKind()
	var mapping *meta.RESTMapping
	testutil.Eventually(t, time.Minute, "the resource of "+gvk.String(), func() (bool, string) {
		if a.mapper == nil {
			a.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(a.kc.Client.Discovery()))
		}
		m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			a.mapper = nil // discover again: a CRD may be new
			return false, err.Error()
		}
		mapping = m
		return true, ""
	})
	res := a.kc.Dynamic.Resource(mapping.Resource)
	var client interface {
		Create(context.Context, *unstructured.Unstructured, metav1.CreateOptions, ...string) (*unstructured.Unstructured, error)
		UpdateStatus(context.Context, *unstructured.Unstructured, metav1.UpdateOptions) (*unstructured.Unstructured, error)
	} = res
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		client = res.Namespace(obj.GetNamespace())
	}
	status, hasStatus := obj.Object["status"]
	created, err := client.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return
	}
	if err != nil {
		t.Fatalf("create %s %s/%s: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	if hasStatus && gvk.Kind == "Pod" {
		// No kubelet runs: the test says where the pod is.
		created.Object["status"] = status
		if _, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("status of pod %s/%s: %v", obj.GetNamespace(), obj.GetName(), err)
		}
	}
}

// startIstiod runs pilot-discovery against the apiserver, with env added
// to its environment, and returns its plaintext ADS address once it is
// ready.
func startIstiod(t *testing.T, ctx context.Context, bin, kubeconfig, work, settings string, env ...string) string {
	t.Helper()
	plain, _ := startIstiodSecure(t, ctx, bin, kubeconfig, work, settings, env...)
	return plain
}

// startIstiodSecure starts istiod as startIstiod does and returns its
// plaintext and its TLS (15012's) ADS addresses.
func startIstiodSecure(t *testing.T, ctx context.Context, bin, kubeconfig, work, settings string, env ...string) (plain, secure string) {
	t.Helper()
	mesh := filepath.Join(work, "mesh.yaml")
	if err := os.WriteFile(mesh, []byte(settings), 0o644); err != nil {
		t.Fatal(err)
	}
	grpcAddr, http, secure := testutil.FreeAddr(t), testutil.FreeAddr(t), testutil.FreeAddr(t)
	args := []string{"discovery", "--kubeconfig", kubeconfig, "--meshConfig", mesh, "--networksConfig", filepath.Join(work, "none"),
		"--grpcAddr", grpcAddr, "--httpAddr", http, "--httpsAddr", testutil.FreeAddr(t), "--monitoringAddr", testutil.FreeAddr(t),
		"--secureGRPCAddr", secure, "--domain", "cluster.local", "--log_output_level", "default:warn"}
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pilot-discovery"), args...)
	cmd.Env = append(os.Environ(), "POD_NAMESPACE=istio-system", "REVISION=default", "PILOT_ENABLE_ANALYSIS=false", "POD_NAME=istiod-0",
		"PILOT_MAX_REQUESTS_PER_SECOND=1000")
	cmd.Env = append(cmd.Env, env...)
	startProcess(t, "istiod", cmd, work)
	testutil.Eventually(t, time.Minute, "istiod ready", func() (bool, string) {
		return ready("http://" + http + "/ready"), "not ready"
	})
	return grpcAddr, secure
}

// startKubeWithIstioCRDs starts a kube-apiserver for the test holding
// Istio's CRDs from the tree the binaries of istioBin were built from.
func startKubeWithIstioCRDs(t *testing.T, ctx context.Context, istioBin, work string) (*kubetest.Cluster, string, *applier) {
	t.Helper()
	kc, kubeconfig := startKube(t, work)
	a := &applier{kc: kc}
	crds, err := os.ReadFile(filepath.Join(istioSource(t, istioBin), "manifests", "charts", "base", "files", "crd-all.gen.yaml"))
	if err != nil {
		t.Fatalf("Istio's CRDs: %v", err)
	}
	a.apply(t, ctx, crds)
	return kc, kubeconfig, a
}

// startIngester runs the ingester, watching the apiserver of kubeconfig,
// and waits until it is ready.
func startIngester(t *testing.T, run func(name string, args ...string) string, kubeconfig string) {
	t.Helper()
	ingester := run("ingester", "--kubeconfig", "Kubernetes="+kubeconfig, "--leader-id", "")
	testutil.Eventually(t, time.Minute, "the ingester ready", func() (bool, string) {
		return ready("http://" + ingester + "/readyz"), "not ready"
	})
}

// startShardpilot runs etcd and NATS in the test process and the ingester
// (watching the apiserver) and a pusher (plaintext ADS) from bin, and
// returns the pusher's ADS address once it is ready.
func startShardpilot(t *testing.T, ctx context.Context, bin, kubeconfig, work string) string {
	t.Helper()
	run := shardpilotRunner(t, ctx, bin, work)
	startIngester(t, run, kubeconfig)
	ads := testutil.FreeAddr(t)
	// The sidecar is Envoy as Istio injects it: its agent serves it its
	// certificates.
	pusher := run("pusher", "--ads-plaintext", "--ads-addr", ads, "--workload-certificates", "agent")
	testutil.Eventually(t, time.Minute, "the pusher ready", func() (bool, string) {
		return ready("http://" + pusher + "/readyz"), "not ready"
	})
	return ads
}

// shardpilotRunner starts etcd and NATS in the test process and returns
// what runs one of shardpilot's binaries from bin against them (its
// admin address back).
func shardpilotRunner(t *testing.T, ctx context.Context, bin, work string) func(name string, args ...string) string {
	t.Helper()
	etcd, err := embedded.StartEtcd(filepath.Join(work, "etcd"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	nats, err := embedded.StartNATS(filepath.Join(work, "nats"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nats.Close() })
	return func(name string, args ...string) string {
		admin := testutil.FreeAddr(t)
		cmd := exec.CommandContext(ctx, filepath.Join(bin, name), append(args, "--etcd-endpoints", etcd.Endpoint, "--nats-url", nats.URL,
			"--admin-addr", admin, "--log-level", "warn")...)
		startProcess(t, name+" (make build, or set SHARDPILOT_BIN)", cmd, work)
		return admin
	}
}

// startProcess starts cmd in work, its output in work/<its binary>.log,
// and interrupts it when the test ends, showing the log's end if the test
// failed.
func startProcess(t *testing.T, name string, cmd *exec.Cmd, work string) {
	t.Helper()
	cmd.Dir = work
	logs, err := os.Create(filepath.Join(work, filepath.Base(cmd.Path)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		logs.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logs.Name())
			t.Logf("%s's log (end):\n%s", name, tail(b, 4000))
		}
	})
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
