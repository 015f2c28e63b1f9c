package yamldir

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"go.yaml.in/yaml/v3"
	"golang.org/x/sync/errgroup"
)

// Syncer is what the source needs to write what it read.
type Syncer interface {
	Sync(ctx context.Context, objs []ingest.Object, problems []ingest.Problem) (ingest.Result, error)
	// Forget makes the next sync read the store again.
	Forget()
}

// Config configures a Source.
type Config struct {
	// Dir is the directory to read, recursively.
	Dir    string
	Syncer Syncer
	// Normalize configures the normalizer (domain suffix, default namespace, shard).
	Normalize istio.Options
	Log       *slog.Logger
	// Quiet is how long file events must stop before a reload. Default 10ms (see ingest.Loop).
	Quiet time.Duration
	// MaxDelay bounds how long an event waits for the quiet period. Default 100ms.
	MaxDelay time.Duration
	// Resync reloads even without file events, to repair drift. Default 5m.
	Resync time.Duration
	// RetryDelay is the pause before retrying a failed sync. Default 1s.
	RetryDelay time.Duration
	// OnSynced, when set, is called after every successful sync.
	OnSynced func(ingest.Result)
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return errors.New("yamldir: a directory is required")
	}
	st, err := os.Stat(c.Dir)
	if err != nil {
		return fmt.Errorf("yamldir: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("yamldir: %s is not a directory", c.Dir)
	}
	if c.Syncer == nil {
		return errors.New("yamldir: a syncer is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Quiet == 0 {
		c.Quiet = 10 * time.Millisecond
	}
	return nil
}

// Source watches a directory.
type Source struct {
	cfg    Config
	parsed parsed // owned by the sync loop
}

// New returns a Source.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Source{cfg: cfg}, nil
}

// Run syncs the directory, then again after every change, until ctx is done.
func (s *Source) Run(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("yamldir: watch %s: %w", s.cfg.Dir, err)
	}
	defer w.Close()
	loop := ingest.NewLoop(ingest.Loop{
		Quiet: s.cfg.Quiet, MaxDelay: s.cfg.MaxDelay, Resync: s.cfg.Resync, RetryDelay: s.cfg.RetryDelay, Log: s.cfg.Log.With("dir", s.cfg.Dir),
		Sync: func(ctx context.Context, full bool) error {
			// New subdirectories join the watch before they are read.
			if err := s.watchDirs(w); err != nil {
				s.cfg.Log.Warn("cannot watch the mesh directory", "dir", s.cfg.Dir, "err", err)
			}
			if full {
				s.cfg.Syncer.Forget()
			}
			return s.sync(ctx)
		},
	})
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return loop.Run(ctx) })
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case ev, ok := <-w.Events:
				if !ok {
					return errors.New("yamldir: watcher closed")
				}
				s.cfg.Log.Debug("file event", "event", ev.String())
				loop.Changed()
			case err, ok := <-w.Errors:
				if !ok {
					return errors.New("yamldir: watcher closed")
				}
				s.cfg.Log.Warn("file watcher error; reloading", "err", err)
				loop.Changed()
			}
		}
	})
	return g.Wait()
}

// watchDirs adds the directory and its subdirectories to the watcher;
// adding a directory twice is harmless.
func (s *Source) watchDirs(w *fsnotify.Watcher) error {
	return filepath.WalkDir(s.cfg.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != s.cfg.Dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return w.Add(path)
		}
		return nil
	})
}

func (s *Source) sync(ctx context.Context) error {
	inputs, problems, err := s.parsed.read(s.cfg.Dir, time.Now())
	if err != nil {
		return err
	}
	objs, more := istio.Normalize(inputs, s.cfg.Normalize)
	res, err := s.cfg.Syncer.Sync(ctx, objs, append(problems, more...))
	if err != nil {
		return err
	}
	s.cfg.Log.Info("mesh directory synced", "dir", s.cfg.Dir, "objects", len(objs),
		"written", res.Written, "deleted", res.Deleted, "unchanged", res.Unchanged, "problems", len(res.Problems))
	if s.cfg.OnSynced != nil {
		s.cfg.OnSynced(res)
	}
	return nil
}

