package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readArchive returns the archive's files by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	r := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := r.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(r)
		files[h.Name] = data
	}
}

// TestImage: the archive is an OCI layout and a docker save manifest
// naming one image with the files, the user and the entrypoint given; the
// same input gives the same bytes.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "app")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "image.tar")
	build := func() []byte {
		if err := run("example.com/app:1.2", out, "/app", "65532:65532", pairs{"/app=" + bin}, pairs{"org.opencontainers.image.revision=abc"}, nil); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(out)
		return b
	}
	first := build()
	if !bytes.Equal(first, build()) {
		t.Error("the same input gave another archive")
	}
	files := readArchive(t, out)
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
			Platform    map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != "example.com/app:1.2" || m.Annotations["org.opencontainers.image.ref.name"] != "1.2" || m.Platform["os"] != "linux" {
		t.Errorf("the index's manifest: %+v", m)
	}
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(m.Digest, "sha256:")], &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("the manifest: %v", err)
	}
	var config struct {
		OS     string
		Config struct {
			Entrypoint []string
			User       string
			Env        []string
			Labels     map[string]string
		}
	}
	if err := json.Unmarshal(files["blobs/sha256/"+strings.TrimPrefix(manifest.Config.Digest, "sha256:")], &config); err != nil {
		t.Fatal(err)
	}
	if config.OS != "linux" || config.Config.User != "65532:65532" || strings.Join(config.Config.Entrypoint, " ") != "/app" ||
		config.Config.Labels["org.opencontainers.image.revision"] != "abc" || config.Config.Env[0] != "PATH=/" {
		t.Errorf("the config: %+v", config)
	}
	var docker []struct {
		Config           string
		RepoTags, Layers []string
	}
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil || len(docker) != 1 || docker[0].RepoTags[0] != "example.com/app:1.2" ||
		docker[0].Config != "blobs/sha256/"+strings.TrimPrefix(manifest.Config.Digest, "sha256:") {
		t.Errorf("manifest.json: %v %s", err, files["manifest.json"])
	}
	layer := tar.NewReader(bytes.NewReader(files["blobs/sha256/"+strings.TrimPrefix(manifest.Layers[0].Digest, "sha256:")]))
	modes := map[string]int64{}
	content := map[string]string{}
	for {
		h, err := layer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		modes[h.Name] = h.Mode
		b, _ := io.ReadAll(layer)
		content[h.Name] = string(b)
	}
	if modes["tmp/"] != 0o1777 || modes["app"] != 0o755 || content["app"] != "#!binary" || !strings.Contains(content["etc/passwd"], "nonroot:x:65532:65532") {
		t.Errorf("the layer: modes %v, passwd %q", modes, content["etc/passwd"])
	}
}

// TestRefused: what the image cannot be is said.
func TestRefused(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "x.tar")
	for _, c := range []struct {
		tag, user string
		files     pairs
		says      string
	}{
		{"notag", "", pairs{"/a=" + out}, "-tag"},
		{"a:1", "", nil, "no file"},
		{"a:1", "", pairs{"rel=" + out}, "absolute"},
		{"a:1", "", pairs{"/a=" + filepath.Join(dir, "missing")}, "missing"},
		{"a:1", "65532", pairs{"/a=" + out}, "uid:gid"},
	} {
		os.WriteFile(out, nil, 0o644)
		err := run(c.tag, out, "", c.user, c.files, nil, nil)
		if err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%+v: %v, want an error saying %q", c, err, c.says)
		}
	}
}
