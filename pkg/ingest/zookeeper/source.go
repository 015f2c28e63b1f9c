package zookeeper

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/url"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
)

// Config configures a Source.
type Config struct {
	// Ensemble names the ZooKeeper ensemble: the source is
	// "zookeeper/<Ensemble>", its endpoint shard "zookeeper-<Ensemble>".
	Ensemble string
	// Servers are the ensemble's host:port addresses.
	Servers []string
	// SessionTimeout is the ZooKeeper session timeout. Default 10s.
	SessionTimeout time.Duration
	// DubboRoots are the paths Dubbo registers under ("/dubbo", or the
	// registry group); CuratorRoots Curator's base paths ("/services").
	// nil means the default; empty, none.
	DubboRoots, CuratorRoots []string
	// Naming makes hostnames and namespaces; its Shard is set by New.
	Naming Naming
	Syncer ingest.Writer
	Log    *slog.Logger
	// Quiet, MaxDelay, Resync and RetryDelay pace the syncs (see ingest.Loop).
	Quiet, MaxDelay, Resync, RetryDelay time.Duration
	// OnSynced, when set, is called after every successful sync.
	OnSynced func(ingest.Result)
	// Readers bounds the reads in flight at once. Default 16.
	Readers int
}

// SourceName is the name an ensemble's objects carry as their origin source.
func SourceName(ensemble string) string { return "zookeeper/" + ensemble }

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Ensemble == "" || strings.ContainsAny(c.Ensemble, "/@ ") {
		return fmt.Errorf("zookeeper: ensemble ID %q: want a name without '/', '@' or spaces", c.Ensemble)
	}
	if len(c.Servers) == 0 {
		return fmt.Errorf("zookeeper: ensemble %s: no servers", c.Ensemble)
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.DubboRoots == nil {
		c.DubboRoots = []string{"/dubbo"}
	}
	if c.CuratorRoots == nil {
		c.CuratorRoots = []string{"/services"}
	}
	seen := map[string]bool{}
	for _, r := range slices.Concat(c.DubboRoots, c.CuratorRoots) {
		if !strings.HasPrefix(r, "/") || r != path.Clean(r) || r == "/" {
			return fmt.Errorf("zookeeper: root %q: want an absolute path below /, like /dubbo", r)
		}
		if seen[r] {
			return fmt.Errorf("zookeeper: root %q is given twice", r)
		}
		seen[r] = true
	}
	if len(seen) == 0 {
		return fmt.Errorf("zookeeper: ensemble %s: neither a Dubbo nor a Curator root to watch", c.Ensemble)
	}
	c.Naming.Shard = "zookeeper-" + c.Ensemble
	if err := c.Naming.defaults(); err != nil {
		return err
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Readers == 0 {
		c.Readers = 16
	}
	return nil
}

// Source watches one ensemble and syncs what it holds.
type Source struct {
	cfg   Config
	kinds map[string]string // root → "dubbo" or "curator"
}

// New returns a Source; Run connects and watches.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Syncer == nil {
		return nil, errors.New("zookeeper: a syncer is required")
	}
	s := &Source{cfg: cfg, kinds: map[string]string{}}
	for _, r := range cfg.DubboRoots {
		s.kinds[r] = "dubbo"
	}
	for _, r := range cfg.CuratorRoots {
		s.kinds[r] = "curator"
	}
	return s, nil
}

// Run watches the ensemble and syncs until ctx is done.
func (s *Source) Run(ctx context.Context) error {
	t, err := s.build()
	if err != nil {
		return err
	}
	defer t.conn.Close()
	return t.loop.Run(ctx)
}

// term is one run of the source: its connection to the ensemble, its
// sync loop, and what the watches it set say changed.
type term struct {
	*Source
	conn *zk.Conn
	loop *ingest.Loop

	mu sync.Mutex
	// session is the ZooKeeper session the watches belong to; armed holds
	// the paths it watches ("c" children, "e" existence, "d" data): the
	// client keeps a channel per watch call until the watch fires, so a
	// path already watched is read without one.
	session int64
	armed   map[string]bool
	roots   map[string]bool // roots whose children changed
	dirty   map[string]bool // units (root/name) that changed
	known   map[string]map[string]bool
}

