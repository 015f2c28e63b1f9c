package istio

import (
	"reflect"
	"strings"
)

// specTypes are the types each kind's spec decodes into: the source of
// the field table and of the chart's CRD schemas alike.
func specTypes() map[string]reflect.Type {
	out := map[string]reflect.Type{
		KindAuthorizationPolicy:   reflect.TypeFor[authorizationPolicy](),
		KindPeerAuthentication:    reflect.TypeFor[peerAuthentication](),
		KindRequestAuthentication: reflect.TypeFor[requestAuthentication](),
	}
	for _, k := range networkingKinds {
		out[k.kind] = k.spec
	}
	return out
}

// Schema returns the OpenAPI v3 schema of a kind's objects as a CRD holds
// it (structural, so that the API server refuses or prunes a field the
// ingester would not read): its spec as the ingester decodes it, a field
// kept raw (warned of, or read by hand) open, and its status open. False
// for a kind without a decoder type.
func Schema(kind string) (map[string]any, bool) {
	t, ok := specTypes()[kind]
	if !ok {
		return nil, false
	}
	return map[string]any{
		"type": "object",
		"properties": map[string]any{
			"spec":   typeSchema(t),
			"status": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true},
		},
	}, true
}

// typeSchema is the schema of the JSON a Go type decodes.
func typeSchema(t reflect.Type) map[string]any {
	if t == rawMessage || t.Kind() == reflect.Interface {
		return map[string]any{"x-kubernetes-preserve-unknown-fields": true}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return typeSchema(t.Elem())
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": typeSchema(t.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": typeSchema(t.Elem())}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Struct:
		props := map[string]any{}
		structProperties(t, props)
		return map[string]any{"type": "object", "properties": props}
	}
	return map[string]any{"x-kubernetes-preserve-unknown-fields": true}
}

// structProperties adds the JSON fields of a struct (its embedded
// structs' included) to props, each with its field note as description.
func structProperties(t reflect.Type, props map[string]any) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			structProperties(f.Type, props)
			continue
		}
		if name == "" || name == "-" || !f.IsExported() {
			continue
		}
		s := typeSchema(f.Type)
		if note := f.Tag.Get("field"); note != "" {
			s["description"] = note
		}
		props[name] = s
	}
}
