package cli

import "testing"

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
