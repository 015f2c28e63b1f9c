package yamldir_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const good = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.1}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter]
  http:
  - match: [{uri: {prefix: /hello}}]
    route: [{destination: {host: greeter}}]
`

const extra = `apiVersion: networking.istio.io/v1beta1
kind: ServiceEntry
metadata: {name: extra, namespace: demo}
spec:
  hosts: [extra.example.com]
  ports: [{number: 80, name: http, protocol: HTTP}]
`

// The bad inputs, each in its own file.
var bad = map[string]string{
	// A YAML syntax error in a file that used to hold a valid object.
	"extra.yaml": "apiVersion: networking.istio.io/v1beta1\nkind: ServiceEntry\nmetadata: {name: extra\n",
	// A namespace no key may be made of.
	"path-namespace.yaml": `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ok, namespace: ../../etc}
spec: {hosts: [ok.example.com], ports: [{number: 80, name: http, protocol: HTTP}], resolution: DNS}
`,
	"unknown-kind.yaml": `apiVersion: networking.istio.io/v1
kind: VirtualServce
metadata: {name: typo, namespace: demo}
spec: {hosts: [greeter]}
`,
	"unknown-host.yaml": `apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: elsewhere, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  http:
  - route:
    - destination: {host: greeter}
    - destination: {host: nowhere.example.com}
      weight: 10
`,
	"duplicate.yaml": `# one good document first
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: greeter, namespace: demo}
spec: {host: greeter}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [other.demo.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
`,
	"unknown-field.yaml": `apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: typo, namespace: demo}
spec:
  rules: [{from: [{source: {namepsaces: [demo]}}]}]