// build makes the sync loop and connects (the client connects in the
// background, and its events reach the loop from then on); nothing is
// read until the loop runs.
func (s *Source) build() (*term, error) {
	t := &term{Source: s, armed: map[string]bool{}, roots: map[string]bool{}, dirty: map[string]bool{}, known: map[string]map[string]bool{}}
	t.loop = ingest.NewLoop(ingest.Loop{
		Writer: s.cfg.Syncer,
		Quiet:  s.cfg.Quiet, MaxDelay: s.cfg.MaxDelay, Resync: s.cfg.Resync, RetryDelay: s.cfg.RetryDelay,
		Log: s.cfg.Log, Sync: t.sync,
	})
	conn, _, err := zk.Connect(s.cfg.Servers, s.cfg.SessionTimeout, zk.WithLogger(zkLogger{s.cfg.Log}), zk.WithEventCallback(t.event))
	if err != nil {
		return nil, fmt.Errorf("zookeeper: ensemble %s: %w", s.cfg.Ensemble, err)
	}
	t.conn = conn
	return t, nil
}

// event notes what a ZooKeeper event changed. It runs on the client's
// receiving goroutine and never blocks.
func (s *term) event(ev zk.Event) {
	s.mu.Lock()
	changed := s.noteLocked(ev)
	s.mu.Unlock()
	if changed {
		s.loop.Changed()
	}
}

func (s *term) noteLocked(ev zk.Event) bool {
	switch ev.Type {
	case zk.EventSession:
		// A sync compares the session with the one its watches belong to.
		return ev.State == zk.StateHasSession
	case zk.EventNodeChildrenChanged, zk.EventNodeCreated, zk.EventNodeDeleted, zk.EventNodeDataChanged:
		for _, w := range []string{"c", "e", "d"} {
			delete(s.armed, w+ev.Path)
		}
		if _, ok := s.kinds[ev.Path]; ok {
			s.roots[ev.Path] = true
			return true
		}
		if u := s.unitOf(ev.Path); u != "" {
			s.dirty[u] = true
			return true
		}
	}
	return false
}

// unitOf returns the unit (root/name) a path lies in, "" if none.
func (s *Source) unitOf(p string) string {
	for root, kind := range s.kinds {
		rest, ok := strings.CutPrefix(p, root+"/")
		if !ok || rest == "" {
			continue
		}
		name, sub, _ := strings.Cut(rest, "/")
		if kind == "dubbo" && sub != "" && sub != "providers" && !strings.HasPrefix(sub, "providers/") {
			return "" // consumers, configurators, routers
		}
		return root + "/" + name
	}
	return ""
}

// sync reads what changed, or everything, and syncs it. Watches belong
// to a session: under a new one (the last expired) there are none, and
// everything is read again.
func (s *term) sync(ctx context.Context, full bool) error {
	id := s.conn.SessionID() // 0 while the client has none
	s.mu.Lock()
	if id != 0 && id != s.session {
		// The first session is recorded: the loop's first sync read
		// everything under it (its reads wait for one).
		if s.session != 0 {
			s.cfg.Log.Warn("new ZooKeeper session (the last one expired); reading the registry again", "ensemble", s.cfg.Ensemble)
			s.armed, full = map[string]bool{}, true
		}
		s.session = id
	}
	roots, dirty := s.roots, s.dirty
	s.roots, s.dirty = map[string]bool{}, map[string]bool{}
	s.mu.Unlock()
	if full {
		s.cfg.Syncer.Forget()
		return s.syncAll(ctx)
	}
	for root := range roots {
		names, err := s.list(root)
		if err != nil {
			return err // the retry reads everything
		}
		// New units are read; vanished ones are read as empty, which
		// removes them.
		for n := range names {
			if !s.known[root][n] {
				dirty[root+"/"+n] = true
			}
		}
		for n := range s.known[root] {
			if !names[n] {
				dirty[root+"/"+n] = true
			}
		}
		s.known[root] = names
	}
	if len(dirty) == 0 {
		return nil
	}
	units, err := s.readUnits(ctx, slices.Sorted(maps.Keys(dirty)))
	if err != nil {
		return err // the retry reads everything
	}
	var part []string
	for _, u := range units {
		part = append(part, u.location)
	}
	objs, problems, err := s.normalize(ctx, units)
	if err != nil {
		return err
	}
	res, err := s.cfg.Syncer.SyncPart(ctx, part, objs, problems)
	if err != nil {
		return err
	}
	s.cfg.Log.Debug("zookeeper changes synced", "units", len(units), "objects", len(objs),
		"written", res.Written, "deleted", res.Deleted, "unchanged", res.Unchanged, "problems", len(res.Problems))
	if s.cfg.OnSynced != nil {
		s.cfg.OnSynced(res)
	}
	return nil
}

