package cli

import (
	"flag"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
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

// TestAdminToken: the token file is read and trimmed; a missing file, a
// short token or a repetitive one is refused with the flag's name.
func TestAdminToken(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/good"
	short := dir + "/short"
	weak := dir + "/weak"
	if err := os.WriteFile(weak, []byte(strings.Repeat("a", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tok, err := (&Common{AdminTokenFile: good}).AdminToken(); err != nil || tok != "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" {
		t.Errorf("good token: %q %v", tok, err)
	}
	if tok, err := (&Common{}).AdminToken(); err != nil || tok != "" {
		t.Errorf("no file: %q %v", tok, err)
	}
	for _, f := range []string{short, weak, dir + "/missing"} {
		if _, err := (&Common{AdminTokenFile: f}).AdminToken(); err == nil || !strings.Contains(err.Error(), "--admin-token-file") {
			t.Errorf("%s: %v, want an error naming the flag", f, err)
		}
	}
}

// TestAdvertised: the flag wins; a listener bound to an IP advertises it;
// one bound to every interface advertises the host name.
func TestAdvertised(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	_, port, _ := net.SplitHostPort(lis.Addr().String())
	if got := Advertised("", lis); got != "127.0.0.1:"+port {
		t.Errorf("bound to loopback: %s", got)
	}
	if got := Advertised("10.1.2.3", lis); got != "10.1.2.3:"+port {
		t.Errorf("--advertise-host: %s", got)
	}
	all, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	host, _ := os.Hostname()
	_, port, _ = net.SplitHostPort(all.Addr().String())
	if got := Advertised("", all); got != net.JoinHostPort(host, port) {
		t.Errorf("bound to every interface: %s, want the host name %s", got, host)
	}
}

// TestParseArgs: flags before, between and after the arguments; "--" ends
// the flags; twins fill what the command line left out.
func TestParseArgs(t *testing.T) {
	t.Setenv("SHARDPILOT_TIMEOUT", "7s")
	fs := flag.NewFlagSet("shardctl", flag.ContinueOnError)
	out := fs.String("output", "table", "")
	timeout := fs.Duration("timeout", time.Second, "")
	args, err := ParseArgs(fs, "", []string{"proxy-config", "--output", "json", "p1", "clusters", "--", "-x"})
	if err != nil || strings.Join(args, " ") != "proxy-config p1 clusters -x" || *out != "json" || *timeout != 7*time.Second {
		t.Errorf("ParseArgs: %q %v, output %s, timeout %s", args, err, *out, *timeout)
	}
	fs = flag.NewFlagSet("shardctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if _, err := ParseArgs(fs, "", []string{"a", "--nope"}); err == nil {
		t.Error("an unknown flag after an argument was accepted")
	}
}