`,
}

// The invalid new version of a valid object: a regex RE2 does not accept.
const goodBroken = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 10.0.0.1}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter, namespace: demo}
spec:
  hosts: [greeter]
  http:
  - match: [{uri: {regex: "/hello(["}}]
    route: [{destination: {host: greeter}}]
`

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func syncDir(t *testing.T, s *ingest.Syncer, dir string) ingest.Result {
	t.Helper()
	inputs, problems, err := yamldir.Read(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	objs, more := istio.Normalize(inputs, istio.Options{Shard: "yaml"})
	res, err := s.Sync(context.Background(), objs, append(problems, more...))
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func keys(t *testing.T, st *store.Store) map[string]model.Object {
	t.Helper()
	items, _, errs, err := st.List(context.Background())
	if err != nil || len(errs) > 0 {
		t.Fatal(err, errs)
	}
	out := map[string]model.Object{}
	for _, it := range items {
		out[it.Key.String()] = it.Object
	}
	return out
}

func TestBadInputIsReportedAndLosesNothing(t *testing.T) {
	_, cli := testutil.Etcd(t)
	st := store.New(cli)
	syncer, err := ingest.NewSyncer(ingest.Config{Source: "yaml", Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, dir, "greeter.yaml", good)
	write(t, dir, "extra.yaml", extra)
	if res := syncDir(t, syncer, dir); len(res.Problems) != 0 || res.Written != 4 {
		t.Fatalf("good mesh: %+v, want 4 writes and no problems", res)
	}
	before := keys(t, st)

	write(t, dir, "greeter.yaml", goodBroken)
	for name, content := range bad {
		write(t, dir, name, content)
	}
	res := syncDir(t, syncer, dir)

	// Every bad input is reported with its file, document, field and reason.
	wants := []struct{ location, field, reason string }{
		{"extra.yaml", "", "malformed YAML"},
		{"unknown-kind.yaml document 1", "kind", `unknown kind "VirtualServce"`},
		{"path-namespace.yaml document 1", "metadata.namespace", `"../../etc" is not a DNS label`},
		{"unknown-host.yaml document 1", "spec.http[0].route[1].destination.host", `unknown host "nowhere.example.com"`},
		{"duplicate.yaml document 2", "metadata.name", "greeter.yaml document 1"},
		{"unknown-field.yaml document 1", "spec", `unknown field "rules[0].from[0].source.namepsaces"`},
		{"greeter.yaml document 2", "spec.http[0].match[0].uri.regex", "not an RE2 regex"},
	}
	for _, w := range wants {
		found := false
		for _, p := range res.Problems {
			if p.Location == w.location && p.Field == w.field && strings.Contains(p.Reason, w.reason) {
				found = true
				t.Logf("reported: %s", p.Error())
			}
		}
		if !found {
			t.Errorf("no problem at %q field %q saying %q; got:\n%v", w.location, w.field, w.reason, res.Problems)
		}
	}
	if len(res.Problems) != len(wants) {
		t.Errorf("got %d problems, want %d: %v", len(res.Problems), len(wants), res.Problems)
	}

	// The rest keeps flowing: the good DestinationRule next to the
	// duplicate was written; nothing valid was lost or replaced.
	after := keys(t, st)
	if _, ok := after["/mesh/v1/trafficpolicies/demo/greeter"]; !ok {
		t.Error("the valid DestinationRule beside the duplicate was not written")
	}
	for k, o := range before {
		if got, ok := after[k]; !ok || !model.SameContent(got, o) {
			t.Errorf("%s was changed or removed by bad input", k)
		}
	}
	if len(after) != len(before)+1 {
		t.Errorf("store holds %d objects, want %d", len(after), len(before)+1)
	}
	vs := after["/mesh/v1/routerules/demo/greeter"].(*meshv1.RouteRule)
	if vs.Http[0].Match[0].Uri.GetPrefix() != "/hello" {
		t.Errorf("the VirtualService's last valid version was replaced: %v", vs)
	}

	// Once fixed, a file's objects flow again; a removed file's objects go.
	write(t, dir, "greeter.yaml", good)
	for name := range bad {
		os.Remove(filepath.Join(dir, name))
	}
	os.Remove(filepath.Join(dir, "extra.yaml"))
	res = syncDir(t, syncer, dir)
	if len(res.Problems) != 0 {
		t.Errorf("problems after the fix: %v", res.Problems)
	}
	final := keys(t, st)
	if _, ok := final["/mesh/v1/services/demo/extra"]; ok {
		t.Error("removing extra.yaml did not remove its ServiceEntry")
	}
	if _, ok := final["/mesh/v1/trafficpolicies/demo/greeter"]; ok {
		t.Error("removing duplicate.yaml did not remove its DestinationRule")
	}
	if len(final) != 3 {
		t.Errorf("store holds %v, want the greeter service, endpoints and route", final)
	}
}

func TestResyncWritesNothing(t *testing.T) {
	_, cli := testutil.Etcd(t)
	st := store.New(cli)
	syncer, err := ingest.NewSyncer(ingest.Config{Source: "yaml", Store: st})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write(t, dir, "greeter.yaml", good)
	syncDir(t, syncer, dir)
	rev1, _ := st.Revision(context.Background())
	res := syncDir(t, syncer, dir)
	rev2, _ := st.Revision(context.Background())
	if res.Written != 0 || res.Deleted != 0 || rev1 != rev2 {
		t.Errorf("a resync of unchanged input wrote %d, deleted %d, moved the revision %d→%d", res.Written, res.Deleted, rev1, rev2)
	}
}

func TestReadReportsNonResources(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "list.yaml", "- just\n- a list\n")
	write(t, dir, "empty.yaml", "---\n# nothing\n---\n")
	write(t, dir, "notes.txt", "not yaml at all: [")
	inputs, problems, err := yamldir.Read(dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(inputs) != 0 || len(problems) != 1 || problems[0].Location != "list.yaml document 1" {
		t.Fatalf("inputs %v problems %v; want one problem for list.yaml document 1", inputs, problems)
	}
}

// TestSpecialFilesAreSkipped: a FIFO named like a YAML file (which would
// block a read forever), and a link to one, are each a problem; the other
// files are read.
func TestSpecialFilesAreSkipped(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(dir, "pipe.yaml"), 0o600); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	if err := os.Symlink(filepath.Join(dir, "pipe.yaml"), filepath.Join(dir, "link.yaml")); err != nil {
		t.Fatal(err)
	}
	write(t, dir, "ok.yaml", `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ok, namespace: demo}
spec:
  hosts: [ok.demo.svc.cluster.local]
  ports: [{number: 80, name: http, protocol: HTTP}]
`)
	done := make(chan struct{})
	var inputs []istio.Input
	var problems []ingest.Problem
	var err error
	go func() {
		defer close(done)
		inputs, problems, err = yamldir.Read(dir, time.Now())
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("reading a directory with a FIFO in it hangs")
	}
	if err != nil {
		t.Fatal(err)
	}
	var where []string
	for _, p := range problems {
		where = append(where, p.Location+": "+p.Reason)
	}
	slices.Sort(where)
	if len(inputs) != 1 || !slices.Equal(where, []string{"link.yaml: not a regular file; skipped", "pipe.yaml: not a regular file; skipped"}) {
		t.Errorf("inputs %d, problems %q; want ok.yaml read and both special files reported", len(inputs), where)
	}
}

const workload = `apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: vm-1, namespace: demo}
spec: {address: 10.9.0.1, labels: {app: vms}}
`

const vms = `apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: vms, namespace: demo}
spec:
  hosts: [vms.internal]
  ports: [{number: 80, name: http, protocol: HTTP}]
  resolution: STATIC
  workloadSelector: {labels: {app: vms}}
`

// TestFileEventsSyncWhatChanged runs the source on a directory and edits
// it the ways that touch other files too: after every step, the store
// holds exactly what a sync of the whole directory from scratch holds.
func TestFileEventsSyncWhatChanged(t *testing.T) {
	_, cli := testutil.Etcd(t)
	st := store.New(cli)
	syncer, err := ingest.NewSyncer(ingest.Config{Source: "yaml", Store: st, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	_, oracle := testutil.Etcd(t)
	dir := t.TempDir()
	write(t, dir, "greeter.yaml", good)
	src, err := yamldir.New(yamldir.Config{Dir: dir, Syncer: syncer, Normalize: istio.Options{Shard: "yaml"}, Log: testutil.Log(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	steps := []struct {
		what string
		do   func()
	}{
		{"the directory as it starts", func() {}},
		{"a file added", func() { write(t, dir, "extra.yaml", extra) }},
		{"a file edited", func() { write(t, dir, "extra.yaml", strings.Replace(extra, "number: 80", "number: 81", 1)) }},
		{"a ServiceEntry selecting workloads", func() { write(t, dir, "vms.yaml", vms) }},
		{"a WorkloadEntry it selects, in another file", func() { write(t, dir, "vm-1.yaml", workload) }},
		{"the WorkloadEntry moved", func() { write(t, dir, "vm-1.yaml", strings.Replace(workload, "10.9.0.1", "10.9.0.2", 1)) }},
		{"a second definition of a name, in another file", func() {
			write(t, dir, "more-extra.yaml", strings.Replace(extra, "extra.example.com", "also.example.com", 1))
		}},
		{"the first definition removed", func() { os.Remove(filepath.Join(dir, "extra.yaml")) }},
		{"a new subdirectory with a file", func() {
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, dir, "sub/greeter.yaml", strings.ReplaceAll(good, "demo", "sub"))
		}},
		{"a file edited in the subdirectory", func() {
			write(t, dir, "sub/greeter.yaml", strings.ReplaceAll(strings.Replace(good, "10.0.0.1", "10.0.0.2", 1), "demo", "sub"))
		}},
		{"a broken file added while another is removed", func() {
			write(t, dir, "broken.yaml", "metadata: {name: [oops\n")
			os.Remove(filepath.Join(dir, "vms.yaml"))
		}},
		{"the subdirectory removed", func() { os.RemoveAll(filepath.Join(dir, "sub")) }},
	}
	for _, step := range steps {
		step.do()
		want := fromScratch(t, oracle, dir)
		testutil.Eventually(t, 10*time.Second, step.what+": the store holds what a whole sync would", func() (bool, string) {
			got := yamlObjects(t, st)
			var diff []string
			for k, o := range want {
				if g, ok := got[k]; !ok || !model.SameContent(g, o) {
					diff = append(diff, "want "+k)
				}
			}
			for k := range got {
				if _, ok := want[k]; !ok {
					diff = append(diff, "extra "+k)
				}
			}
			return len(diff) == 0, strings.Join(diff, ", ")
		})
	}
}

// fromScratch syncs the directory into an emptied store, as a first sync does.
func fromScratch(t *testing.T, cli *clientv3.Client, dir string) map[string]model.Object {
	t.Helper()
	if _, err := cli.Delete(context.Background(), model.Prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	st := store.New(cli)
	syncer, err := ingest.NewSyncer(ingest.Config{Source: "yaml", Store: st})
	if err != nil {
		t.Fatal(err)
	}
	syncDir(t, syncer, dir)
	return yamlObjects(t, st)
}

func yamlObjects(t *testing.T, st *store.Store) map[string]model.Object {
	t.Helper()
	out := keys(t, st)
	for k, o := range out {
		if o.GetOrigin().GetSource() != "yaml" {
			delete(out, k)
		}
	}
	return out
}