// Read reads every YAML document below dir. A document that is not a
// resource, or a file that does not parse, is returned as a problem. It
// fails only when the directory itself cannot be read.
func Read(dir string, now time.Time) ([]istio.Input, []ingest.Problem, error) {
	return (&parsed{}).read(dir, now)
}

// parsed keeps each file's parse under its content hash, so that a sync
// parses only the files that changed: with thousands of files and a
// change every few milliseconds, parsing is most of a sync's cost.
type parsed struct {
	files map[string]parsedFile // by path
}

type parsedFile struct {
	sum      [32]byte
	inputs   []istio.Input
	problems []ingest.Problem
}

func (pc *parsed) read(dir string, now time.Time) ([]istio.Input, []ingest.Problem, error) {
	seen := map[string]parsedFile{}
	defer func() { pc.files = seen }()
	var inputs []istio.Input
	var problems []ingest.Problem
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == dir {
				return err
			}
			problems = append(problems, ingest.Problem{Location: rel(dir, path), Reason: err.Error(), KeepLocation: rel(dir, path)})
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") && path != dir {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() || !(strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			return nil
		}
		if !d.Type().IsRegular() {
			// A FIFO, socket or device would block the read (and the
			// source with it); a symbolic link may point at one.
			name := rel(dir, path)
			if info, err := os.Stat(path); err != nil || !info.Mode().IsRegular() {
				problems = append(problems, ingest.Problem{Location: name, Reason: "not a regular file; skipped", KeepLocation: name})
				return nil
			}
		}
		data, err := os.ReadFile(path)
		if err != nil {
			name := rel(dir, path)
			problems = append(problems, ingest.Problem{Location: name, Reason: err.Error() + "; its objects stay as they were", KeepLocation: name})
			return nil
		}
		sum := sha256.Sum256(data)
		f, ok := pc.files[path]
		if !ok || f.sum != sum {
			f.sum = sum
			f.inputs, f.problems = parseFile(rel(dir, path), data, hex.EncodeToString(sum[:8]), now)
		}
		seen[path] = f
		inputs = append(inputs, f.inputs...)
		problems = append(problems, f.problems...)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("yamldir: read %s: %w", dir, err)
	}
	return inputs, problems, nil
}

func rel(dir, path string) string {
	r, err := filepath.Rel(dir, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

// parseFile reads the documents of one file. A file that does not parse is
// one problem that keeps everything the file held before.
func parseFile(name string, data []byte, version string, now time.Time) ([]istio.Input, []ingest.Problem) {
	keepAll := func(reason string) []ingest.Problem {
		return []ingest.Problem{{Location: name, Reason: reason + "; its objects stay as they were", KeepLocation: name}}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var inputs []istio.Input
	var problems []ingest.Problem
	for doc := 1; ; doc++ {
		var node yaml.Node
		err := dec.Decode(&node)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, keepAll(fmt.Sprintf("document %d: malformed YAML: %v", doc, err))
		}
		loc := fmt.Sprintf("%s document %d", name, doc)
		var v any
		if err := node.Decode(&v); err != nil {
			problems = append(problems, ingest.Problem{Location: loc, KeepLocation: loc, Reason: "malformed YAML: " + err.Error()})
			continue
		}
		if v == nil {
			continue // an empty document, such as a trailing "---"
		}
		if _, ok := v.(map[string]any); !ok {
			problems = append(problems, ingest.Problem{Location: loc, KeepLocation: loc, Reason: fmt.Sprintf("line %d: a document must be a mapping with apiVersion, kind, metadata and spec", node.Line)})
			continue
		}
		raw, err := json.Marshal(v)
		if err != nil {
			problems = append(problems, ingest.Problem{Location: loc, KeepLocation: loc, Reason: "cannot convert to JSON: " + err.Error()})
			continue
		}
		var r istio.Resource
		if err := json.Unmarshal(raw, &r); err != nil {
			problems = append(problems, ingest.Problem{Location: loc, KeepLocation: loc, Reason: "not a Kubernetes-style resource: " + err.Error()})
			continue
		}
		inputs = append(inputs, istio.Input{Resource: r, Location: loc, SourceVersion: version, ObservedAt: now})
	}
	return inputs, problems
}
