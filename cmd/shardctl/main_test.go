package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/internal/version"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// shardctl runs the CLI in this process and returns what it printed.
func shardctl(etcd string, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	err = run(context.Background(), append([]string{"--etcd-endpoints", etcd}, args...), &out, &errb)
	return out.String(), errb.String(), err
}

// process is a pusher or ingester binary running for one test.
type process struct {
	cmd   *exec.Cmd
	admin string
	ads   string
}

func start(t *testing.T, bin string, env []string, args ...string) *process {
	t.Helper()
	p := &process{admin: testutil.FreeAddr(t)}
	args = append(args, "--admin-addr", p.admin, "--log-level", "warn")
	if filepath.Base(bin) == "pusher" {
		p.ads = testutil.FreeAddr(t)
		args = append(args, "--ads-plaintext", "--ads-addr", p.ads, "--drain-timeout", "500ms")
	}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = io.Discard
	if testing.Verbose() {
		p.cmd.Stderr = os.Stderr
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.stop)
	testutil.Eventually(t, 60*time.Second, bin+" is ready", func() (bool, string) {
		resp, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK, string(b)
	})
	return p
}

// stop ends the process gracefully, as Kubernetes does, and waits for it.
func (p *process) stop() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	_ = p.cmd.Wait()
}

// dialXDS starts a proxyless grpc-go client of namespace demo, named id,
// on one pusher: it subscribes to the listener, route, cluster and
// endpoints of the greeter, and ACKs what it accepts.
func dialXDS(t *testing.T, ads, id string) {
	t.Helper()
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
		"node": {"id": %q, "metadata": {"GENERATOR": "grpc", "NAMESPACE": "demo"}}
	}`, ads, id)
	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("xds:///greeter.demo.svc.cluster.local:50051",
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.Connect()
}

// nackClusters connects a proxy that rejects the clusters it is sent.
func nackClusters(t *testing.T, ads, id string) {
	t.Helper()
	conn, err := grpc.NewClient(ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); conn.Close() })
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: id}, TypeUrl: resource.ClusterType}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce,
		ErrorDetail: &status.Status{Code: int32(codes.InvalidArgument), Message: "rejected by test"}}); err != nil {
		t.Fatal(err)
	}
}

const brokenRoute = `apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata:
  name: broken
  namespace: demo
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - destination: {}
`

// TestAgainstTwoPushers runs an ingester and two pusher processes on the
// example mesh plus one broken file, with proxyless grpc-go clients and one
// proxy that NACKs, and checks what every command prints.
func TestAgainstTwoPushers(t *testing.T) {
	f := startTwoPushers(t)
	t.Run("members", f.members)
	t.Run("version", func(t *testing.T) { checkVersions(t, f.etcd, 3) })
	t.Run("log-level", func(t *testing.T) {
		levels := func(args ...string) []string {
			t.Helper()
			out, _, err := shardctl(f.etcd, append([]string{"log-level"}, args...)...)
			if err != nil {
				t.Fatalf("log-level %v: %v\n%s", args, err, out)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] {
				fields := strings.Fields(l)
				got = append(got, fields[len(fields)-1])
			}
			return got
		}
		was := levels()
		if len(was) != 3 || was[0] != was[1] || was[1] != was[2] {
			t.Fatalf("log-level: %v, want the 3 replicas' level", was)
		}
		if got := levels("debug"); !slices.Equal(got, []string{"debug", "debug", "debug"}) {
			t.Errorf("log-level debug: %v", got)
		}
		if got := levels(); !slices.Equal(got, []string{"debug", "debug", "debug"}) {
			t.Errorf("log-level after setting debug: %v", got)
		}
		if got := levels(was[0]); !slices.Equal(got, was) {
			t.Errorf("log-level %s: %v", was[0], got)
		}
		if _, _, err := shardctl(f.etcd, "log-level", "loud"); err == nil || !strings.Contains(err.Error(), "want debug, info, warn or error") {
			t.Errorf("log-level loud: %v", err)
		}
	})
	t.Run("bug-report", func(t *testing.T) {
		name := filepath.Join(t.TempDir(), "report.tar.gz")
		if out, _, err := shardctl(f.etcd, "bug-report", name); err != nil || !strings.Contains(out, "3 replicas") {
			t.Fatalf("bug-report: %v\n%s", err, out)
		}
		files := readArchive(t, name)
		for _, want := range []string{"version.txt", "members.yaml", "pusher-pusher-a/readyz.txt", "pusher-pusher-a/metrics.txt",
			"pusher-pusher-a/syncz.json", "pusher-pusher-b/goroutines.txt", "ingester-ingester-0/problems.json", "ingester-ingester-0/loglevel.json"} {
			if _, ok := files[want]; !ok {
				t.Errorf("the report has no %s: %v", want, slices.Sorted(maps.Keys(files)))
			}
		}
		for file, b := range files {
			if strings.Contains(file, "errors") || bytes.Contains(b, []byte("PRIVATE KEY")) {
				t.Errorf("the report holds %s: %.200s", file, b)
			}
		}
		if !bytes.Contains(files["pusher-pusher-a/syncz.json"], []byte("grpc-a")) {
			t.Errorf("pusher-a's proxies are not in the report: %.300s", files["pusher-pusher-a/syncz.json"])
		}
		if _, _, err := shardctl(f.etcd, "bug-report", name); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Errorf("a second report over the first: %v, want it refused", err)
		}
	})
	t.Run("version of admin addresses", func(t *testing.T) {
		out, _, err := shardctl(f.etcd, "version", "--admin-addrs", f.a.admin+","+f.b.admin)
		if want := "shardpilot " + version.Release + " (revision "; err != nil || strings.Count(out, want) != 3 || strings.Contains(out, "(unknown)") {
			t.Errorf("version --admin-addrs: %v, want the client's and the two pushers' versions from their metrics\n%s", err, out)
		}
	})
	f.listed(t)
	t.Run("table", f.table)
	t.Run("proxy-config", f.proxyConfig)
	t.Run("analyze", f.analyze)
	t.Run("security-check", f.securityCheck)
	t.Run("found in Kubernetes", f.foundInKubernetes)
	t.Run("unreachable pusher", f.unreachable)
	t.Run("pusher stops", f.pusherStops)
}

// The proxies of TestAgainstTwoPushers.
const (
	grpcA   = "sidecar~127.0.0.1~grpc-a.demo~demo.svc.cluster.local"
	grpcB1  = "sidecar~127.0.0.2~grpc-b1.demo~demo.svc.cluster.local"
	grpcB2  = "sidecar~127.0.0.3~grpc-b2.demo~demo.svc.cluster.local"
	nacking = "sidecar~192.168.0.9~nacker.demo~demo.svc.cluster.local"
)

// wantRows are the proxies listed, in order, with their pushers.
var wantRows = []struct{ proxy, pusher string }{{grpcA, "pusher-a"}, {grpcB1, "pusher-b"}, {grpcB2, "pusher-b"}, {nacking, "pusher-a"}}

// twoPushers is an ingester and two pushers with their proxies connected.
type twoPushers struct {
	etcd    string
	etcdCli *clientv3.Client
	a, b    *process
}

// startTwoPushers starts the processes and connects the proxies: three
// grpc-go clients, one on pusher a and two on pusher b, and one that NACKs
// its clusters, on a.
func startTwoPushers(t *testing.T) *twoPushers {
	etcd, etcdCli := testutil.Etcd(t)
	nats, _ := testutil.NATS(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../pusher", "../ingester")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	mesh := t.TempDir()
	for _, f := range []string{"greeter.yaml", "reviews.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../examples/mesh", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mesh, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mesh, "broken.yaml"), []byte(brokenRoute), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"SHARDPILOT_ETCD_ENDPOINTS=" + etcd.Endpoint, "SHARDPILOT_NATS_URL=" + nats.URL}
	start(t, filepath.Join(bin, "ingester"), env, "--mesh-dir", mesh, "--leader-id", "ingester-0")
	// The pushers start on the whole mesh: one that loaded the store while
	// the ingester was still writing it would reclassify its proxies as the
	// rest arrived, ending the NACKing proxy's stream, which does not
	// reconnect.
	testutil.Eventually(t, 30*time.Second, "the ingester wrote the mesh", func() (bool, string) {
		resp, err := etcdCli.Get(testutil.Context(t), "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err.Error()
		}
		return resp.Count >= 7, fmt.Sprintf("%d objects", resp.Count)
	})
	a := start(t, filepath.Join(bin, "pusher"), env, "--name", "pusher-a")
	b := start(t, filepath.Join(bin, "pusher"), env, "--name", "pusher-b")

	dialXDS(t, a.ads, grpcA)
	dialXDS(t, b.ads, grpcB1)
	dialXDS(t, b.ads, grpcB2)
	nackClusters(t, a.ads, nacking)
	return &twoPushers{etcd: etcd.Endpoint, etcdCli: etcdCli, a: a, b: b}
}

// listed waits until every proxy is listed once, in its final state, and
// checks which pusher each is on and the NACK.
func (f *twoPushers) listed(t *testing.T) {
	var rows []proxyRow
	testutil.Eventually(t, 30*time.Second, "every proxy is listed once, in its final state", func() (bool, string) {
		out, errOut, err := shardctl(f.etcd, "proxy-status", "-o", "json")
		if err != nil {
			return false, fmt.Sprint(err, errOut)
		}
		rows = nil
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			return false, err.Error()
		}
		if len(rows) != 4 {
			return false, out
		}
		for _, r := range rows[:3] {
			for _, typ := range []string{"CDS", "LDS", "EDS", "RDS"} {
				if r.Types[typ].State != "SYNCED" {
					return false, out
				}
			}
		}
		return rows[3].Types["CDS"].State == "NACKED", out
	})
	for i, w := range wantRows {
		if r := rows[i]; r.Proxy != w.proxy || r.Pusher != w.pusher || r.Streams != 1 {
			t.Errorf("row %d: proxy %s on %s with %d streams, want %s on %s with 1", i, r.Proxy, r.Pusher, r.Streams, w.proxy, w.pusher)
		}
	}
	if n := rows[3].Types["CDS"].LastNACK; n == nil || n.Message != "rejected by test" || n.Version != rows[3].Types["CDS"].Sent {
		t.Errorf("the NACK: %+v, want the message of the version sent", n)
	}

}

// members lists every process.
func (f *twoPushers) members(t *testing.T) {
	out, _, err := shardctl(f.etcd, "members")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pusher-a  ", "pusher-b  ", "ingester-0", f.a.admin, f.b.ads} {
		if !strings.Contains(out, want) {
			t.Errorf("members: no %q in\n%s", want, out)
		}
	}
}

// table: proxy-status as a table, for all and for one proxy.
func (f *twoPushers) table(t *testing.T) {
	out, _, err := shardctl(f.etcd, "proxy-status")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shardctl proxy-status\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || strings.Join(strings.Fields(lines[0]), " ") != "NAME PUSHER CDS LDS EDS RDS API CLASS AGE" {
		t.Fatalf("proxy-status:\n%s", out)
	}
	for i, w := range wantRows {
		f := strings.Fields(lines[i+1])
		state := "SYNCED SYNCED SYNCED SYNCED"
		if w.proxy == nacking {
			state = "NACKED - - -"
		}
		if f[0] != shortName(w.proxy) || f[1] != w.pusher || strings.Join(f[2:6], " ") != state || f[6] != "SotW" {
			t.Errorf("line %q: want %s on %s, %s", lines[i+1], shortName(w.proxy), w.pusher, state)
		}
	}
	out, _, err = shardctl(f.etcd, "proxy-status", nacking)
	t.Logf("shardctl proxy-status %s\n%s", nacking, out)
	if err != nil || !strings.Contains(out, "pusher-a ("+f.a.admin+")") || !strings.Contains(out, "rejected by test") {
		t.Errorf("proxy-status %s: %v\n%s", nacking, err, out)
	}
	if _, _, err := shardctl(f.etcd, "proxy-status", "nobody"); err == nil || !strings.Contains(err.Error(), `"nobody" is connected to no pusher`) {
		t.Errorf("an unknown proxy: %v", err)
	}
	// A proxy by <pod>.<namespace>, or <pod> in -n; -n filters the list.
	for _, args := range [][]string{{"proxy-status", "nacker.demo"}, {"proxy-status", "-n", "demo", "nacker"}} {
		if out, _, err := shardctl(f.etcd, args...); err != nil || !strings.Contains(out, "rejected by test") {
			t.Errorf("%q: %v\n%s", args, err, out)
		}
	}
	if out, _, err := shardctl(f.etcd, "proxy-status", "-n", "demo"); err != nil || len(strings.Split(strings.TrimSpace(out), "\n")) != 5 {
		t.Errorf("proxy-status -n demo: %v\n%s", err, out)
	}
	if out, _, err := shardctl(f.etcd, "proxy-status", "-n", "elsewhere"); err != nil || !strings.Contains(out, "No proxy of namespace elsewhere") {
		t.Errorf("proxy-status -n elsewhere: %v\n%s", err, out)
	}
	out, _, err = shardctl(f.etcd, "proxy-status", "-o", "yaml")
	var rows []proxyRow
	if err != nil || yaml.Unmarshal([]byte(out), &rows) != nil || len(rows) != 4 || rows[0].Proxy != grpcA {
		t.Errorf("proxy-status -o yaml: %v, %d rows\n%s", err, len(rows), out)
	}
}

// proxyConfig: what a proxy is served, as text and as JSON.
func (f *twoPushers) proxyConfig(t *testing.T) {
	for what, wants := range map[string][]string{
		"clusters":  {"greeter.demo.svc.cluster.local", "50051", "outbound", "EDS"},
		"listeners": {"greeter.demo.svc.cluster.local:50051", "(API listener)", "Route:"},
		"routes":    {"greeter.demo.svc.cluster.local"},
		"endpoints": {"127.0.0.1:50061", "127.0.0.2:50061", "outbound|50051||greeter.demo.svc.cluster.local"},
	} {
		out, _, err := shardctl(f.etcd, "proxy-config", shortName(grpcB1), what)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		t.Logf("shardctl proxy-config %s %s\n%s", grpcB1, what, out)
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("proxy-config %s: no %q in\n%s", what, w, out)
			}
		}
	}
	// istioctl's filters: --fqdn and --port of clusters and endpoints,
	// --name of anything.
	for _, c := range []struct {
		args      []string
		want, not string
	}{
		{[]string{"clusters", "--fqdn", "greeter.demo.svc.cluster.local"}, "greeter.demo.svc.cluster.local", "reviews.bookinfo"},
		{[]string{"endpoints", "--port", "50051"}, "outbound|50051||greeter.demo.svc.cluster.local", "|9080|"},
		{[]string{"clusters", "--name", "outbound|9080|*"}, "reviews.bookinfo.svc.cluster.local", "greeter.demo"},
	} {
		out, _, err := shardctl(f.etcd, append([]string{"pc", shortName(grpcB1)}, c.args...)...)
		if err != nil || !strings.Contains(out, c.want) || strings.Contains(out, c.not) {
			t.Errorf("pc %v: %v, want %q and no %q in\n%s", c.args, err, c.want, c.not, out)
		}
	}
	if _, _, err := shardctl(f.etcd, "pc", shortName(grpcB1), "routes", "--fqdn", "x"); err == nil || !strings.Contains(err.Error(), "--fqdn and --port filter clusters") {
		t.Errorf("--fqdn of routes: %v, want it refused", err)
	}
	// The provenance columns name the DestinationRule of reviews'
	// clusters and the VirtualService of its virtual host.
	for what, line := range map[string]string{
		"clusters": "reviews.bookinfo.svc.cluster.local 9080 v1 outbound EDS reviews.bookinfo",
		"routes":   "reviews.bookinfo.svc.cluster.local:9080 reviews.bookinfo.svc.cluster.local:9080, reviews.bookinfo.svc.cluster.local 2 reviews.bookinfo",
	} {
		out, _, err := shardctl(f.etcd, "proxy-config", shortName(grpcB1), what)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, l := range strings.Split(out, "\n") {
			found = found || strings.HasSuffix(strings.Join(strings.Fields(l), " "), line)
		}
		if !found {
			t.Errorf("proxy-config %s: no line ending %q in\n%s", what, line, out)
		}
	}
	// JSON is the resources themselves; the endpoints are exactly
	// those the proxy's clusters take from EDS, not the whole mesh's.
	decodeAll := func(what string, into func(json.RawMessage) (string, error)) []string {
		t.Helper()
		out, _, err := shardctl(f.etcd, "proxy-config", what, grpcA, "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var raw []json.RawMessage
		if err := json.Unmarshal([]byte(out), &raw); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range raw {
			n, err := into(r)
			if err != nil {
				t.Fatal(err)
			}
			if n != "" {
				names = append(names, n)
			}
		}
		slices.Sort(names)
		return names
	}
	assignments := decodeAll("endpoints", func(r json.RawMessage) (string, error) {
		var cla endpoint.ClusterLoadAssignment
		err := protojson.Unmarshal(r, &cla)
		return cla.GetClusterName(), err
	})
	eds := decodeAll("clusters", func(r json.RawMessage) (string, error) {
		var c cluster.Cluster
		err := protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(r, &c)
		if c.GetType() != cluster.Cluster_EDS {
			return "", err
		}
		return cmp.Or(c.GetEdsClusterConfig().GetServiceName(), c.GetName()), err
	})
	if !slices.Contains(assignments, "outbound|50051||greeter.demo.svc.cluster.local") || !slices.Equal(assignments, eds) {
		t.Errorf("endpoints of %s: %v, want those its EDS clusters name: %v", grpcA, assignments, eds)
	}
	if _, _, err := shardctl(f.etcd, "proxy-config", grpcA, "scrts"); err == nil || !strings.Contains(err.Error(), "want clusters, routes, listeners, endpoints or secrets") {
		t.Errorf("an unknown type: %v", err)
	}
	// These pushers serve no certificates.
	if out, errOut, err := shardctl(f.etcd, "proxy-config", grpcA, "secrets"); err != nil || !strings.Contains(errOut, "no secrets") || strings.Count(out, "\n") != 1 {
		t.Errorf("the secrets of a proxy served none: %v\n%s%s", err, errOut, out)
	}
}

// analyze: the problem of the broken file.
func (f *twoPushers) analyze(t *testing.T) {
	out, _, err := shardctl(f.etcd, "analyze")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("shardctl analyze\n%s", out)
	for _, w := range []string{"SOURCE", "yaml", "broken.yaml", "VirtualService demo/broken", "destination.host"} {
		if !strings.Contains(out, w) {
			t.Errorf("analyze: no %q in\n%s", w, out)
		}
	}
	out, _, err = shardctl(f.etcd, "analyze", "-o", "json")
	var problems []map[string]string
	if err != nil || json.Unmarshal([]byte(out), &problems) != nil || len(problems) != 1 || problems[0]["source"] != "yaml" {
		t.Errorf("analyze -o json: %v\n%s", err, out)
	}
}

// securityCheck: the pushers and ingester run as a trial does (plaintext
// ADS, NATS and etcd without credentials, events unsigned): each weakness
// is listed once with every replica that has it, and the exit status says
// there are some of high severity.
func (f *twoPushers) securityCheck(t *testing.T) {
	out, _, err := shardctl(f.etcd, "security-check")
	t.Logf("shardctl security-check\n%s", out)
	if err == nil || !strings.Contains(err.Error(), "weak settings of high severity") {
		t.Errorf("security-check of a trial: %v, want a failure naming the weak settings of high severity", err)
	}
	out, _, _ = shardctl(f.etcd, "security-check", "-o", "json")
	var got []struct {
		Severity, Setting string
		Replicas          []string
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("security-check -o json: %v\n%s", err, out)
	}
	want := map[string][]string{
		"NATS server authorization": {"ingester ingester-0", "pusher pusher-a", "pusher pusher-b"},
		"etcd authentication":       {"ingester ingester-0", "pusher pusher-a", "pusher pusher-b"},
		"--ads-cert-file":           {"pusher pusher-a", "pusher pusher-b"},
		"--bus-verify-key-file":     {"pusher pusher-a", "pusher pusher-b"},
		"--bus-signing-key-file":    {"ingester ingester-0"},
	}
	for prefix, replicas := range want {
		i := slices.IndexFunc(got, func(w struct {
			Severity, Setting string
			Replicas          []string
		}) bool {
			return strings.HasPrefix(w.Setting, prefix)
		})
		if i < 0 || got[i].Severity != "high" || !slices.Equal(got[i].Replicas, replicas) {
			t.Errorf("security-check: %s: %+v, want of high severity on %v", prefix, got, replicas)
		}
	}
}

// unreachable: a pusher that is announced but does not answer.
func (f *twoPushers) unreachable(t *testing.T) {
	// A pusher that is announced but does not answer: the others'
	// proxies are still listed, with a warning naming it.
	ctx := testutil.Context(t)
	dead := store.Member{Role: "pusher", Name: "pusher-gone", Admin: testutil.FreeAddr(t)}
	v, _ := json.Marshal(dead)
	key := store.MemberPrefix + "pusher/gone"
	if _, err := f.etcdCli.Put(ctx, key, string(v)); err != nil {
		t.Fatal(err)
	}
	defer f.etcdCli.Delete(ctx, key)
	out, errOut, err := shardctl(f.etcd, "proxy-status")
	if err == nil || !strings.Contains(err.Error(), "1 of 3 could not be asked") ||
		!strings.Contains(errOut, "pusher pusher-gone ("+dead.Admin+")") || strings.Count(out, "\n") != 5 {
		t.Errorf("with an unreachable pusher: %v\nstderr: %s\nstdout: %s", err, errOut, out)
	}
}

// pusherStops: a pusher that stops withdraws its announcement.
func (f *twoPushers) pusherStops(t *testing.T) {
	f.b.stop()
	// It withdrew its announcement on the way out: no warning, and
	// only the proxies of the other pusher.
	out, errOut, err := shardctl(f.etcd, "proxy-status")
	if err != nil || errOut != "" || strings.Contains(out, "pusher-b") || !strings.Contains(out, shortName(grpcA)) {
		t.Errorf("after pusher-b stopped: %v %s\n%s", err, errOut, out)
	}
}

// TestFlags: bad flags and commands are refused with what is wrong.
func TestFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "no command given"},
		{[]string{"proxy-stats"}, `unknown command "proxy-stats"`},
		{[]string{"proxy-status", "-A", "-n", "demo"}, `--all-namespaces and --namespace "demo": one or the other`},
		{[]string{"proxy-status", "-o", "xml"}, `--output "xml"`},
		{[]string{"proxy-status", "--timeout", "0s"}, "--timeout 0s"},
		{[]string{"proxy-config", "p"}, "want <proxy> clusters|routes|listeners|endpoints|secrets"},
		{[]string{"members", "--admin-addrs", "127.0.0.1:1"}, "drop --admin-addrs"},
		{[]string{"analyze", "--admin-token-file", "/nonexistent"}, "--admin-token-file"},
		{[]string{"ps", "--context", "prod"}, "give --kube-namespace"},
		{[]string{"ps", "--etcd-endpoints", "http://127.0.0.1:1", "--timeout", "1s"}, "--kube-namespace <the release's namespace>"},
	} {
		var out bytes.Buffer
		if err := run(context.Background(), c.args, &out, &out); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("shardctl %q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// TestToken: the admin token is sent as a bearer token.
func TestToken(t *testing.T) {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		_, _ = io.WriteString(w, `[{"source":"yaml","location":"a.yaml","reason":"bad"}]`)
	})}
	lis, addr := listen(t)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Close()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"analyze", "--admin-addrs", addr, "--admin-token-file", tok}, &out, &errOut); err != nil || !strings.Contains(out.String(), "a.yaml") {
		t.Errorf("with the token: %v %s %s", err, out.String(), errOut.String())
	}
	out.Reset()
	errOut.Reset()
	if err := run(context.Background(), []string{"analyze", "--admin-addrs", addr}, &out, &errOut); err == nil || !strings.Contains(errOut.String(), "401") {
		t.Errorf("without the token: %v %s", err, errOut.String())
	}
}

func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return lis, lis.Addr().String()
}

// checkVersions: shardctl version prints its own version and each of the
// members' (all of this release).
func checkVersions(t *testing.T, etcd string, members int) {
	t.Helper()
	out, _, err := shardctl(etcd, "version")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "client: shardpilot "+version.Release) || strings.Count(out, "shardpilot "+version.Release) != members+1 {
		t.Errorf("version: want the client's and the %d members' versions, got\n%s", members, out)
	}
}

// TestAnalyzeFiles: analyze -f checks YAML files and directories offline,
// as the ingesters would, naming the file, the field and the reason; exit
// status 1 when an input would be rejected.
func TestAnalyzeFiles(t *testing.T) {
	dir := t.TempDir()
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte(brokenRoute), 0o600); err != nil {
		t.Fatal(err)
	}
	mesh := filepath.Join("..", "..", "examples", "mesh")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"analyze", "-f", broken, "-f", mesh}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "1 inputs would be rejected") ||
		!strings.Contains(out.String(), broken+" document 1") || !strings.Contains(out.String(), "spec.http[0].route[0].destination.host") {
		t.Errorf("analyze -f broken.yaml -f examples/mesh: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"analyze", "-f", mesh}, &out, &errOut); err != nil || !strings.Contains(out.String(), "No problems") {
		t.Errorf("analyze -f examples/mesh: %v\n%s", err, out.String())
	}
	if err := run(context.Background(), []string{"analyze", "-f", filepath.Join(dir, "none.yaml")}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("analyze -f of a missing file: %v", err)
	}
}

// readArchive returns the files of a gzipped tar by name.
func readArchive(t *testing.T, name string) map[string][]byte {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}
