package ingress_test

import (
	"path/filepath"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/ingress"
)

// TestFieldTableInReference: the reference's table (docs/reference/inputs.md) of an Ingress's fields (and
// of WorkloadGroup) is the one the Kubernetes types and the translation's
// notes give. Run with -update to rewrite it.
func TestFieldTableInReference(t *testing.T) {
	golden.CheckSection(t, filepath.Join("..", "..", "..", "docs", "reference", "inputs.md"), "ingress-fields", ingress.FieldTable(), "go test ./pkg/ingest/ingress -run TestFieldTableInReference -update")
	for _, r := range ingress.Fields() {
		if r.Status != "supported" && r.Status != "warned" && r.Status != "rejected" {
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
