package istio_test

import (
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/golden"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
)

// TestNormalize normalizes every kind and reports every broken input; the
// expected objects and problems are in testdata/normalized.json.
func TestNormalize(t *testing.T) {
	inputs, problems, err := yamldir.Read("testdata/mesh", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 0 {
		t.Fatalf("reading: %v", problems)
	}
	objs, problems := istio.Normalize(inputs, istio.Options{Shard: "yaml"})
	type object struct {
		Key    string `json:"key"`
		Object any    `json:"object"`
	}
	out := struct {
		Objects  []object `json:"objects"`
		Problems []string `json:"problems"`
	}{}
	for _, o := range objs {
		out.Objects = append(out.Objects, object{o.Key.String(), golden.Proto(t, o.Object)})
	}
	for _, p := range problems {
		out.Problems = append(out.Problems, p.Error())
	}
	golden.Check(t, "normalized.json", golden.JSON(t, out))
}

// TestNormalizeSameInputSameOutput: the normalizer is deterministic, which
// is what lets the ingester skip writes on resync.
func TestNormalizeSameInputSameOutput(t *testing.T) {
	inputs, _, err := yamldir.Read("testdata/mesh", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := istio.Normalize(inputs, istio.Options{})
	b, _ := istio.Normalize(inputs, istio.Options{})
	if string(golden.JSON(t, a)) != string(golden.JSON(t, b)) {
		t.Error("two normalizations of the same input differ")
	}
}
