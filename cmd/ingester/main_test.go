package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/testutil"
)

const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:6443", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func TestParseKubeconfigs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := parseKubeconfigs("east="+path+", west="+path, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].id != "east" || got[1].id != "west" || got[0].kube.Host != "https://127.0.0.1:6443" {
		t.Errorf("got %+v", got)
	}
	if one, err := parseKubeconfigs(path, true); err != nil || len(one) != 1 || one[0].id != "Kubernetes" {
		t.Errorf("a path alone: %+v %v, want cluster ID Kubernetes", one, err)
	}
	for list, want := range map[string]string{
		"a=" + path + ",a=" + path: `cluster ID "a" is given twice`,
		"a=/does/not/exist":        "--kubeconfig a=/does/not/exist",
	} {
		if _, err := parseKubeconfigs(list, true); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to say %q", list, err, want)
		}
	}
}

func TestParseEnsembles(t *testing.T) {
	got, err := parseEnsembles("east=zk1:2181, zk2:2181; west=10.0.0.1:2181")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Ensemble != "east" || len(got[0].Servers) != 2 || got[1].Servers[0] != "10.0.0.1:2181" {
		t.Errorf("got %+v", got)
	}
	for list, want := range map[string]string{
		"zk1:2181":              "want <id>=<host:port>",
		"a=zk1:2181;a=zk2:2181": `ensemble ID "a" is given twice`,
		"a=zk1":                 `server "zk1": want host:port`,
	} {
		if _, err := parseEnsembles(list); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to say %q", list, err, want)
		}
	}
}

func TestFlags(t *testing.T) {
	for args, want := range map[string]string{
		"": "nothing to ingest",
		"--mesh-dir x --namespace-selector a==b=c":                                  "--namespace-selector",
		"--zookeeper a=zk:2181 --zookeeper-dubbo-roots dubbo":                       `--zookeeper a: zookeeper: root "dubbo"`,
		"--zookeeper a=zk:2181 --zookeeper-host-template {namespace}.x":             "it must contain {service}",
		"--zookeeper a=zk:2181 --zookeeper-namespace Bad.NS":                        `namespace "Bad.NS" is not a DNS label`,
		"--zookeeper a=zk:2181 --zookeeper-dubbo-roots= --zookeeper-curator-roots=": "neither a Dubbo nor a Curator root",
	} {
		err := run(context.Background(), strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want it to say %q", args, err, want)
		}
	}
}

// TestInjectFlags: the webhook's flags go together, and an address that is
// no host:port is refused before anything starts.
func TestInjectFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--inject-discovery-address", "sp:15012"}, "give --inject-addr too"},
		{[]string{"--inject-addr", ":0"}, "give --inject-cert-file, --inject-key-file and --inject-discovery-address"},
		{[]string{"--inject-addr", ":0", "--inject-cert-file", "c.pem", "--inject-key-file", "k.pem", "--inject-discovery-address", "sp-xds-{namespace}"},
			"--inject-discovery-address"},
	} {
		err := run(context.Background(), append(c.args, "--mesh-dir", t.TempDir(), "--etcd-endpoints", "http://127.0.0.1:1", "--log-level", "error"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ingester %q: %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// TestCheckFlags: --check-flags checks the flags as a start would, without
// reading a file or starting anything, and exits 0 when they would start.
func TestCheckFlags(t *testing.T) {
	ok := []string{"--check-flags", "--kubeconfig", "east=/nowhere/kubeconfig,west=in-cluster", "--bus-signing-key-file", "/nowhere/key.pem",
		"--etcd-endpoints", "http://127.0.0.1:1", "--admin-token-file", "/nowhere/token"}
	if err := run(context.Background(), ok); err != nil {
		t.Errorf("%q: %v, want the flags taken (no file read)", ok, err)
	}
	for args, want := range map[string]string{
		"--check-flags": "nothing to ingest",
		"--check-flags --mesh-dir x --kube-qps 0":             "--kube-qps 0",
		"--check-flags --kubeconfig a=x,a=y":                  `cluster ID "a" is given twice`,
		"--check-flags --kubeconfig a=":                       "--kubeconfig a=: no path",
		"--check-flags --mesh-dir x --inject-addr :0":         "give --inject-cert-file",
		"--check-flags --mesh-dir x --kube-namespace-parts 0": "--kube-namespace-parts 0",
	} {
		if err := run(context.Background(), strings.Fields(args)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want it to say %q", args, err, want)
		}
	}
}

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }
