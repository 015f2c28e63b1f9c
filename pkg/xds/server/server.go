package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
	"unique"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	gcpcache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	xds "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// Config configures a Server.
type Config struct {
	Cache gcpcache.Cache
	Log   *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// DrainTimeout bounds the graceful stop. Default 10s.
	DrainTimeout time.Duration
	// GRPCOptions are added to the gRPC server's options (TLS credentials, for one).
	GRPCOptions []grpc.ServerOption
	// Status, when set, records each stream's sent, ACKed and NACKed versions.
	Status *Status
	// MaxConnectionAge closes a proxy's connection after this long (with a
	// grace period for the stream to move), so that load rebalances across
	// replicas as they scale. Default 30m; negative disables.
	MaxConnectionAge time.Duration
	// Convergence, when set, learns which generations each ACK confirms:
	// Epoch numbers the generation a response is sent from, and Confirmed
	// is told of the epochs (from, to] an ACK of a type newly confirms.
	Convergence Convergence
	// Register, when set, registers more services on the xDS gRPC server
	// (Envoy's client status discovery service, for one).
	Register func(grpc.ServiceRegistrar)
	// MaxConcurrentPushes bounds how many responses are written at once
	// across all streams; the rest wait (shardpilot_pusher_xds_push_queue_seconds).
	// Default 100; negative means unlimited.
	MaxConcurrentPushes int
	// SendTimeout bounds how long writing one response may take: a proxy
	// that does not read its stream loses its push slot and its stream
	// when it passes. Default 10s; negative disables.
	SendTimeout time.Duration
	// Classify, when set, returns a proxy's class, so that Reclassify can
	// tell which proxies belong to another class than the one they are
	// served from.
	Classify func(*core.Node) string
	// StreamRate bounds how many new streams per second the server accepts
	// (a reconnect storm is spread out instead of arriving at once);
	// 0 means unlimited. Refused streams get UNAVAILABLE and retry.
	StreamRate float64
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Cache == nil {
		return errors.New("server: a cache is required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.Status == nil {
		c.Status = NewStatus()
	}
	if c.MaxConnectionAge == 0 {
		c.MaxConnectionAge = 30 * time.Minute
	}
	if c.MaxConcurrentPushes == 0 {
		c.MaxConcurrentPushes = 100
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = 10 * time.Second
	}
	if c.StreamRate < 0 {
		return errors.New("server: the stream rate must not be negative")
	}
	return nil
}

// Convergence connects generations to the ACKs that confirm them.
type Convergence interface {
	Epoch() int64
	Confirmed(typeURL string, from, to int64)
}

// Versioner is a cache that chooses the version each SotW response is
// sent with, from the request it answers and the version the cache gave it.
type Versioner interface {
	ResponseVersion(r *discovery.DiscoveryRequest, version string) string
}

// Server is an xDS server.
type Server struct {
	cfg     Config
	m       metrics
	streams streams
}

type metrics struct {
	refused   prometheus.Counter
	moved     prometheus.Counter
	timeouts  prometheus.Counter
	queue     prometheus.Histogram
	send      prometheus.Histogram
	streams   prometheus.Gauge
	responses *prometheus.CounterVec
	nacks     *prometheus.CounterVec
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := metrics{
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_streams_refused_total",
			Help: "New xDS streams refused by the stream rate limit."}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_streams_reclassified_total",
			Help: "xDS streams ended because their proxy's class changed (the proxy reconnects)."}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_send_timeouts_total",
			Help: "Responses whose write outlasted the send timeout (the stream is ended)."}),
		queue: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_xds_push_queue_seconds",
			Help:    "Time a response waited for a push slot.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}),
		send: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardpilot_pusher_xds_send_seconds",
			Help:    "Time writing one response to its stream took.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10)}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_xds_streams",
			Help: "Open xDS streams."}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_responses_total",
			Help: "xDS responses sent, by type."}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_nacks_total",
			Help: "xDS requests that rejected a response, by type."}, []string{"type"}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.refused, m.moved, m.timeouts, m.queue, m.send, m.streams, m.responses, m.nacks} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("server: register metrics: %w", err)
			}
		}
	}
	srv := &Server{cfg: cfg, m: m}
	srv.streams.pushes = pushLimit{timeout: max(cfg.SendTimeout, 0), m: &srv.m, log: cfg.Log}
	if cfg.MaxConcurrentPushes > 0 {
		srv.streams.pushes.slots = make(chan struct{}, cfg.MaxConcurrentPushes)
	}
	return srv, nil
}

