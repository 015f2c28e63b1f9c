package gatewayapi_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
)

// TestFieldTableInReference: the reference's table (docs/reference/inputs.md) of the Gateway API's fields
// is the one the module's types and the translation's notes give. Run
// with -update to rewrite it.
func TestFieldTableInReference(t *testing.T) {
	golden.CheckSection(t, filepath.Join("..", "..", "..", "docs", "reference", "inputs.md"), "gateway-api-fields", gatewayapi.FieldTable(), "go test ./pkg/ingest/gatewayapi -run TestFieldTableInReference -update")
	for _, r := range gatewayapi.Fields() {
		switch {
		case r.Status == "supported" || r.Status == "warned" || r.Status == "rejected":
		case strings.HasPrefix(r.Status, "as `"):
		default:
			t.Errorf("%s %s: status %q", r.Kind, r.Field, r.Status)
		}
	}
}
