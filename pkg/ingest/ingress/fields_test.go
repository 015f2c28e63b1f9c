package ingress_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/ingress"
)

// TestFieldTableInREADME: the README's table of an Ingress's fields (and
// of WorkloadGroup) is the one the Kubernetes types and the translation's
// notes give. Run with -update to rewrite it.
func TestFieldTableInREADME(t *testing.T) {
	path := filepath.Join("..", "..", "..", "README.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- ingress-fields:begin -->\n", "<!-- ingress-fields:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q ... %q section", begin, end)
	}
	table := ingress.FieldTable()
	if golden.Updating() {
		if err := os.WriteFile(path, []byte(s[:i+len(begin)]+table+s[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := s[i+len(begin) : j]; got != table {
		t.Errorf("README.md's Ingress field table is not the translation's: run go test ./pkg/ingest/ingress -run TestFieldTableInREADME -update")
	}
	for _, r := range ingress.Fields() {
		if r.Status != "supported" && r.Status != "warned" && r.Status != "rejected" {
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
