package istio_test

import (
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
	golden.CheckSection(t, filepath.Join("..", "..", "..", "README.md"), "istio-fields", istio.FieldTable(), "go test ./pkg/ingest/istio -run TestFieldTableInREADME -update")
	for _, r := range istio.Fields() {
		switch {
		case r.Status == "supported" || r.Status == "warned" || r.Status == "rejected":
		case strings.HasPrefix(r.Status, "as `"):
		default:
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
