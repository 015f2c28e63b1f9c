package main

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/internal/version"
)

// bugReportPages are what a bug report asks every replica for, each kept
// as a file of the replica's folder: its readiness and why, its metrics,
// its proxies' state (pushers), its rejected inputs (ingesters), its weak
// settings, its log level and its goroutines. Never a config dump: no
// secret, no certificate, no key leaves the replica.
var bugReportPages = []struct{ file, path string }{
	{"readyz.txt", "/readyz"},
	{"metrics.txt", "/metrics"},
	{"syncz.json", "/debug/syncz"},
	{"problems.json", "/debug/problems"},
	{"security.json", "/debug/security"},
	{"loglevel.json", "/debug/loglevel"},
	{"goroutines.txt", "/debug/pprof/goroutine?debug=2"},
}

// bugReport writes an archive of what every replica says of itself, for
// a report of a problem: shardctl's version and the members, then a
// folder per replica. A page a replica does not serve is left out; a
// replica that does not answer is named in errors.txt.
func bugReport(ctx context.Context, o *options, args []string) error {
	if len(args) > 1 {
		return fmt.Errorf("want [<archive>], got %q", args)
	}
	name := fmt.Sprintf("shardpilot-bug-report-%s.tar.gz", time.Now().UTC().Format("20060102-150405"))
	if len(args) == 1 {
		name = args[0]
	}
	ms, err := o.find(ctx, "")
	if err != nil {
		return err
	}
	files := map[string][]byte{}
	var failures []string
	for i, m := range ms {
		folder := fmt.Sprintf("%s-%s", cmp.Or(m.Role, "replica"), safeName(cmp.Or(m.Name, fmt.Sprint(i))))
		for _, page := range bugReportPages {
			body, err := o.do(ctx, m, page.path)
			if err != nil {
				if !errors.Is(err, errNotServed) && !errors.Is(err, errNoPage) {
					failures = append(failures, fmt.Sprintf("%s %s: %v", folder, page.path, err))
				}
				continue
			}
			b, err := io.ReadAll(io.LimitReader(body, 64<<20))
			body.Close()
			if err != nil {
				failures = append(failures, fmt.Sprintf("%s %s: %v", folder, page.path, err))
				continue
			}
			files[path.Join(folder, page.file)] = b
		}
	}
	var members bytes.Buffer
	mo := *o
	mo.stdout, mo.output = &members, "yaml"
	if err := writeOutput(&mo, ms); err != nil {
		return err
	}
	files["members.yaml"] = members.Bytes()
	files["version.txt"] = []byte(version.String() + "\n")
	if len(failures) > 0 {
		files["errors.txt"] = []byte(strings.Join(failures, "\n") + "\n")
	}
	if err := writeArchive(name, files); err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "Wrote %s: %d replicas, %d files.\n", name, len(ms), len(files))
	if len(failures) > 0 {
		return fmt.Errorf("%d pages could not be read (errors.txt in the archive)", len(failures))
	}
	return nil
}

// writeArchive writes files into a gzipped tar at name, in order.
func writeArchive(name string, files map[string][]byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	zw := gzip.NewWriter(f)
	tw := tar.NewWriter(zw)
	now := time.Now()
	for _, file := range slices.Sorted(maps.Keys(files)) {
		b := files[file]
		if err := tw.WriteHeader(&tar.Header{Name: file, Mode: 0o600, Size: int64(len(b)), ModTime: now}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(b); err != nil {
			f.Close()
			return err
		}
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// safeName keeps a replica's name usable as a folder's.
func safeName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == ':' || r < ' ' {
			return '_'
		}
		return r
	}, s)
}
