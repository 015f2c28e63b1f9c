// Package baseline serves a mesh the way a team would with
// go-control-plane's snapshot cache alone: one snapshot per node, rebuilt
// for every node whenever the mesh changes. It reads the same YAML
// directory as shardpilot's source and generates the same resources (once
// per change, shared by every node's snapshot: a team's first
// optimisation), so that a load test compares the serving architecture,
// not the configuration.
//
// Server.Run returns after the gRPC server and the directory watch have stopped.
package baseline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// Config configures a Server.
type Config struct {
	// Dir is the mesh directory.
	Dir string
	// Quiet is how long the directory must be still before it is read
	// again, and MaxDelay the longest a change waits for that; defaults
	// 100ms and 500ms, as shardpilot's sources.
	Quiet, MaxDelay time.Duration
	Log             *slog.Logger
}

// Server is the baseline control plane.
type Server struct {
	cfg   Config
	cache cachev3.SnapshotCache

	mu        sync.Mutex
	nodes     map[string]bool
	resources map[string][]types.Resource
	version   int
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("baseline: a mesh directory is required")
	}
	if cfg.Quiet == 0 {
		cfg.Quiet = 100 * time.Millisecond
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = 500 * time.Millisecond
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil), nodes: map[string]bool{}}, nil
}

// Run serves ADS on lis and follows the directory until ctx is done.
func (s *Server) Run(ctx context.Context, lis net.Listener) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("baseline: watch: %w", err)
	}
	defer w.Close()
	if err := w.Add(s.cfg.Dir); err != nil {
		return fmt.Errorf("baseline: watch %s: %w", s.cfg.Dir, err)
	}
	gs := grpc.NewServer()
	xs := serverv3.NewServer(ctx, s.cache, serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
			s.connected(ctx, r.GetNode())
			return nil
		},
		StreamDeltaRequestFunc: func(_ int64, r *discovery.DeltaDiscoveryRequest) error {
			s.connected(ctx, r.GetNode())
			return nil
		},
	})
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xs)

	// Like shardpilot's sources: reload once the directory is quiet, or
	// MaxDelay after the first change at the latest.
	// ADS is served once the first reload has the mesh.
	loaded := make(chan struct{})
	var once sync.Once
	load := func(ctx context.Context, _ bool) error {
		if err := s.reload(ctx); err != nil {
			return err
		}
		once.Do(func() { close(loaded) })
		return nil
	}
	loop := ingest.NewLoop(ingest.Loop{Sync: load, Quiet: s.cfg.Quiet, MaxDelay: s.cfg.MaxDelay, Log: s.cfg.Log})
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return loop.Run(ctx) })
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case err := <-w.Errors:
				s.cfg.Log.Warn("directory watch", "err", err)
				loop.Changed()
			case <-w.Events:
				loop.Changed()
			}
		}
	})
	g.Go(func() error {
		select {
		case <-ctx.Done():
			lis.Close()
			return nil
		case <-loaded:
		}
		if err := gs.Serve(lis); err != nil {
			return fmt.Errorf("baseline: serve: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		gs.Stop()
		return nil
	})
	return g.Wait()
}

// connected gives a node seen for the first time its snapshot.
func (s *Server) connected(ctx context.Context, node *core.Node) {
	if node == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[node.Id] {
		return
	}
	s.nodes[node.Id] = true
	s.setLocked(ctx, node.Id)
}

// reload reads the directory, generates the mesh's resources and sets
// every node's snapshot.
func (s *Server) reload(ctx context.Context) error {
	inputs, _, err := yamldir.Read(s.cfg.Dir, time.Now())
	if err != nil {
		return err
	}
	objs, _ := istio.Normalize(inputs, istio.Options{})
	items := make([]model.Stored, 0, len(objs))
	for _, o := range objs {
		items = append(items, model.Stored{Key: o.Key, Object: o.Object, ModRevision: 1})
	}
	m := meshbuild.MeshOf(items)
	res := map[string][]types.Resource{}
	for _, c := range generate.Clusters(m, generate.Envoy) {
		res[resource.ClusterType] = append(res[resource.ClusterType], c)
	}
	for _, c := range generate.LoadAssignments(m) {
		res[resource.EndpointType] = append(res[resource.EndpointType], c)
	}
	for _, l := range generate.Listeners(m, generate.Envoy, nil) {
		res[resource.ListenerType] = append(res[resource.ListenerType], l)
	}
	for _, r := range generate.Routes(m, generate.Envoy) {
		res[resource.RouteType] = append(res[resource.RouteType], r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resources = res
	s.version++
	for id := range s.nodes {
		s.setLocked(ctx, id)
	}
	return nil
}

func (s *Server) setLocked(ctx context.Context, id string) {
	snap, err := cachev3.NewSnapshot(strconv.Itoa(s.version), s.resources)
	if err != nil {
		s.cfg.Log.Error("snapshot", "node", id, "err", err)
		return
	}
	if err := s.cache.SetSnapshot(ctx, id, snap); err != nil {
		s.cfg.Log.Error("set snapshot", "node", id, "err", err)
	}
}
