package istio

import (
	"reflect"
	"strings"

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
// A field whose fields are all supported without a note is one row.
func Fields() []FieldRow {
	var out []FieldRow
	seen := map[reflect.Type]string{}
	for _, k := range networkingKinds {
		out = append(out, fieldRows(k.kind, k.spec, "spec", seen)...)
	}
	return out
}

// fieldRows lists the fields of t at path; a type listed before (seen,
// by where) is one row referring to it.
func fieldRows(kind string, t reflect.Type, path string, seen map[reflect.Type]string) []FieldRow {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		if t == rawMessage {
			break
		}
		if t.Kind() == reflect.Slice {
			path += "[]"
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []FieldRow
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		row := FieldRow{Kind: kind, Field: path + "." + name, Status: "supported"}
		if f.Type == rawMessage {
			row.Status = "warned"
		}
		if tag := f.Tag.Get("field"); tag != "" {
			status, note, _ := strings.Cut(tag, ": ")
			row.Status, row.Note = status, note
		}
		elem := f.Type
		for elem.Kind() == reflect.Pointer || elem.Kind() == reflect.Slice || elem.Kind() == reflect.Map {
			elem = elem.Elem()
		}
		if where, ok := seen[elem]; ok && row.Note == "" {
			row.Status, row.Note = "as `"+where+"`", ""
			out = append(out, row)
			continue
		}
		children := fieldRows(kind, f.Type, row.Field, seen)
		if row.Note != "" || len(children) == 0 || ingest.Plain(children) {
			out = append(out, row)
			continue
		}
		if elem.Kind() == reflect.Struct && elem.Name() != "" {
			seen[elem] = kind + " " + strings.TrimPrefix(row.Field, "spec.")
		}
		out = append(out, children...)
	}
	return out
}

// FieldTable is Fields as a Markdown table.
func FieldTable() string {
	return ingest.FieldTable(Fields())
}
