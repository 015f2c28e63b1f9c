package patch

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestDecodedOnceWhileAskedFor: a patch's value is decoded once while
// generations ask for it, and forgotten after a generation that did not.
func TestDecodedOnceWhileAskedFor(t *testing.T) {
	v, _ := structpb.NewStruct(map[string]any{"connect_timeout": "1s"})
	p := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_APPLY_TO_CLUSTER, Operation: meshv1.EnvoyPatch_OPERATION_MERGE, Value: v}
	var d Decoded
	first := d.decode(p, 0).value
	if err := d.decode(p, 0).err; err != nil {
		t.Fatal(err)
	}
	d.Sweep()
	if again := d.decode(p, 0).value; again != first {
		t.Error("decoded again in the generation after")
	}
	d.Sweep()
	d.Sweep() // a generation that did not ask
	if d.values.len() != 0 {
		t.Errorf("kept %d values no generation asked for", d.values.len())
	}
	if again := d.decode(p, 0).value; again == first {
		t.Error("a forgotten value came back")
	}
}
