package istio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/shardpilot/shardpilot/pkg/ingest"
)

var rawMessage = reflect.TypeFor[json.RawMessage]()

// ignoredFields warns of every field of a decoded spec that is set and has
// no effect yet (the json.RawMessage fields of these types): the resource
// applies without it, and the user is told so, by field path.
func (n *normalizer) ignoredFields(in Input, spec any) {
	var paths []string
	walkIgnored(reflect.ValueOf(spec), "spec", &paths)
	slices.Sort(paths)
	for _, p := range paths {
		n.problems = append(n.problems, ingest.Problem{Location: in.Location, Resource: in.name(), Field: p,
			Reason: "has no effect yet; the rest of the resource applies", Warning: true})
	}
}

func walkIgnored(v reflect.Value, path string, out *[]string) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			walkIgnored(v.Elem(), path, out)
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "" || name == "-" {
				continue
			}
			fv := v.Field(i)
			if f.Type == rawMessage {
				if raw := bytes.TrimSpace(fv.Bytes()); len(raw) > 0 && !bytes.Equal(raw, []byte("null")) {
					*out = append(*out, path+"."+name)
				}
				continue
			}
			walkIgnored(fv, path+"."+name, out)
		}
	case reflect.Slice:
		if v.Type() == rawMessage {
			return
		}
		for i := range v.Len() {
			walkIgnored(v.Index(i), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case reflect.Map:
		for _, k := range v.MapKeys() {
			walkIgnored(v.MapIndex(k), fmt.Sprintf("%s[%v]", path, k), out)
		}
	}
}
