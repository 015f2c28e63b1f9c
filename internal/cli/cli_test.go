package cli

import (
	"os"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"1024": 1024, "512Mi": 512 << 20, "2Gi": 2 << 30, "2GiB": 2 << 30, " 64Ki ": 64 << 10} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "-1Mi", "12Gx", "1.5Gi", "Mi", "99999999999Ti"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) succeeded, want an error", bad)
		}
	}
}

// TestAdminToken: the token file is read and trimmed; a missing file or a
// short token is refused with the flag's name.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/good"
	short := dir + "/short"
	if err := os.WriteFile(good, []byte("0123456789abcdef-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := (&Common{AdminTokenFile: good}).AdminToken(); err != nil || tok != "0123456789abcdef-token" {
		t.Errorf("good token: %q %v", tok, err)
	}
	if tok, err := (&Common{}).AdminToken(); err != nil || tok != "" {
		t.Errorf("no file: %q %v", tok, err)
	}
	for _, f := range []string{short, dir + "/missing"} {
		if _, err := (&Common{AdminTokenFile: f}).AdminToken(); err == nil || !strings.Contains(err.Error(), "--admin-token-file") {
			t.Errorf("%s: %v, want an error naming the flag", f, err)
		}
	}
}
