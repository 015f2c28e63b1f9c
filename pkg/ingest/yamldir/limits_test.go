package yamldir

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// bomb is a YAML "billion laughs" kept under the YAML library's alias
// ratio (at most 99% of the nodes decoded inside aliases for a document
// of under 400,000 nodes): a 10 KB string that five levels of ten
// aliases repeat 100,000 times (1 GB), after 5,000 plain values. It is
// 40 KB.
func bomb() string {
	var b strings.Builder
	b.WriteString("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: laughs}\nspec:\n")
	// The plain values first: the library checks the ratio as it goes.
	b.WriteString("  plain: [")
	for i := range 5000 {
		fmt.Fprintf(&b, "p%d,", i)
	}
	b.WriteString("x]\n")
	b.WriteString("  s: &l0 " + strings.Repeat("x", 10_000) + "\n")
	for level := 1; level <= 5; level++ {
		fmt.Fprintf(&b, "  l%d: &l%d [%s*l%d]\n", level, level, strings.Repeat(fmt.Sprintf("*l%d,", level-1), 9), level-1)
	}
	return b.String()
}

// TestAliasBombRefusedWithBoundedMemory: a document that its aliases
// expand to billions of nodes is refused before it is expanded, with the
// memory of its parse (under 64 MiB allocated), and the file's other
// documents are read.
func TestAliasBombRefusedWithBoundedMemory(t *testing.T) {
	good := "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: default, namespace: shop}\nspec: {egress: [{hosts: [./*]}]}\n"
	data := []byte(bomb() + "---\n" + good)
	t.Logf("the bomb is %d bytes", len(data))
	limits := Limits{}
	limits.defaults()
	var inputs, problems = 0, []string{}
	n := allocated(func() {
		in, ps := parseFile("bomb.yaml", data, "v", time.Unix(1, 0), limits)
		inputs = len(in)
		for _, p := range ps {
			problems = append(problems, p.Error())
		}
	})
	t.Logf("parsing it allocated %d KiB", n>>10)
	if len(problems) != 1 || !strings.Contains(problems[0], "bomb.yaml document 1") || !strings.Contains(problems[0], "expands to more than") {
		t.Errorf("problems %q, want document 1 refused for its expansion", problems)
	}
	if inputs != 1 {
		t.Errorf("%d documents read, want the file's other one", inputs)
	}
	if n > 64<<20 {
		t.Errorf("refusing the bomb allocated %d MiB", n>>20)
	}
}

// TestOversizedFileRefusedBeforeItIsRead: a file past --yaml-max-file-size
// is a problem that keeps what it held, and is not read.
func TestOversizedFileRefusedBeforeItIsRead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "big.yaml")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil { // 64 MiB, sparse
		t.Fatal(err)
	}
	f.Close()
	pc := &parsed{limits: Limits{MaxFileSize: 1 << 20}}
	pc.limits.defaults()
	var problems []string
	n := allocated(func() {
		_, ps, _ := pc.readFile(dir, path, time.Unix(1, 0))
		for _, p := range ps {
			problems = append(problems, p.Error()+" keep="+p.KeepLocation)
		}
	})
	if len(problems) != 1 || !strings.Contains(problems[0], "files of at most 1048576 are read") || !strings.HasSuffix(problems[0], "keep=big.yaml") {
		t.Errorf("problems %q", problems)
	}
	if n > 1<<20 {
		t.Errorf("refusing a 64 MiB file allocated %d KiB", n>>10)
	}
}
