package layers_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/layers"
)

// TestModuleKeepsItsLayers: no package of the module imports what its
// layer forbids (go list, the non-test imports).
func TestModuleKeepsItsLayers(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}|{{join .Deps \",\"}}", "../../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []layers.Package
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list: %q", line)
		}
		p := layers.Package{Path: layers.Relative(f[0])}
		for _, i := range strings.Split(f[1], ",") {
			if r := layers.Relative(i); r != "" {
				p.Imports = append(p.Imports, r)
			}
		}
		for _, d := range strings.Split(f[2], ",") {
			if r := layers.Relative(d); r != "" {
				p.Deps = append(p.Deps, r)
			}
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 30 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	for _, v := range layers.Check(pkgs, layers.Rules) {
		t.Error(v)
	}
}

// TestForbiddenImportsAreFound: an import the rules forbid, made directly
// or through another package, is reported with the rule's reason.
func TestForbiddenImportsAreFound(t *testing.T) {
	pkgs := []layers.Package{
		{Path: "pkg/ingest/istio", Imports: []string{"pkg/model", "pkg/xds/patch"}, Deps: []string{"pkg/model", "pkg/xds/patch", "pkg/api/mesh/v1"}},
		{Path: "pkg/xds/identity", Imports: []string{"pkg/classify"}, Deps: []string{"pkg/classify", "pkg/xds/generate"}},
		{Path: "pkg/ca", Imports: []string{"pkg/store", "go.etcd.io/etcd/client/v3"}, Deps: []string{"pkg/store", "go.etcd.io/etcd/client/v3"}},
		{Path: "pkg/store", Imports: []string{"go.etcd.io/etcd/client/v3"}, Deps: []string{"go.etcd.io/etcd/client/v3"}},
		{Path: "pkg/xdsextra", Imports: []string{"pkg/ingest"}, Deps: []string{"pkg/ingest"}},
	}
	got := strings.Join(layers.Check(pkgs, layers.Rules), "\n")
	for _, want := range []string{
		"pkg/ingest/istio imports pkg/xds/patch: ingest normalizes",
		"pkg/xds/identity imports pkg/classify: who a stream is",
		"pkg/xds/identity depends on pkg/xds/generate: who a stream is",
		"pkg/ca imports go.etcd.io/etcd/client/v3: every access to etcd",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("not reported: %q; reported:\n%s", want, got)
		}
	}
	for _, not := range []string{"pkg/store imports", "pkg/xdsextra"} {
		if strings.Contains(got, not) {
			t.Errorf("reported, though allowed: %q in\n%s", not, got)
		}
	}
}
