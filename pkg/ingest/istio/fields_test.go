package istio_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
)

// TestFieldTableInREADME: the README's table of every Istio networking
// field is the one the decoder's types give (each field kept raw is
// warned of, each typed one acted on unless its tag says otherwise). Run
// with -update to rewrite it.
func TestFieldTableInREADME(t *testing.T) {
	path := filepath.Join("..", "..", "..", "README.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- istio-fields:begin -->\n", "<!-- istio-fields:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q ... %q section", begin, end)
	}
	table := istio.FieldTable()
	if golden.Updating() {
		if err := os.WriteFile(path, []byte(s[:i+len(begin)]+table+s[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := s[i+len(begin) : j]; got != table {
		t.Errorf("README.md's field table is not the decoder's: run go test ./pkg/ingest/istio -run TestFieldTableInREADME -update")
	}
	for _, r := range istio.Fields() {
		switch {
		case r.Status == "supported" || r.Status == "warned" || r.Status == "rejected":
		case strings.HasPrefix(r.Status, "as `"):
		default:
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
