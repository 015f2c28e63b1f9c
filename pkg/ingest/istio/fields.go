package istio

import (
	"reflect"

	"github.com/shardpilot/shardpilot/pkg/ingest"
)

// FieldRow says what becomes of one field of an Istio networking resource.
type FieldRow = ingest.FieldRow

// networkingKinds are the networking kinds and the types their specs decode into.
var networkingKinds = []struct {
	kind string
	spec reflect.Type
}{
	{"ServiceEntry", reflect.TypeFor[serviceEntry]()},
	{"WorkloadEntry", reflect.TypeFor[workloadEntry]()},
	{"VirtualService", reflect.TypeFor[virtualService]()},
	{"DestinationRule", reflect.TypeFor[destinationRule]()},
	{"Sidecar", reflect.TypeFor[sidecar]()},
	{"Gateway", reflect.TypeFor[gateway]()},
	{"Telemetry", reflect.TypeFor[telemetry]()},
	{"EnvoyFilter", reflect.TypeFor[envoyFilter]()},
	{"WorkloadGroup", reflect.TypeFor[workloadGroup]()},
}

// Fields lists every field of the networking kinds, as decoded: a field
// kept raw (json.RawMessage) is warned of, a typed one is supported,
// unless its `field` tag says otherwise ("warned: why", "supported: how").
// A field whose fields are all supported without a note is one row, and
// a type listed before is one row referring to it.
func Fields() []FieldRow {
	w := ingest.FieldWalk{
		Note: func(_ string, f reflect.StructField, _ string) (string, bool) {
			if tag := f.Tag.Get("field"); tag != "" {
				return tag, true
			}
			return "warned", f.Type == rawMessage
		},
		Opaque: func(t reflect.Type) bool { return t == rawMessage },
		Refer:  true,
	}
	var out []FieldRow
	for _, k := range networkingKinds {
		out = append(out, w.Rows(k.kind, k.spec, "spec")...)
	}
	return out
}

// FieldTable is Fields as a Markdown table.
func FieldTable() string {
	return ingest.FieldTable(Fields())
}
