// Command ociimage writes a one-layer image on an empty base as an OCI
// image-layout archive, which containerd imports without a registry or a
// Docker daemon (ctr -n k8s.io images import, kind load image-archive); it
// also holds docker save's manifest.json (docker load, crane push). It is how make image builds
// the project's image for a local cluster: static binaries, a passwd entry
// for the non-root user, and an empty /tmp, as the Dockerfile's distroless
// base has them. The archive is reproducible: every time in it is the
// Unix epoch, so the same files give the same digest.
//
//	ociimage -tag ghcr.io/shardpilot/shardpilot:0.1.0 -out image.tar \
//	  -file /pusher=.bin/pusher -file /ingester=.bin/ingester \
//	  -entrypoint /pusher -user 65532:65532 -label org.opencontainers.image.revision=abc
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// pairs is a repeatable name=value flag.
type pairs []string

func (p *pairs) String() string { return strings.Join(*p, ",") }

func (p *pairs) Set(v string) error {
	if !strings.Contains(v, "=") {
		return fmt.Errorf("%q is not name=value", v)
	}
	*p = append(*p, v)
	return nil
}

func main() {
	var files, labels, env pairs
	tag := flag.String("tag", "", "the image's name and tag, as the pods name it (registry/repository:tag)")
	out := flag.String("out", "", "the archive to write")
	entrypoint := flag.String("entrypoint", "", "the entrypoint, its words separated by commas")
	user := flag.String("user", "", "the user the image runs as (uid:gid); it gets a passwd entry")
	flag.Var(&files, "file", "a file of the image: /path/in/image=local/file (repeatable); written executable")
	flag.Var(&labels, "label", "a label of the image's configuration: name=value (repeatable)")
	flag.Var(&env, "env", "an environment variable: NAME=value (repeatable); PATH=/ is set unless given")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "Usage: ociimage -tag NAME:TAG -out FILE -file /dst=src... [flags]\n\n"+
			"Writes a one-layer image on an empty base as an OCI image-layout archive for\n"+
			"ctr images import. Flags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := run(*tag, *out, *entrypoint, *user, files, labels, env); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(tag, out, entrypoint, user string, files, labels, env pairs) error {
	switch {
	case tag == "" || !strings.Contains(tag, ":"):
		return errors.New("-tag must name the image with its tag (registry/repository:tag)")
	case out == "":
		return errors.New("-out must name the archive to write")
	case len(files) == 0:
		return errors.New("the image has no file: give at least one -file /dst=src")
	}
	layer, err := layerOf(files, user)
	if err != nil {
		return err
	}
	config, err := configOf(layer, entrypoint, user, labels, env)
	if err != nil {
		return err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer)},
	})
	if err != nil {
		return err
	}
	md := descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
	md["platform"] = map[string]string{"os": "linux", "architecture": "amd64"}
	md["annotations"] = map[string]string{
		"io.containerd.image.name":          tag,
		"org.opencontainers.image.ref.name": tag[strings.LastIndex(tag, ":")+1:],
	}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []any{md},
	})
	if err != nil {
		return err
	}
	// manifest.json as docker save writes it, beside the OCI layout, so that
	// docker load and crane push read the archive too.
	dockerManifest, err := json.Marshal([]map[string]any{{
		"Config":   blobPath(config),
		"RepoTags": []string{tag},
		"Layers":   []string{blobPath(layer)},
	}})
	if err != nil {
		return err
	}
	var archive bytes.Buffer
	w := tar.NewWriter(&archive)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{"manifest.json", dockerManifest},
		{blobPath(layer), layer},
		{blobPath(config), config},
		{blobPath(manifest), manifest},
	}
	if err := w.WriteHeader(dirHeader("blobs/")); err != nil {
		return err
	}
	if err := w.WriteHeader(dirHeader("blobs/sha256/")); err != nil {
		return err
	}
	for _, e := range entries {
		if err := writeFile(w, e.name, 0o644, e.data); err != nil {
			return err
		}
	}
	if err := w.Close(); err != nil {
		return err
	}
	if err := os.WriteFile(out+".tmp", archive.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		return err
	}
	fmt.Printf("%s %s sha256:%s (%d bytes)\n", out, tag, digest(manifest), archive.Len())
	return nil
}

// layerOf is the uncompressed layer: the files, executable, their
// folders, /tmp (1777) and, for a user, /etc/passwd and /etc/group.
func layerOf(files pairs, user string) ([]byte, error) {
	content := map[string][]byte{}
	for _, f := range files {
		dst, src, _ := strings.Cut(f, "=")
		if !path.IsAbs(dst) || path.Clean(dst) != dst || dst == "/" {
			return nil, fmt.Errorf("-file %s: the path in the image must be absolute and clean", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, fmt.Errorf("-file %s: %w", f, err)
		}
		content[dst[1:]] = data
	}
	extra := map[string][]byte{}
	if user != "" {
		uid, gid, ok := strings.Cut(user, ":")
		if !ok || uid == "" || gid == "" || strings.ContainsAny(user, "\n ") {
			return nil, fmt.Errorf("-user %q is not uid:gid", user)
		}
		extra["etc/passwd"] = fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n", uid, gid)
		extra["etc/group"] = fmt.Appendf(nil, "root:x:0:\nnonroot:x:%s:\n", gid)
	}
	dirs := map[string]bool{"tmp/": true}
	for name := range content {
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			dirs[d+"/"] = true
		}
	}
	for name := range extra {
		dirs[path.Dir(name)+"/"] = true
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, d := range names {
		h := dirHeader(d)
		if d == "tmp/" {
			h.Mode = 0o1777
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	names = names[:0]
	for name := range content {
		names = append(names, name)
	}
	for name := range extra {
		if _, dup := content[name]; dup {
			return nil, fmt.Errorf("-file /%s: the image writes it for -user", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if data, ok := content[name]; ok {
			if err := writeFile(w, name, 0o755, data); err != nil {
				return nil, err
			}
			continue
		}
		if err := writeFile(w, name, 0o644, extra[name]); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func configOf(layer []byte, entrypoint, user string, labels, env pairs) ([]byte, error) {
	vars := []string(env)
	hasPath := false
	for _, e := range vars {
		hasPath = hasPath || strings.HasPrefix(e, "PATH=")
	}
	if !hasPath {
		vars = append([]string{"PATH=/"}, vars...)
	}
	lm := map[string]string{}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		lm[k] = v
	}
	cfg := map[string]any{"Env": vars, "Labels": lm}
	if entrypoint != "" {
		cfg["Entrypoint"] = strings.Split(entrypoint, ",")
	}
	if user != "" {
		cfg["User"] = user
	}
	return json.Marshal(map[string]any{
		"created":      time.Unix(0, 0).UTC(),
		"architecture": "amd64",
		"os":           "linux",
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + digest(layer)}},
	})
}

func descriptor(mediaType string, data []byte) map[string]any {
	return map[string]any{"mediaType": mediaType, "digest": "sha256:" + digest(data), "size": len(data)}
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func blobPath(data []byte) string { return "blobs/sha256/" + digest(data) }

func dirHeader(name string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
}

func writeFile(w *tar.Writer, name string, mode int64, data []byte) error {
	h := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: time.Unix(0, 0), Format: tar.FormatPAX}
	if err := w.WriteHeader(h); err != nil {
		return err
	}
	_, err := io.Copy(w, bytes.NewReader(data))
	return err
}
