package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
	got, err := parseKubeconfigs("east=" + path + ", west=" + path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].id != "east" || got[1].id != "west" || got[0].kube.Host != "https://127.0.0.1:6443" {
		t.Errorf("got %+v", got)
	}
	if one, err := parseKubeconfigs(path); err != nil || len(one) != 1 || one[0].id != "Kubernetes" {
		t.Errorf("a path alone: %+v %v, want cluster ID Kubernetes", one, err)
	}
	for list, want := range map[string]string{
		"a=" + path + ",a=" + path: `cluster ID "a" is given twice`,
		"a=/does/not/exist":        "--kubeconfig a=/does/not/exist",
	} {
		if _, err := parseKubeconfigs(list); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want it to say %q", list, err, want)
		}
	}
}

func TestFlags(t *testing.T) {
	for args, want := range map[string]string{
		"": "nothing to ingest",
		"--mesh-dir x --namespace-selector a==b=c": "--namespace-selector",
	} {
		err := run(context.Background(), strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want it to say %q", args, err, want)
		}
	}
}
