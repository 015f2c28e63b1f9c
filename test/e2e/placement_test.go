package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/app"
)

func TestParseNamespaces(t *testing.T) {
	got, err := app.ParseNamespaces("# shard 1\nb, a\n\nc d # and d\na\n", "shard-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a", "b", "c", "d"}; !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if got, err := app.ParseNamespaces("# emptied\n", "x"); err != nil || len(got) != 0 {
		t.Errorf("an empty placement: %v, %v; want none, no error", got, err)
	}
	for _, bad := range []string{"a\nB", "a.b", "-a", "a/b", strings.Repeat("a", 64), "*"} {
		_, err := app.ParseNamespaces(bad, "shard-1")
		if err == nil || !strings.Contains(err.Error(), "shard-1: line") {
			t.Errorf("%q: %v, want an error naming the file and line", bad, err)
		}
	}
}
