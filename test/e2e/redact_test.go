package e2e

import (
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/app"
)

// TestRedactURLs: credentials in NATS URLs never reach a log line.
func TestRedactURLs(t *testing.T) {
	got := app.RedactURLs("nats://s3cr3t-token@nats-0:4222, nats://alice:pa55word@nats-1:4222,nats://nats-2:4222")
	if strings.Contains(got, "s3cr3t") || strings.Contains(got, "alice") || strings.Contains(got, "pa55word") ||
		!strings.Contains(got, "nats-0:4222") || !strings.Contains(got, "nats://nats-2:4222") {
		t.Errorf("redacted: %s", got)
	}
}
