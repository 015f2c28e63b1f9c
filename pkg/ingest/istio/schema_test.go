package istio_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"sigs.k8s.io/yaml"
)

// crdFiles are the chart's Istio CRDs.
var crdFiles = []string{"istio-networking.yaml", "istio-security.yaml", "istio-telemetry.yaml"}

var (
	kindLine   = regexp.MustCompile(`^    kind: (\w+)$`)
	schemaLine = regexp.MustCompile(`^(\s*)openAPIV3Schema:`)
)

// withSchemas returns a CRD file with the schema of every version of each
// kind the ingester decodes replaced by the one generated from its
// decoder types (istio.Schema), and the rest as it is.
func withSchemas(t *testing.T, content string) string {
	t.Helper()
	var out []string
	kind := ""
	lines := strings.Split(content, "\n")
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if m := kindLine.FindStringSubmatch(line); m != nil {
			kind = m[1]
		}
		m := schemaLine.FindStringSubmatch(line)
		schema, ok := istio.Schema(kind)
		if m == nil || !ok {
			out = append(out, line)
			continue
		}
		// Skip what a previous generation wrote below the line.
		for i+1 < len(lines) && strings.HasPrefix(lines[i+1], m[1]+"  ") {
			i++
		}
		y, err := yaml.Marshal(schema)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m[1]+"openAPIV3Schema:")
		for _, l := range strings.Split(strings.TrimSuffix(string(y), "\n"), "\n") {
			out = append(out, m[1]+"  "+l)
		}
	}
	return strings.Join(out, "\n")
}

// TestCRDSchemas: the chart's Istio CRDs hold the schemas generated from
// the ingester's decoder types, so that the API server refuses (or
// prunes) a field the ingester would not read.
func TestCRDSchemas(t *testing.T) {
	for _, name := range crdFiles {
		path := filepath.Join("..", "..", "..", "deploy", "helm", "shardpilot", "crds", name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := withSchemas(t, string(b))
		if golden.Updating() {
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if want != string(b) {
			t.Errorf("%s: its schemas are not the decoder's; run go test ./pkg/ingest/istio -run TestCRDSchemas -update", path)
		}
	}
}
