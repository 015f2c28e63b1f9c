package istiod

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	differential(t, "", func(string) bool { return true }, true)
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

// meshTopology is the gateway topology of meshSettings' defaultConfig, as
// Istio's agent puts it in PROXY_CONFIG.
var meshTopology = map[string]any{"numTrustedProxies": 2.0, "forwardClientCertDetails": "APPEND_FORWARD"}

// agentTopology is the gateway topology a gateway proxy's agent says when
// its case says none (a "# gateway-topology: <proxies> <details>" line).
var agentTopology map[string]any

// TestAgainstIstiodMeshConfig compares some cases again under a MeshConfig
// that changes every default the pushers take from it: istiod reads it
// from its file, shardpilot from the ConfigMap istio of istio-system.
func TestAgainstIstiodMeshConfig(t *testing.T) {
	// Istio's agent sends its gateway the mesh's defaultConfig in its
	// node's PROXY_CONFIG, which istiod reads the gateway topology from.
	agentTopology = meshTopology
	defer func() { agentTopology = nil }()
	differential(t, meshSettings, func(name string) bool {
		return slices.Contains([]string{"01-bookinfo", "05-timeouts-retries", "08-subset-port-policy", "10-serviceentry-dns",
			"11-locality-failover", "13-sidecar-scope", "17-ingress-gateway", "18-gateway-tls", "19-websocket"}, name)
	}, false)
}

