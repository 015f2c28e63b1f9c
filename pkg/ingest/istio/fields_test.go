package istio_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
)

// TestFieldTableInReference: the reference's table (docs/reference/inputs.md) of every Istio networking
// field is the one the decoder's types give (each field kept raw is
// warned of, each typed one acted on unless its tag says otherwise). Run
// with -update to rewrite it.
func TestFieldTableInReference(t *testing.T) {
	golden.CheckSection(t, filepath.Join("..", "..", "..", "docs", "reference", "inputs.md"), "istio-fields", istio.FieldTable(), "go test ./pkg/ingest/istio -run TestFieldTableInReference -update")
	for _, r := range istio.Fields() {
		switch {
		case r.Status == "supported" || r.Status == "warned" || r.Status == "rejected":
		case strings.HasPrefix(r.Status, "as `"):
		default:
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
