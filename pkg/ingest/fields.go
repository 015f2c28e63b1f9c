package ingest

import (
	"fmt"
	"reflect"
	"strings"
)

// FieldRow says what becomes of one field of an input kind, for the
// field tables of docs/reference/inputs.md.
type FieldRow struct {
	Kind, Field string
	// Status is "supported" (it takes effect), "warned" (it has no effect;
	// the rest of the input applies and a warning names the field),
	// "rejected" (the input, or its part holding the field, is refused
	// while it is set) or "as `<row>`" (as another row says).
	Status string
	Note   string
}

// Plain reports whether rows are all supported without a note: such a
// field's fields are one row, the field's.
func Plain(rows []FieldRow) bool {
	for _, r := range rows {
		if r.Status != "supported" || r.Note != "" {
			return false
		}
	}
	return true
}

// FieldTable is rows as a Markdown table, their fields without "spec.".
func FieldTable(rows []FieldRow) string {
	var b strings.Builder
	b.WriteString("| kind | field | status | note |\n| --- | --- | --- | --- |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", r.Kind, strings.TrimPrefix(r.Field, "spec."), r.Status, r.Note)
	}
	return b.String()
}

// TypeFields lists the fields of a Kubernetes API type (by their json
// names, below path): every field is supported unless notes, keyed by
// "<kind> <field>", says otherwise ("warned: why", "supported: how", or
// "as `<row>`"); a field listed there is one row, as is one whose fields
// are all plainly supported.
func TypeFields(kind string, t reflect.Type, path string, notes map[string]string) []FieldRow {
	w := FieldWalk{Note: func(kind string, _ reflect.StructField, field string) (string, bool) {
		note, ok := notes[kind+" "+field]
		return note, ok
	}}
	return w.Rows(kind, t, path)
}

// FieldWalk lists the fields of API types as rows, by their json names.
type FieldWalk struct {
	// Note says what becomes of a field that is not simply supported
	// ("warned: why", "supported: how", "rejected: why", "warned", or
	// "as `<row>`"): such a field is one row.
	Note func(kind string, f reflect.StructField, field string) (string, bool)
	// Opaque, when set, names types listed as one row and not walked
	// (json.RawMessage).
	Opaque func(t reflect.Type) bool
	// Refer lists a named struct type met again as one row saying where
	// its fields were listed ("as `<row>`").
	Refer bool
	seen  map[reflect.Type]string
}

// Rows lists the fields of t at path, for kind; a field whose fields are
// all plainly supported is one row.
func (w *FieldWalk) Rows(kind string, t reflect.Type, path string) []FieldRow {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		if w.Opaque != nil && w.Opaque(t) {
			return nil
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
		if f.Anonymous && name == "" {
			out = append(out, w.Rows(kind, f.Type, path)...) // inlined
			continue
		}
		if name == "" || name == "-" {
			continue
		}
		row := FieldRow{Kind: kind, Field: path + "." + name, Status: "supported"}
		if note, ok := w.Note(kind, f, row.Field); ok {
			row.Status, row.Note, _ = strings.Cut(note, ": ")
			if strings.HasPrefix(note, "as `") {
				row.Status, row.Note = note, ""
			}
			out = append(out, row)
			continue
		}
		elem := f.Type
		for elem.Kind() == reflect.Pointer || elem.Kind() == reflect.Slice || elem.Kind() == reflect.Map {
			elem = elem.Elem()
		}
		if where, ok := w.seen[elem]; ok && w.Refer {
			row.Status = "as `" + where + "`"
			out = append(out, row)
			continue
		}
		children := w.Rows(kind, f.Type, row.Field)
		if len(children) == 0 || Plain(children) {
			out = append(out, row)
			continue
		}
		if w.Refer && elem.Kind() == reflect.Struct && elem.Name() != "" {
			if w.seen == nil {
				w.seen = map[reflect.Type]string{}
			}
			w.seen[elem] = kind + " " + strings.TrimPrefix(row.Field, "spec.")
		}
		out = append(out, children...)
	}
	return out
}
