// Package golden compares test output with files under testdata/, as
// readable, stable JSON. Run the tests with -update to rewrite the files
// from what the code produces now, then review the diff.
package golden

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/ from the current output")

// JSON renders v as indented JSON with sorted keys; proto messages inside
// maps or slices must be rendered with Proto first.
func JSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// Proto renders a message as a generic JSON value (stable, unlike protojson's
// own output, whose spacing is deliberately unstable).
func Proto(t testing.TB, m proto.Message) any {
	t.Helper()
	b, err := protojson.MarshalOptions{UseProtoNames: false}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Check compares got with testdata/<name>, or rewrites it under -update.
func Check(t testing.TB, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the output (run with -update and review the diff):\n%s", path, diff(want, got))
	}
}

// diff shows the first differing lines.
func diff(want, got []byte) string {
	wl, gl := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var b bytes.Buffer
	shown := 0
	for i := 0; i < max(len(wl), len(gl)) && shown < 20; i++ {
		var w, g []byte
		if i < len(wl) {
			w = wl[i]
		}
		if i < len(gl) {
			g = gl[i]
		}
		if !bytes.Equal(w, g) {
			b.WriteString("line ")
			b.WriteString(strconv.Itoa(i + 1))
			b.WriteString(":\n  want: " + string(w) + "\n  got:  " + string(g) + "\n")
			shown++
		}
	}
	return b.String()
}

// Updating reports whether the tests run with -update: a test that keeps
// expected output elsewhere than testdata/ rewrites it then.
func Updating() bool { return *update }

// Validatable is a resource that checks itself (as go-control-plane's
// generated messages do).
type Validatable interface {
	proto.Message
	Validate() error
}

// CheckValid checks that each resource is valid and compares them, as
// JSON, with testdata/<name>.
func CheckValid[R Validatable](t testing.TB, name string, resources []R) {
	t.Helper()
	out := make([]any, 0, len(resources))
	for _, r := range resources {
		if err := r.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		out = append(out, Proto(t, r))
	}
	Check(t, name, JSON(t, out))
}

// CheckSection compares the section of a document between the lines
// "<!-- <section>:begin -->" and "<!-- <section>:end -->" with want, and
// with -update rewrites it: a table the document keeps in step with the
// code. fix says the command that rewrites it.
func CheckSection(t testing.TB, path, section, want, fix string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+section+":begin -->\n", "<!-- "+section+":end -->"
	s := string(b)
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q ... %q section", path, begin, end)
	}
	if *update {
		if err := os.WriteFile(path, []byte(s[:i+len(begin)]+want+s[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if s[i+len(begin):j] != want {
		t.Errorf("%s's %s section is out of date: run %s", path, section, fix)
	}
}