func (s *term) syncAll(ctx context.Context) error {
	var names []string
	known := map[string]map[string]bool{}
	for _, root := range slices.Sorted(maps.Keys(s.kinds)) {
		children, err := s.list(root)
		if err != nil {
			return err
		}
		known[root] = children
		for n := range children {
			names = append(names, root+"/"+n)
		}
	}
	units, err := s.readUnits(ctx, names)
	if err != nil {
		return err
	}
	s.known = known
	objs, problems, err := s.normalize(ctx, units)
	if err != nil {
		return err
	}
	res, err := s.cfg.Syncer.Sync(ctx, objs, problems)
	if err != nil {
		return err
	}
	s.cfg.Log.Info("zookeeper synced", "ensemble", s.cfg.Ensemble, "units", len(units), "objects", len(objs),
		"written", res.Written, "deleted", res.Deleted, "unchanged", res.Unchanged, "problems", len(res.Problems))
	if s.cfg.OnSynced != nil {
		s.cfg.OnSynced(res)
	}
	return nil
}

func (s *term) normalize(ctx context.Context, units []*unit) ([]ingest.Object, []ingest.Problem, error) {
	now := time.Now()
	var storeErr error
	// A service keeps the port it has in the store (see unit.normalize).
	last := func(k model.Key) uint32 {
		o, err := s.cfg.Syncer.Stored(ctx, k)
		storeErr = cmp.Or(storeErr, err)
		if svc, ok := o.(*meshv1.Service); ok && len(svc.GetPorts()) > 0 {
			return svc.GetPorts()[0].GetNumber()
		}
		return 0
	}
	var objs []ingest.Object
	var problems []ingest.Problem
	for _, u := range units {
		o, p := u.normalize(&s.cfg.Naming, now, last)
		objs = append(objs, o...)
		problems = append(problems, p...)
	}
	return objs, problems, storeErr
}

// list returns a root's children and watches them; a root that does not
// exist yet is watched for its creation.
func (s *term) list(root string) (map[string]bool, error) {
	children, err := s.children(root)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(children))
	for _, c := range children {
		out[c] = true
	}
	return out, nil
}

func (s *term) readErr(p string, err error) error {
	return fmt.Errorf("zookeeper: ensemble %s: read %s: %w", s.cfg.Ensemble, p, err)
}

