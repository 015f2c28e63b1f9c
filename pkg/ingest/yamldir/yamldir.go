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
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"go.yaml.in/yaml/v3"
	"golang.org/x/sync/errgroup"
)

// Config configures a Source.
type Config struct {
	// Dir is the directory to read, recursively.
	Dir    string
	Syncer ingest.Writer
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
	// Limits bound what one file may cost to read (defaults: see Limits).
	Limits Limits
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
	c.Limits.defaults()
	return nil
}

// Source watches a directory.
type Source struct {
	cfg    Config
	parsed parsed // owned by the sync loop
	events events
}

// events collects what file events named since the last sync began, so
// that a sync reads only those files, and when: a change counts as
// observed when its first event came, not after the quiet period.
type events struct {
	mu    sync.Mutex
	paths map[string]time.Time // the first event's time, by path
	first time.Time            // the first event's, of any
	// all says an event the paths do not describe came: a directory
	// created or removed, or a watcher error (events may be lost).
	all bool
	// dirs are the directories watched.
	dirs map[string]bool
}

// note records an event and reports whether it may change anything.
func (e *events) note(dir string, ev fsnotify.Event) bool {
	name := rel(dir, ev.Name)
	if hidden(name) {
		return false
	}
	at := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case isYAML(ev.Name):
		if e.paths == nil {
			e.paths = map[string]time.Time{}
		}
		if _, ok := e.paths[ev.Name]; !ok {
			e.paths[ev.Name] = at
		}
	case ev.Has(fsnotify.Create):
		if st, err := os.Stat(ev.Name); err != nil || !st.IsDir() {
			return false // another file: not read
		}
		e.all = true
	case ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename):
		if !e.dirs[ev.Name] {
			return false
		}
		e.all = true
	default:
		return false
	}
	if e.first.IsZero() {
		e.first = at
	}
	return true
}

// lost says events may have been lost: the next sync reads everything.
func (e *events) lost() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.all = true
	if e.first.IsZero() {
		e.first = time.Now()
	}
}

// take returns the paths, whether to read everything, and when the first
// event came (zero: none), and starts over.
func (e *events) take() (map[string]time.Time, bool, time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	paths, all, first := e.paths, e.all, e.first
	e.paths, e.all, e.first = nil, false, time.Time{}
	return paths, all, first
}

func (e *events) watching(dirs map[string]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dirs = dirs
}

// hidden reports whether a path relative to the directory is skipped: a
// name in it starts with a dot.
func hidden(name string) bool {
	for part := range strings.SplitSeq(name, "/") {
		if strings.HasPrefix(part, ".") && part != "." && part != ".." {
			return true
		}
	}
	return false
}

func isYAML(path string) bool {
	return strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")
}

// New returns a Source.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Source{cfg: cfg, parsed: parsed{limits: cfg.Limits}}, nil
}

// Run syncs the directory, then again after every change, until ctx is done.
func (s *Source) Run(ctx context.Context) error {
	t, err := s.build()
	if err != nil {
		return err
	}
	defer t.w.Close()
	return t.run(ctx)
}

// term is one run of the source: its file watcher and its sync loop.
type term struct {
	*Source
	w    *fsnotify.Watcher
	loop *ingest.Loop
}

// build opens the file watcher and makes the sync loop; nothing is read
// until run starts the loop.
func (s *Source) build() (*term, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("yamldir: watch %s: %w", s.cfg.Dir, err)
	}
	t := &term{Source: s, w: w}
	t.loop = ingest.NewLoop(ingest.Loop{
		Writer: s.cfg.Syncer,
		Quiet:  s.cfg.Quiet, MaxDelay: s.cfg.MaxDelay, Resync: s.cfg.Resync, RetryDelay: s.cfg.RetryDelay, Log: s.cfg.Log.With("dir", s.cfg.Dir),
		Sync: t.sync,
	})
	return t, nil
}

// run runs the sync loop and hands it the watcher's events until ctx is
// done.
func (t *term) run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return t.loop.Run(ctx) })
	g.Go(func() error { return t.watch(ctx) })
	return g.Wait()
}

// sync reads the files the events named, or the whole directory.
func (t *term) sync(ctx context.Context, full bool) error {
	paths, all, first := t.events.take()
	if full {
		t.cfg.Syncer.Forget()
		first = time.Time{}
	}
	if !full && !all && t.parsed.files != nil {
		return t.syncFiles(ctx, paths)
	}
	// New subdirectories join the watch before they are read.
	if err := t.watchDirs(t.w); err != nil {
		t.cfg.Log.Warn("cannot watch the mesh directory", "dir", t.cfg.Dir, "err", err)
	}
	return t.readAll(ctx, first)
}

