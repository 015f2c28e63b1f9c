package istio

import (
	"os"
	"strings"
	"testing"
)

// TestDocNamesEveryKind: the package's doc names every kind it reads, so
// that it stays true as kinds are added.
func TestDocNamesEveryKind(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(string(doc)), " ")
	for _, k := range kinds {
		name := k
		if k == KindConfigMap {
			name = "MeshConfig"
		}
		if !strings.Contains(text, name) {
			t.Errorf("doc.go does not name %s", name)
		}
	}
}