// differential runs the cases under the mesh's settings (YAML of Istio's
// MeshConfig) and compares, for each case named, the facts istiod and
// shardpilot send its proxies. With incremental, both first serve
// Bookinfo alone, the proxies connect, and then every case is applied:
// the facts compared are what those proxies hold once settled, and each
// control plane's must equal what a second instance of it, started after
// the cases, sends proxies that connect then (incremental equals full).
// Without, only that second instance is compared.
func differential(t *testing.T, settings string, named func(string) bool, incremental bool) {
	istioBin, ourBin := binaries(t, "diff-istiod")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	work := t.TempDir()
	settings = "rootNamespace: istio-system\ntrustDomain: cluster.local\n" + telemetryProviders + settings
	a, kubeconfig, cases := startCases(t, ctx, istioSource(t, istioBin), work, settings)
	only, err := regexp.Compile(os.Getenv("DIFF_ISTIOD_CASES"))
	if err != nil {
		t.Fatalf("DIFF_ISTIOD_CASES: %v", err)
	}
	cases = slices.DeleteFunc(cases, func(c testCase) bool { return !named(c.name) || !only.MatchString(c.name) })
	start := func(name string) (istiod, ours string) {
		dir := filepath.Join(work, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		return startIstiod(t, ctx, istioBin, kubeconfig, dir, settings), startShardpilot(t, ctx, ourBin, kubeconfig, dir)
	}
	var before map[string]*Follower
	if incremental {
		istiod, ours := start("incremental")
		before = follow(t, ctx, cases, istiod, ours)
		// What both hold before the cases: every proxy has its clusters.
		settle(t, cases, before, nil, time.Minute)
	}
	for _, c := range cases {
		a.apply(t, ctx, c.body)
	}
	istiod, ours := start("full")
	after := follow(t, ctx, cases, istiod, ours)
	if !incremental {
		settle(t, cases, after, nil, 2*time.Minute)
		before = after
	} else {
		settle(t, cases, before, after, 2*time.Minute)
	}

	var failed, stale []string
	var report strings.Builder
	fmt.Fprintf(&report, "%-28s %8s %8s %7s %9s %10s %11s", "case", "facts", "equal", "%", "unserved", "deliberate", "proxyless %")
	if incremental {
		fmt.Fprintf(&report, " %17s %21s", "istiod incr≠full", "shardpilot incr≠full")
	}
	report.WriteString("\n")
	var total, grpc Comparison
	for _, c := range cases {
		r := compareCase(t, c, before, after, incremental)
		total.Compared, total.Equal = total.Compared+r.diff.Compared, total.Equal+r.diff.Equal
		fmt.Fprintf(&report, "%-28s %8d %8d %6.1f%% %9d %10d %10.1f%%", c.name, r.diff.Compared, r.diff.Equal, r.diff.Percent(), r.unserved, r.deliberate, r.proxyless.Percent())
		grpc.Compared, grpc.Equal = grpc.Compared+r.proxyless.Compared, grpc.Equal+r.proxyless.Equal
		if incremental {
			fmt.Fprintf(&report, " %17d %21d", len(r.theirsStale), len(r.mineStale))
		}
		report.WriteString("\n")
		if len(r.mineStale) > 0 {
			stale = append(stale, c.name)
			for _, d := range r.mineStale[:min(len(r.mineStale), 20)] {
				t.Logf("%s: shardpilot, full | incremental: %s", c.name, d)
			}
		}
		if r.diff.Percent() < minPercent {
			failed = append(failed, c.name)
			for _, d := range r.diff.Differences[:min(len(r.diff.Differences), 40)] {
				t.Logf("%s: %s", c.name, d)
			}
		}
	}
	fmt.Fprintf(&report, "%-28s %8d %8d %6.1f%% %9s %10s %10.1f%%\n", "all", total.Compared, total.Equal, total.Percent(), "", "", grpc.Percent())
	report.WriteString("(unserved: shardpilot's facts of inbound ports the proxy does not serve; deliberate: facts of both that name the workload in what a class shares;\n" +
		" both left out of the share, see docs/istio-compatibility.md; proxyless %: a proxyless gRPC client's facts, apart)\n")
	t.Logf("facts istiod and shardpilot send the cases' proxies (incremental %v):\n%s", incremental, report.String())
	if path := os.Getenv("DIFF_ISTIOD_REPORT"); path != "" {
		if err := writeReport(path, t.Name(), settings, report.String()); err != nil {
			t.Errorf("DIFF_ISTIOD_REPORT: %v", err)
		}
	}
	if len(failed) > 0 {
		t.Errorf("below %.0f%% equal facts: %v (DIFF_ISTIOD_OUT=<dir> writes every difference and every fact)", minPercent, failed)
	}
	if len(stale) > 0 {
		t.Errorf("shardpilot's proxies that connected before the cases hold other than what proxies connecting after are sent: %v", stale)
	}
}

// reportHeader opens the report DIFF_ISTIOD_REPORT names.
const reportHeader = `# What make diff-istiod measured

Written by ` + "`make diff-istiod`" + ` (test/istiod): do not edit. What is compared, and
every difference left, is in [istio-compatibility.md](istio-compatibility.md).
`

// writeReport writes a run's table into the report at path, in place of
// the section of the same test from an earlier run, keeping the others.
func writeReport(path, test, settings, table string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	begin, end := "<!-- "+test+" -->\n", "<!-- end "+test+" -->\n"
	section := begin + "## " + test + "\n\nMeshConfig:\n\n```yaml\n" + settings + "```\n\n```\n" + table + "```\n" + end
	body := string(old)
	if body == "" {
		body = reportHeader
	}
	if i, j := strings.Index(body, begin), strings.Index(body, end); i >= 0 && j > i {
		body = body[:i] + section + body[j+len(end):]
	} else {
		body += "\n" + section
	}
	return os.WriteFile(path, []byte(body), 0o644)
}

// caseResult is how a case compares: istiod's facts with shardpilot's,
// how many of shardpilot's were left out as unserved (see unservedPorts),
// and, incrementally, where each control plane's proxies that connected
// before the case differ from those that connected after.
type caseResult struct {
	diff, proxyless        Comparison
	unserved, deliberate   int
	theirsStale, mineStale []string
}

// compareCase compares the facts of a case's proxies (those of before),
// and with incremental those of before with those of after, writing them
// into DIFF_ISTIOD_OUT when it is set.
func compareCase(t *testing.T, c testCase, before, after map[string]*Follower, incremental bool) caseResult {
	t.Helper()
	var r caseResult
	theirs, mine := c.facts(t, before, "istiod"), c.facts(t, before, "shardpilot")
	checkHosts(t, c, map[string]Facts{"istiod": theirs, "shardpilot": mine})
	if incremental {
		r.theirsStale = Compare(c.facts(t, after, "istiod"), theirs).Differences
		r.mineStale = Compare(c.facts(t, after, "shardpilot"), mine).Differences
	}
	r.unserved = unservedPorts(theirs, mine)
	r.deliberate = setAside(theirs, mine)
	// A proxyless client's facts are compared apart: istiod sends it
	// Envoy's route fields grpc-go does not read.
	theirsGRPC, mineGRPC := takeKind(theirs, "proxyless"), takeKind(mine, "proxyless")
	r.proxyless = Compare(theirsGRPC, mineGRPC)
	r.diff = Compare(theirs, mine)
	if out := os.Getenv("DIFF_ISTIOD_OUT"); out != "" {
		lines := append(slices.Clone(r.diff.Differences), r.proxyless.Differences...)
		maps.Copy(theirs, theirsGRPC)
		maps.Copy(mine, mineGRPC)
		for _, d := range r.mineStale {
			lines = append(lines, "shardpilot full | incremental: "+d)
		}
		for _, d := range r.theirsStale {
			lines = append(lines, "istiod full | incremental: "+d)
		}
		if err := os.MkdirAll(out, 0o755); err != nil {
			t.Fatal(err)
		}
		files := map[string][]byte{c.name + ".diff": []byte(strings.Join(lines, "\n") + "\n"),
			c.name + ".istiod.facts": theirs.Lines(), c.name + ".shardpilot.facts": mine.Lines()}
		for name, b := range files {
			if err := os.WriteFile(filepath.Join(out, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return r
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
// gateway (the file's first line says "# proxy: gateway"), not a sidecar;
// gatewayAPI, that it is the namespace's Gateway API gateway "gateway" of
// class istio (testdata/gatewayapi.yaml; "# proxy: gateway-api").
type testCase struct {
	name, ns   string
	net        int
	gateway    bool
	gatewayAPI bool
	// logs compares access logs and tracing too (a case whose text has
	// the line "# compare: logs").
	logs bool
	// present and absent are the hosts (before ".<ns>.svc") whose facts
	// both control planes must send, or neither (the lines "# present:
	// <host>" and "# absent: <host>"): what a share of equal facts
	// would not tell.
	present, absent []string
	// body is the case's text, its namespace filled in.
	body []byte
	// topology is what its gateway's agent says of its gateway topology
	// (the line "# gateway-topology: <trusted proxies> <client cert details>",
	// as a pod's proxy.istio.io/config annotation sets it).
	topology map[string]any
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
// tree src) and, for every case of testdata/cases, a namespace of its own
// holding Bookinfo (and the case's gateway), and returns what applies
// more, its kubeconfig and the cases, whose own objects are not applied.
func startCases(t *testing.T, ctx context.Context, src, work, settings string) (*applier, string, []testCase) {
	t.Helper()
	kc, kubeconfig := startKube(t, work)
	a := &applier{kc: kc}
	crds, err := os.ReadFile(filepath.Join(src, "manifests", "charts", "base", "files", "crd-all.gen.yaml"))
	if err != nil {
		t.Fatalf("Istio's CRDs: %v", err)
	}
	a.apply(t, ctx, crds)
	// The Gateway API's CRDs, as the chart ships them, and Istio's class.
	gatewayCRDs, err := os.ReadFile(filepath.Join("..", "..", kubetest.GatewayAPICRDs))
	if err != nil {
		t.Fatalf("the Gateway API's CRDs: %v", err)
	}
	a.apply(t, ctx, gatewayCRDs)
	a.apply(t, ctx, []byte(istioGatewayClass))
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
	gatewayAPI, err := os.ReadFile(filepath.Join("testdata", "gatewayapi.yaml"))
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
		var topology map[string]any
		if d := directives(body, "gateway-topology"); len(d) > 0 {
			var n float64
			var details string
			if _, err := fmt.Sscan(d[0], &n, &details); err != nil {
				t.Fatalf("%s: gateway-topology %q: %v", name, d[0], err)
			}
			topology = map[string]any{"numTrustedProxies": n, "forwardClientCertDetails": details}
		}
		kube := bytes.HasPrefix(body, []byte("# proxy: gateway-api\n"))
		c := testCase{name: name, ns: ns, net: 100 + i, gateway: kube || bytes.HasPrefix(body, []byte("# proxy: gateway\n")), gatewayAPI: kube, topology: topology,
			logs: bytes.Contains(body, []byte("\n# compare: logs\n")), present: directives(body, "present"), absent: directives(body, "absent")}
		fill := strings.NewReplacer("{{ns}}", ns, "{{net}}", strconv.Itoa(c.net))
		a.apply(t, ctx, []byte(fill.Replace(string(bookinfo))))
		switch {
		case c.gatewayAPI:
			a.apply(t, ctx, []byte(fill.Replace(string(gatewayAPI))))
		case c.gateway:
			a.apply(t, ctx, []byte(fill.Replace(string(gateway))))
		}
		c.body = []byte(fill.Replace(string(body)))
		cases = append(cases, c)
	}
	return a, kubeconfig, cases
}

// destinationPort finds the port a filter chain's match names.
var destinationPort = regexp.MustCompile(`"destination_port":(\d+)`)

// unservedPorts takes out of ours the facts of the inbound ports for which
// istiod gives the proxy neither a chain nor an inbound cluster, and
// returns how many it took: a class of shardpilot's shares its inbound
// side, which has every target port of the services the class sees, where
// istiod's has those of the Services selecting the proxy's own workload
// (a deliberate difference, in docs/istio-compatibility.md).
func unservedPorts(istiod, ours Facts) int {
	// port returns "<proxy kind> <port>" for a fact of an inbound port.
	port := func(path string) (string, bool) {
		kind, rest, _ := strings.Cut(path, " ")
		if p, ok := strings.CutPrefix(rest, "cluster inbound|"); ok {
			n, _, _ := strings.Cut(p, "|")
			return kind + " " + n, true
		}
		chain, ok := strings.CutPrefix(rest, "listener virtualInbound.filter_chains[match ")
		if !ok {
			return "", false
		}
		chain, _, _ = strings.Cut(chain, "}]")
		if m := destinationPort.FindStringSubmatch(chain); m != nil {
			return kind + " " + m[1], true
		}
		return "", false
	}
	served := map[string]bool{}
	for path := range istiod {
		if p, ok := port(path); ok {
			served[p] = true
		}
	}
	n := 0
	for path, v := range ours {
		if p, ok := port(path); ok && !served[p] {
			delete(ours, path)
			n++
		}
		// A listener filter turned off on ports: those istiod serves.
		if strings.HasSuffix(path, ".filter_disabled.ports") {
			kind, _, _ := strings.Cut(path, " ")
			list, not := strings.CutPrefix(v, "not ")
			kept := slices.DeleteFunc(strings.Fields(list), func(p string) bool { return p != "0" && !served[kind+" "+p] })
			if w := strings.Join(kept, " "); w != list {
				if not {
					w = "not " + w
				}
				ours[path], n = w, n+1
			}
		}
	}
	return n
}

// workloadNamed are the paths of facts that name the proxy's own workload
// in what a class of shardpilot's shares among workloads: its tracing tags
// (canonical service and revision; mesh and cluster, which shardpilot has
// Envoy read from the agent's environment), its tracer's service name, an
// inbound port's span name. docs/istio-compatibility.md gives each.
var workloadNamed = regexp.MustCompile(`\.tracing\.custom_tags\[tag istio\.(canonical_service|canonical_revision|mesh_id|cluster_id)\]|` +
	`\.tracing\.provider\.typed_config\.service_name$|` +
	`^\w+ listener virtualInbound\.filter_chains\[match \{[^}]*"destination_port":\d+[^}]*\}\].*\.decorator\.operation$`)

// takeKind takes the facts of a kind of proxy out of f and returns them.
func takeKind(f Facts, kind string) Facts {
	out := Facts{}
	for path, v := range f {
		if strings.HasPrefix(path, kind+" ") {
			out[path] = v
			delete(f, path)
		}
	}
	return out
}

// setAside takes the facts that name the proxy's workload (workloadNamed)
// out of both sides, and returns how many it took.
func setAside(istiod, ours Facts) int {
	n := 0
	for _, f := range []Facts{istiod, ours} {
		for path := range f {
			if workloadNamed.MatchString(path) {
				delete(f, path)
				n++
			}
		}
	}
	return n
}

// proxy is one of a case's proxies; its kind names it in the facts.
// targets are what a proxyless client dials (host:port).
type proxy struct {
	kind    string
	node    *core.Node
	targets []string
}

// proxies are a case's proxies whose configuration is compared: its client
// sidecar (or its ingress gateway), and productpage's sidecar for the
// inbound side of a workload that Services select.
func (c testCase) proxies() []proxy {
	first := proxy{kind: "sidecar", node: sidecar(c.ns)}
	switch {
	case c.gatewayAPI:
		first = proxy{kind: "gateway", node: gatewayAPIProxy(c.ns, c.net)}
	case c.gateway:
		first = proxy{kind: "gateway", node: gatewayProxy(c.ns, c.net, c.topology)}
	}
	var targets []string
	for _, svc := range []string{"productpage", "details", "reviews", "ratings"} {
		targets = append(targets, svc+"."+c.ns+".svc.cluster.local:9080")
	}
	return []proxy{first, {kind: "workload", node: workload(c.ns, c.net)}, {kind: "proxyless", node: proxyless(c.ns), targets: targets}}
}

// follow connects every proxy of the cases to both control planes, keyed
// "<control plane>/<case>/<proxy>"; they close when the test ends.
func follow(t *testing.T, ctx context.Context, cases []testCase, istiod, ours string) map[string]*Follower {
	t.Helper()
	out := map[string]*Follower{}
	for _, c := range cases {
		for _, p := range c.proxies() {
			for plane, addr := range map[string]string{"istiod": istiod, "shardpilot": ours} {
				f, err := Follow(ctx, addr, p.node)
				if p.targets != nil {
					f, err = FollowProxyless(ctx, addr, p.node, p.targets)
				}
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(f.Close)
				out[plane+"/"+c.name+"/"+p.kind] = f
			}
		}
	}
	return out
}

const (
	// quiet is how long a proxy sent nothing for its configuration to
	// count as settled.
	quiet = 3 * time.Second
	// istiodQuiet is how long a proxy connected before the cases must hear
	// nothing more from istiod when what it holds differs from what
	// istiod sends a proxy connecting after (istiod's own difference).
	istiodQuiet = 10 * time.Second
)

// settle waits until every proxy of the cases has its clusters and has
// heard nothing new for a while. With full (the same proxies connected
// after the cases were applied), each of now's proxies must also hold
// what its twin in full holds, or, for istiod's, have heard nothing for
// istiodQuiet; at timeout, shardpilot's that still differ are left for
// the comparison to report.
func settle(t *testing.T, cases []testCase, now, full map[string]*Follower, timeout time.Duration) {
	t.Helper()
	type look struct {
		answers int
		since   time.Time
		facts   Facts // of that many answers, once computed
	}
	looks := map[string]*look{}
	// factsOf computes a proxy's facts once per answer it reads.
	factsOf := func(key string, c testCase, kind string, f *Follower) Facts {
		l := looks[key]
		if l.facts == nil {
			l.facts = c.proxyFacts(t, kind, f)
		}
		return l.facts
	}
	quietFor := func(key string, f *Follower, at time.Time) (time.Duration, bool) {
		cfg, answers, err := f.Config()
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		l := looks[key]
		if l == nil || l.answers != answers {
			l = &look{answers: answers, since: at}
			looks[key] = l
		}
		return at.Sub(l.since), len(cfg.Clusters) > 0
	}
	deadline := time.Now().Add(timeout)
	for {
		at := time.Now()
		var waiting []string
		for _, c := range cases {
			for _, p := range c.proxies() {
				for _, plane := range []string{"istiod", "shardpilot"} {
					key := plane + "/" + c.name + "/" + p.kind
					q, ok := quietFor(key, now[key], at)
					if full == nil {
						if !ok || q < quiet {
							waiting = append(waiting, key)
						}
						continue
					}
					qFull, okFull := quietFor("full "+key, full[key], at)
					if !ok || !okFull || q < quiet || qFull < quiet {
						waiting = append(waiting, key)
						continue
					}
					if plane == "istiod" && q >= istiodQuiet {
						continue
					}
					if !sameFacts(factsOf(key, c, p.kind, now[key]), factsOf("full "+key, c, p.kind, full[key])) {
						waiting = append(waiting, key+" (differs from full)")
					}
				}
			}
		}
		if len(waiting) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, w := range waiting {
				if !strings.HasPrefix(w, "shardpilot/") || !strings.HasSuffix(w, " (differs from full)") {
					t.Fatalf("proxies not settled within %s: %v", timeout, waiting)
				}
			}
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// facts are the facts of all a case's proxies, as the followers of a
// control plane hold them.
func (c testCase) facts(t *testing.T, followers map[string]*Follower, plane string) Facts {
	t.Helper()
	out := Facts{}
	for _, p := range c.proxies() {
		maps.Copy(out, c.proxyFacts(t, p.kind, followers[plane+"/"+c.name+"/"+p.kind]))
	}
	return out
}

// sidecar is a proxy of namespace ns as Istio's agent announces it, on an
// address no Service selects.
func sidecar(ns string) *core.Node {
	return agentNode("sidecar", "10.250.0.9", ns, "client-0", "client", "default", map[string]any{"app": "client", "version": "v1"})
}

// workload is productpage's sidecar (testdata/bookinfo.yaml) in namespace
// ns of network net.
func workload(ns string, net int) *core.Node {
	return agentNode("sidecar", fmt.Sprintf("10.%d.0.10", net), ns, "productpage-v1", "productpage-v1", "bookinfo-productpage",
		map[string]any{"app": "productpage", "version": "v1", "security.istio.io/tlsMode": "istio"})
}

// proxyless is a proxyless gRPC client of namespace ns, as Istio's agent
// announces one (its grpc-agent injection template: GENERATOR grpc).
func proxyless(ns string) *core.Node {
	n := agentNode("sidecar", "10.250.0.8", ns, "grpc-client-0", "grpc-client", "default", map[string]any{"app": "grpc-client"})
	n.Metadata.Fields["GENERATOR"] = structpb.NewStringValue("grpc")
	return n
}

// gatewayProxy is the ingress gateway of namespace ns (testdata/gateway.yaml)
// as Istio's agent announces it.
// Its agent says topology (PROXY_CONFIG gatewayTopology) when it is set,
// else agentTopology.
func gatewayProxy(ns string, net int, topology map[string]any) *core.Node {
	n := agentNode("router", fmt.Sprintf("10.%d.0.50", net), ns, "ingressgateway-0", "ingressgateway", "ingressgateway",
		map[string]any{"istio": "ingressgateway-" + ns, "app": "ingressgateway"})
	if topology == nil {
		topology = agentTopology
	}
	if topology != nil {
		t, _ := structpb.NewStruct(topology)
		n.Metadata.Fields["PROXY_CONFIG"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"gatewayTopology": structpb.NewStructValue(t)}})
	}
	return n
}

// gatewayAPIProxy is the Gateway API gateway of namespace ns
// (testdata/gatewayapi.yaml) as Istio's agent announces the pod istiod's
// deployment controller deploys.
func gatewayAPIProxy(ns string, net int) *core.Node {
	n := agentNode("router", fmt.Sprintf("10.%d.0.60", net), ns, "gateway-istio-0", "gateway-istio", "gateway-istio",
		map[string]any{"gateway.networking.k8s.io/gateway-name": "gateway", "gateway.networking.k8s.io/gateway-class-name": "istio",
			"gateway.istio.io/managed": "istio.io-gateway-controller", "service.istio.io/canonical-name": "gateway-istio",
			"service.istio.io/canonical-revision": "latest", "sidecar.istio.io/inject": "false"})
	if agentTopology != nil {
		t, _ := structpb.NewStruct(agentTopology)
		n.Metadata.Fields["PROXY_CONFIG"] = structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{"gatewayTopology": structpb.NewStructValue(t)}})
	}
	return n
}

// istioGatewayClass is Istio's GatewayClass, which both control planes
// serve.
const istioGatewayClass = `apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: istio}
spec: {controllerName: istio.io/gateway-controller}
`

// agentNode is a proxy as Istio's agent announces it.
func agentNode(kind, ip, ns, pod, workload, account string, labels map[string]any) *core.Node {
	md := map[string]any{
		"NAMESPACE": ns, "LABELS": labels, "ISTIO_VERSION": "1.30.3", "CLUSTER_ID": "Kubernetes", "MESH_ID": "cluster.local",
		"SERVICE_ACCOUNT": account, "WORKLOAD_NAME": workload, "INSTANCE_IPS": ip, "NAME": pod, "PROXY_CONFIG": map[string]any{},
	}
	if kind == "sidecar" {
		md["INTERCEPTION_MODE"] = "REDIRECT"
	}
	meta, _ := structpb.NewStruct(md)
	return &core.Node{Id: kind + "~" + ip + "~" + pod + "." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta,
		UserAgentName: "envoy", Cluster: workload + "." + ns}
}

// proxyFacts keeps, of what a case's proxy of a kind holds, the facts of
// the resources that concern the case: for its client sidecar or gateway,
// everything but what is of other namespaces' hosts (their clusters, their
// virtual hosts, the listeners of ports no host of the case has); for the
// workload, its inbound side (inbound clusters, virtualInbound and the
// listeners on its own address, inbound route configurations).
func (c testCase) proxyFacts(t *testing.T, kind string, f *Follower) Facts {
	t.Helper()
	cfg, _, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	ns := c.ns
	mine := func(host string) bool {
		return strings.Contains(host, "."+ns+".svc.") || strings.Contains(host, "-"+ns+".example.com")
	}
	inbound := kind == "workload"
	out := Facts{}
	of := Of
	if c.logs {
		of = WithLogs
	}
	add := func(f Facts, err error) {
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(out, f)
	}
	ports := map[string]bool{}
	for name, cl := range cfg.Clusters {
		host, port, _, outbound := generate.ParseClusterName(name)
		if outbound && mine(host) {
			ports[strconv.FormatUint(uint64(port), 10)] = true
		}
		keep := !outbound && (!inbound || strings.HasPrefix(name, "inbound|") || strings.HasPrefix(name, "InboundPassthrough"))
		if !keep && !(outbound && !inbound && mine(host)) {
			continue
		}
		add(of(kind+" cluster "+name, cl))
		if la := cfg.Endpoints[edsName(cl)]; la != nil {
			add(Of(kind+" endpoints "+name, la))
		}
	}
	self := ""
	if v := f.node.GetMetadata().GetFields()["INSTANCE_IPS"]; v != nil {
		self = v.GetStringValue()
	}
	for name, l := range cfg.Listeners {
		addr, port, named := strings.Cut(name, "_")
		var keep bool
		switch {
		case !named:
			keep = !inbound || name == "virtualInbound"
		case inbound:
			keep = addr == self
		case c.gateway:
			keep = true
		default:
			keep = ports[port] && (addr == "0.0.0.0" || strings.Contains(prototext.Format(l), "."+ns+".svc."))
		}
		if keep {
			add(of(kind+" listener "+name, l))
		}
	}
	for name, rc := range cfg.RouteConfig {
		if inbound != strings.HasPrefix(name, "inbound|") {
			continue
		}
		for _, vh := range rc.VirtualHosts {
			host, _, _ := strings.Cut(vh.Name, ":")
			if !mine(host) && strings.Contains(host, ".") {
				continue
			}
			if kind == "proxyless" {
				// A proxyless client's route configuration is named by its
				// listener alone (the control plane's choice): compared by
				// virtual host.
				add(Of(kind+" routes vhost "+vh.Name, vh))
				continue
			}
			add(Of(kind+" routes "+name+" vhost "+vh.Name, vh))
		}
	}
	return out
}

func sameFacts(a, b Facts) bool { return maps.Equal(a, b) }

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
	testutil.Eventually(t, 2*time.Minute, "istiod ready", func() (bool, string) {
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