// watch notes the watcher's events and tells the loop of those that may
// change anything.
func (t *term) watch(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-t.w.Events:
			if !ok {
				return errors.New("yamldir: watcher closed")
			}
			t.cfg.Log.Debug("file event", "event", ev.String())
			if t.events.note(t.cfg.Dir, ev) {
				t.loop.Changed()
			}
		case err, ok := <-t.w.Errors:
			if !ok {
				return errors.New("yamldir: watcher closed")
			}
			t.cfg.Log.Warn("file watcher error; reloading", "err", err)
			t.events.lost()
			t.loop.Changed()
		}
	}
}

// watchDirs adds the directory and its subdirectories to the watcher;
// adding a directory twice is harmless.
func (s *Source) watchDirs(w *fsnotify.Watcher) error {
	dirs := map[string]bool{}
	defer s.events.watching(dirs)
	return filepath.WalkDir(s.cfg.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != s.cfg.Dir && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			dirs[path] = true
			return w.Add(path)
		}
		return nil
	})
}

// readAll reads the whole directory; what changed counts as observed at
// observed (zero: now).
func (s *Source) readAll(ctx context.Context, observed time.Time) error {
	if observed.IsZero() {
		observed = time.Now()
	}
	inputs, problems, err := s.parsed.read(s.cfg.Dir, observed)
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

// syncFiles syncs the files that events named: it reads only those, and
// syncs only what they hold. A change that other files' objects depend on
// (a WorkloadEntry, which joins the ServiceEntries that select it, or a
// name another file defines too) reads the whole directory instead.
func (s *Source) syncFiles(ctx context.Context, paths map[string]time.Time) error {
	type read struct {
		f        parsedFile
		problems []ingest.Problem
		exists   bool
	}
	reads := make(map[string]read, len(paths))
	for path, at := range paths {
		var r read
		r.f, r.problems, r.exists = s.parsed.readFile(s.cfg.Dir, path, at)
		if entangled(s.parsed.files[path].inputs) || entangled(r.f.inputs) || s.parsed.sharesNames(path, r.f.inputs) {
			return s.readAll(ctx, slices.MinFunc(slices.Collect(maps.Values(paths)), time.Time.Compare))
		}
		reads[path] = r
	}
	var part []string
	var inputs []istio.Input
	var problems []ingest.Problem
	for path, r := range reads {
		part = append(part, rel(s.cfg.Dir, path))
		problems = append(problems, r.problems...)
		if !r.exists || len(r.problems) > 0 {
			s.parsed.drop(path)
			continue
		}
		s.parsed.set(path, r.f)
		inputs = append(inputs, r.f.inputs...)
		problems = append(problems, r.f.problems...)
	}
	// ServiceEntries take their endpoints from the WorkloadEntries they
	// select, wherever those are.
	for path, wes := range s.parsed.workloads {
		if _, ok := paths[path]; !ok {
			inputs = append(inputs, wes...)
		}
	}
	objs, more := istio.Normalize(inputs, s.cfg.Normalize)
	for _, p := range more {
		if ingest.Covers(part, p.Location) {
			problems = append(problems, p)
		}
	}
	res, err := s.cfg.Syncer.SyncPart(ctx, part, objs, problems)
	if err != nil {
		return err
	}
	s.cfg.Log.Debug("mesh files synced", "files", len(paths), "objects", len(objs),
		"written", res.Written, "deleted", res.Deleted, "unchanged", res.Unchanged, "problems", len(res.Problems))
	if s.cfg.OnSynced != nil {
		s.cfg.OnSynced(res)
	}
	return nil
}

// entangled reports whether other files' objects depend on these inputs.
func entangled(inputs []istio.Input) bool {
	for _, in := range inputs {
		if in.Resource.Kind == istio.KindWorkloadEntry {
			return true
		}
	}
	return false
}

// Read reads every YAML document below dir. A document that is not a
// resource, or a file that does not parse, is returned as a problem. It
// fails only when the directory itself cannot be read.
func Read(dir string, now time.Time) ([]istio.Input, []ingest.Problem, error) {
	pc := &parsed{}
	pc.limits.defaults()
	return pc.read(dir, now)
}

// parsed keeps each file's parse under its content hash, so that a sync
// parses only the files that changed: with thousands of files and a
// change every few milliseconds, parsing is most of a sync's cost.
type parsed struct {
	files map[string]parsedFile // by path
	// names counts the resources of every file by identity, and workloads
	// holds each file's WorkloadEntries: both kept as files change, so
	// that syncing one file does not look at every other.
	names     map[string]int
	workloads map[string][]istio.Input
	limits    Limits
}

// set records what a file holds now.
func (pc *parsed) set(path string, f parsedFile) {
	pc.drop(path)
	if pc.files == nil {
		pc.files, pc.names, pc.workloads = map[string]parsedFile{}, map[string]int{}, map[string][]istio.Input{}
	}
	pc.files[path] = f
	for _, in := range f.inputs {
		pc.names[identity(in)]++
		if in.Resource.Kind == istio.KindWorkloadEntry {
			pc.workloads[path] = append(pc.workloads[path], in)
		}
	}
}

// drop forgets a file.
func (pc *parsed) drop(path string) {
	old, ok := pc.files[path]
	if !ok {
		return
	}
	for _, in := range old.inputs {
		id := identity(in)
		if pc.names[id]--; pc.names[id] <= 0 {
			delete(pc.names, id)
		}
	}
	delete(pc.workloads, path)
	delete(pc.files, path)
}

type parsedFile struct {
	sum      [32]byte
	inputs   []istio.Input
	problems []ingest.Problem
}

func (pc *parsed) read(dir string, now time.Time) ([]istio.Input, []ingest.Problem, error) {
	seen := map[string]parsedFile{}
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
		if d.IsDir() || !isYAML(path) {
			return nil
		}
		f, more, _ := pc.readFile(dir, path, now)
		problems = append(problems, more...)
		if len(more) == 0 {
			seen[path] = f
			inputs = append(inputs, f.inputs...)
			problems = append(problems, f.problems...)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("yamldir: read %s: %w", dir, err)
	}
	pc.files, pc.names, pc.workloads = nil, nil, nil
	for path, f := range seen {
		pc.set(path, f)
	}
	return inputs, problems, nil
}

// readFile reads one file, parsing it only when its content changed. It
// returns the file's parse, the problems that kept it from being read
// (which keep what it held before), and whether it exists.
func (pc *parsed) readFile(dir, path string, now time.Time) (parsedFile, []ingest.Problem, bool) {
	name := rel(dir, path)
	info, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return parsedFile{}, nil, false
	}
	if err == nil && !info.Mode().IsRegular() {
		// A FIFO, socket or device would block the read (and the source
		// with it); a symbolic link may point at one.
		return parsedFile{}, []ingest.Problem{{Location: name, Reason: "not a regular file; skipped", KeepLocation: name}}, true
	}
	var data []byte
	if err == nil {
		data, err = readLimited(path, info.Size(), pc.limits.MaxFileSize)
	}
	if err != nil {
		return parsedFile{}, []ingest.Problem{{Location: name, Reason: err.Error() + "; its objects stay as they were", KeepLocation: name}}, true
	}
	sum := sha256.Sum256(data)
	f, ok := pc.files[path]
	if !ok || f.sum != sum {
		f.sum = sum
		f.inputs, f.problems = parseFile(name, data, hex.EncodeToString(sum[:8]), now, pc.limits)
	}
	return f, nil, true
}

// sharesNames reports whether a resource of inputs, or of what path held
// before, has a kind, namespace and name that another file defines too:
// which of them is in effect is decided over the whole directory.
func (pc *parsed) sharesNames(path string, inputs []istio.Input) bool {
	mine := map[string]int{}
	for _, in := range pc.files[path].inputs {
		mine[identity(in)]++
	}
	for _, in := range slices.Concat(inputs, pc.files[path].inputs) {
		if pc.names[identity(in)] > mine[identity(in)] {
			return true
		}
	}
	return false
}

// identity names a resource by kind and name; the namespace, which a
// document may leave to the default, is left out, which errs on the side
// of reading everything.
func identity(in istio.Input) string {
	return in.Resource.Kind + "/" + in.Resource.Metadata.Name
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
func parseFile(name string, data []byte, version string, now time.Time, limits Limits) ([]istio.Input, []ingest.Problem) {
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
		if why := checkExpansion(&node, limits); why != "" {
			problems = append(problems, ingest.Problem{Location: loc, KeepLocation: loc, Reason: why + "; its objects stay as they were"})
			continue
		}
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