// shortType turns a type URL into a metric label: "type.googleapis.com/envoy.config.cluster.v3.Cluster" → "Cluster".
func shortType(typeURL string) string {
	for i := len(typeURL) - 1; i >= 0; i-- {
		if typeURL[i] == '.' || typeURL[i] == '/' {
			return typeURL[i+1:]
		}
	}
	return typeURL
}

// deltaID keeps the ids of Delta streams apart from SotW's: go-control-plane
// numbers each kind from 1.
func deltaID(id int64) int64 { return -id }

func (s *Server) callbacks() xds.Callbacks {
	st := s.cfg.Status
	opened := func(ctx context.Context, id int64, _ string) error {
		s.streams.opened(ctx, id)
		return nil
	}
	closed := func(id int64, _ *core.Node) {
		s.streams.closed(id)
		if st.close(id) {
			s.m.streams.Dec()
		}
	}
	request := func(id int64, node *core.Node, typeURL, version, nonce string, detail *rpcstatus.Status) {
		var nack *NACK
		if detail != nil {
			nack = &NACK{Message: detail.GetMessage(), At: time.Now()}
			s.nack(id, node.GetId(), typeURL, nonce, detail.GetMessage())
		}
		if from, to := st.request(id, node, s.cfg.Classify, typeURL, nonce, nack); to > 0 && s.cfg.Convergence != nil {
			s.cfg.Convergence.Confirmed(typeURL, from, to)
		}
	}
	return xds.CallbackFuncs{
		StreamOpenFunc: opened,
		DeltaStreamOpenFunc: func(ctx context.Context, id int64, typeURL string) error {
			return opened(ctx, deltaID(id), typeURL)
		},
		StreamClosedFunc:      closed,
		DeltaStreamClosedFunc: func(id int64, node *core.Node) { closed(deltaID(id), node) },
		StreamRequestFunc: func(id int64, r *discovery.DiscoveryRequest) error {
			intern(r.ResourceNames)
			s.opened(id, false)
			request(id, r.GetNode(), r.TypeUrl, r.VersionInfo, r.ResponseNonce, r.ErrorDetail)
			return nil
		},
		StreamDeltaRequestFunc: func(id int64, r *discovery.DeltaDiscoveryRequest) error {
			intern(r.ResourceNamesSubscribe)
			id = deltaID(id)
			s.opened(id, true)
			request(id, r.GetNode(), r.TypeUrl, "", r.ResponseNonce, r.ErrorDetail)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, req *discovery.DiscoveryRequest, r *discovery.DiscoveryResponse) {
			// go-control-plane calls this just before it sends r, which
			// belongs to this one response: the version is set here.
			if v, ok := s.cfg.Cache.(Versioner); ok {
				r.VersionInfo = v.ResponseVersion(req, r.VersionInfo)
			}
			s.m.responses.WithLabelValues(shortType(r.TypeUrl)).Inc()
			st.response(id, r.TypeUrl, r.VersionInfo, r.Nonce, len(r.Resources), s.epoch())
		},
		StreamDeltaResponseFunc: func(id int64, _ *discovery.DeltaDiscoveryRequest, r *discovery.DeltaDiscoveryResponse) {
			id = deltaID(id)
			s.m.responses.WithLabelValues(shortType(r.TypeUrl)).Inc()
			st.response(id, r.TypeUrl, "nonce-"+r.Nonce, r.Nonce, len(r.Resources), s.epoch())
		},
	}
}

