package gatewayapi_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
)

// TestFieldTableInREADME: the README's table of the Gateway API's fields
// is the one the module's types and the translation's notes give. Run
// with -update to rewrite it.
func TestFieldTableInREADME(t *testing.T) {
	path := filepath.Join("..", "..", "..", "README.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- gateway-api-fields:begin -->\n", "<!-- gateway-api-fields:end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("README.md has no %q ... %q section", begin, end)
	}
	table := gatewayapi.FieldTable()
	if golden.Updating() {
		if err := os.WriteFile(path, []byte(s[:i+len(begin)]+table+s[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got := s[i+len(begin) : j]; got != table {
		t.Errorf("README.md's Gateway API field table is not the translation's: run go test ./pkg/ingest/gatewayapi -run TestFieldTableInREADME -update")
	}
	for _, r := range gatewayapi.Fields() {
		switch {
		case r.Status == "supported" || r.Status == "warned" || r.Status == "rejected":
		case strings.HasPrefix(r.Status, "as `"):
		default:
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
