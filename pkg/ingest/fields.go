package ingest

import (
	"fmt"
	"strings"
)

// FieldRow says what becomes of one field of an input kind, for the
// README's field tables.
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