// readUnits reads units (root/name) in parallel.
func (s *term) readUnits(ctx context.Context, names []string) ([]*unit, error) {
	units := make([]*unit, len(names))
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(s.cfg.Readers)
	for i, n := range names {
		g.Go(func() error {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			root, name := path.Split(n)
			root = strings.TrimSuffix(root, "/")
			var err error
			if s.kinds[root] == "dubbo" {
				units[i], err = s.readDubbo(root, name)
			} else {
				units[i], err = s.readCurator(root, name)
			}
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return units, nil
}

func (s *Source) location(root, name string) string {
	return s.cfg.Ensemble + ":" + root + "/" + name
}

// readDubbo reads an interface's providers and watches them.
func (s *term) readDubbo(root, iface string) (*unit, error) {
	u := &unit{service: strings.ToLower(iface), kind: "dubbo", location: s.location(root, iface)}
	p := root + "/" + iface + "/providers"
	nodes, err := s.children(p)
	if err != nil {
		return nil, err
	}
	for _, node := range nodes {
		where := u.location + " providers/" + node
		in, err := parseProvider(iface, node, &s.cfg.Naming)
		if err != nil {
			u.problems = append(u.problems, ingest.Problem{Location: where, Resource: u.resource(), Reason: err.Error()})
			continue
		}
		in.node = where
		u.instances = append(u.instances, in)
	}
	return u, nil
}

// readCurator reads a Curator service's instances and watches them.
func (s *term) readCurator(root, name string) (*unit, error) {
	u := &unit{service: strings.ToLower(name), kind: "curator", location: s.location(root, name)}
	p := root + "/" + name
	ids, err := s.children(p)
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		where := u.location + " " + id
		data, err := s.getW(p + "/" + id)
		if errors.Is(err, zk.ErrNoNode) {
			continue // gone since listed: its parent's watch says so
		}
		if err != nil {
			return nil, s.readErr(p+"/"+id, err)
		}
		in, err := parseCurator(data, &s.cfg.Naming)
		if err != nil {
			u.problems = append(u.problems, ingest.Problem{Location: where, Resource: u.resource(), Reason: err.Error()})
			continue
		}
		in.node = where
		u.instances = append(u.instances, in)
	}
	return u, nil
}

// children lists a node's children, sorted, and watches them; a node that
// does not exist has none, and is watched for its creation.
func (s *term) children(p string) ([]string, error) {
	for {
		nodes, err := s.childrenW(p)
		if errors.Is(err, zk.ErrNoNode) {
			exists, err := s.existsW(p)
			if err != nil {
				return nil, s.readErr(p, err)
			}
			if exists {
				continue
			}
			return nil, nil
		}
		if err != nil {
			return nil, s.readErr(p, err)
		}
		slices.Sort(nodes)
		return nodes, nil
	}
}

// arm says whether a watch of kind w on p must be set: it is marked
// before the call that sets it, so that its event, which clears the mark,
// cannot come first.
func (s *term) arm(w, p string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.armed[w+p] {
		return false
	}
	s.armed[w+p] = true
	return true
}

func (s *term) disarm(w, p string) {
	s.mu.Lock()
	delete(s.armed, w+p)
	s.mu.Unlock()
}

// watched reads p, setting a watch of kind w unless one is set already.
func watched[T any](s *term, w, p string, read func() (T, error), readWatch func() (T, error)) (T, error) {
	if !s.arm(w, p) {
		return read()
	}
	v, err := readWatch()
	if err != nil {
		s.disarm(w, p)
	}
	return v, err
}

func (s *term) childrenW(p string) ([]string, error) {
	return watched(s, "c", p,
		func() ([]string, error) { nodes, _, err := s.conn.Children(p); return nodes, err },
		func() ([]string, error) { nodes, _, _, err := s.conn.ChildrenW(p); return nodes, err })
}

func (s *term) existsW(p string) (bool, error) {
	return watched(s, "e", p,
		func() (bool, error) { ok, _, err := s.conn.Exists(p); return ok, err },
		func() (bool, error) { ok, _, _, err := s.conn.ExistsW(p); return ok, err })
}

func (s *term) getW(p string) ([]byte, error) {
	return watched(s, "d", p,
		func() ([]byte, error) { data, _, err := s.conn.Get(p); return data, err },
		func() ([]byte, error) { data, _, _, err := s.conn.GetW(p); return data, err })
}

// zkLogger sends the ZooKeeper client's messages to the log, at debug
// level: connection churn is reported by the syncs that fail.
type zkLogger struct{ log *slog.Logger }

func (l zkLogger) Printf(format string, args ...any) {
	l.log.Debug("zookeeper client: " + fmt.Sprintf(format, args...))
}

// ProviderNode returns the node name Dubbo registers a provider URL under.
func ProviderNode(providerURL string) string { return url.QueryEscape(providerURL) }