// intern makes the resource names of a request share their bytes with
// every other stream's: a subscription keeps its names for as long as the
// stream lives, and thousands of proxies name the same resources.
func intern(names []string) {
	for i, n := range names {
		names[i] = unique.Make(n).Value()
	}
}

// opened counts a stream once, at its first request, when it is known
// whether it is SotW or Delta.
func (s *Server) opened(id int64, delta bool) {
	if s.cfg.Status.open(id, delta) {
		s.m.streams.Inc()
	}
}

// Reclassify ends the stream of every connected proxy whose class is no
// longer the one it was served from (a Sidecar or a Gateway that applies to
// it appeared, changed or went), and returns how many. Each such proxy
// reconnects, says which versions it holds, and is sent what differs in
// its new class. Without Config.Classify it does nothing.
func (s *Server) Reclassify() int {
	if s.cfg.Classify == nil {
		return 0
	}
	n := 0
	for _, id := range s.cfg.Status.moved(s.cfg.Classify) {
		if s.streams.end(id) {
			n++
		}
	}
	if n > 0 {
		s.m.moved.Add(float64(n))
		s.cfg.Log.Info("ended the streams of proxies whose class changed", "streams", n)
	}
	return n
}

func (s *Server) epoch() int64 {
	if s.cfg.Convergence == nil {
		return 1
	}
	return s.cfg.Convergence.Epoch()
}

func (s *Server) nack(stream int64, node, typeURL, nonce, msg string) {
	s.m.nacks.WithLabelValues(shortType(typeURL)).Inc()
	s.cfg.Log.Warn("proxy rejected a response", "stream", stream, "proxy", node, "type", shortType(typeURL), "nonce", nonce, "reason", msg)
}

// Run serves on lis until ctx is done.
func (s *Server) Run(ctx context.Context, lis net.Listener) error {
	params := keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
	if s.cfg.MaxConnectionAge > 0 {
		params.MaxConnectionAge, params.MaxConnectionAgeGrace = s.cfg.MaxConnectionAge, time.Minute
	}
	opts := append([]grpc.ServerOption{
		grpc.KeepaliveParams(params),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Run returns only after every stream handler has.
		grpc.WaitForHandlers(true),
	}, s.cfg.GRPCOptions...)
	interceptors := []grpc.StreamServerInterceptor{}
	if s.cfg.StreamRate > 0 {
		limiter := rate.NewLimiter(rate.Limit(s.cfg.StreamRate), max(1, int(s.cfg.StreamRate)))
		interceptors = append(interceptors, func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if !limiter.Allow() {
				s.m.refused.Inc()
				return status.Error(codes.Unavailable, "shardpilot: too many new streams; retry with backoff")
			}
			return handler(srv, ss)
		})
	}
	interceptors = append(interceptors, s.streams.intercept)
	opts = append(opts, grpc.ChainStreamInterceptor(interceptors...))
	gs := grpc.NewServer(opts...)
	xs := xds.NewServer(ctx, s.cfg.Cache, s.callbacks())
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, xs)
	clusterservice.RegisterClusterDiscoveryServiceServer(gs, xs)
	endpointservice.RegisterEndpointDiscoveryServiceServer(gs, xs)
	listenerservice.RegisterListenerDiscoveryServiceServer(gs, xs)
	routeservice.RegisterRouteDiscoveryServiceServer(gs, xs)
	if s.cfg.Register != nil {
		s.cfg.Register(gs)
	}

	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(lis) }()
	select {
	case err := <-errc:
		return fmt.Errorf("server: serve: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(s.cfg.DrainTimeout):
		s.cfg.Log.Warn("drain timed out; closing the remaining streams", "timeout", s.cfg.DrainTimeout)
		gs.Stop()
		<-stopped
	}
	<-errc
	s.streams.recvs.wait()
	return nil
}
