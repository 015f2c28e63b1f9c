package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// Visibility is what a cache may also tell: the names of a shared type a
// class may be served (nil: any). When Config.Cache tells it, a stream's
// subscriptions to a shared type are held to its class's names, whatever
// it asks for by name or by wildcard.
type Visibility interface {
	Visible(class cache.Class, typeURL string) *cache.View
}

var _ Visibility = (*cache.Cache)(nil)

// Tables are the tables of one cache, a class's per type: the cache of
// clusters, listeners and routes, the secrets of each identity or the load
// assignments of each locality.
type Tables interface {
	// Table returns the table of a class and type, cache.ErrNoClass for
	// a class not held yet, or cache.ErrNotServed.
	Table(class cache.Class, typeURL string) (*cache.Table, error)
	// AddClass adds a class's tables, filled by fill before they are
	// served. The server holds none of its locks while it calls it.
	AddClass(class cache.Class, fill func(class cache.Class)) bool
	// RemoveClass drops a class's tables.
	RemoveClass(class cache.Class) bool
}

var _ Tables = (*cache.Cache)(nil)

// Cache is the cache most types are answered from: its tables and the
// generation they hold.
type Cache interface {
	Tables
	// Epoch numbers the generation the tables hold: a response sent now
	// contains every change up to it. The generator begins each epoch on
	// the cache before it updates the tables, so that a table's change
	// notification reads the epoch of the change without calling out.
	Epoch() int64
}

var _ Cache = (*cache.Cache)(nil)

// Server is an xDS server.
type Server struct {
	cfg    Config
	m      metrics
	nextID atomic.Int64
	// pushq holds the streams waiting for a sender.
	pushq *pushQueue
	// budget counts the names the streams subscribe to against
	// Config.NameBudget.
	budget *budget
	// sending counts the senders of the pool (and those that took the
	// place of one whose write was parked); unpooled those of an
	// unlimited server, one per stream writing.
	sending, unpooled sync.WaitGroup
	// classes counts the streams of each proxy class; secrets, of each
	// identity's secrets (nil without Config.Secrets); localities, of each
	// locality's load assignments (nil without Config.Localities).
	classes, secrets, localities *classSet
	// conns are the open client connections (see Shed).
	conns conns
}

// classSet counts the streams of each class of one cache, and since when
// a class has had none, so that idle classes are dropped. The books lock
// guards the counts alone: a new class's tables are added and filled
// without it.
type classSet struct {
	tables Tables
	fill   func(class cache.Class)

	mu      *sync.Mutex // the server's books (Streams.mu)
	streams map[cache.Class]int
	idle    map[cache.Class]time.Time
}

func newClassSet(books *sync.Mutex, tables Tables, fill func(cache.Class)) *classSet {
	return &classSet{mu: books, tables: tables, fill: fill, streams: map[cache.Class]int{}, idle: map[cache.Class]time.Time{}}
}

// table returns a class's table of a type, adding (and filling) the class
// if it is not held yet.
func (c *classSet) table(class cache.Class, typeURL string) (*cache.Table, error) {
	t, err := c.tables.Table(class, typeURL)
	if !errors.Is(err, cache.ErrNoClass) {
		return t, err
	}
	c.tables.AddClass(class, c.fill)
	return c.tables.Table(class, typeURL)
}

// join counts a stream in its class and returns the class's table of a
// type; the class is not dropped while the stream counts. A class not held
// yet may be added only while fewer than limit classes are (0: any
// number); ok is false (and nothing counted) beyond.
func (c *classSet) join(class cache.Class, typeURL string, limit int) (t *cache.Table, ok bool, err error) {
	c.mu.Lock()
	if _, held := c.streams[class]; !held && limit > 0 {
		if _, idle := c.idle[class]; !idle && len(c.streams)+len(c.idle) >= limit {
			c.mu.Unlock()
			return nil, false, nil
		}
	}
	c.streams[class]++
	delete(c.idle, class)
	c.mu.Unlock()
	// Counted, the class is not dropped while it is added and filled.
	t, err = c.table(class, typeURL)
	return t, true, err
}

// leave uncounts a stream from its class.
func (c *classSet) leave(class cache.Class) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams[class]--; c.streams[class] <= 0 {
		delete(c.streams, class)
		c.idle[class] = time.Now()
	}
}

// dropIdle drops the classes without a stream for idle.
func (c *classSet) dropIdle(now time.Time, idle time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for class, since := range c.idle {
		if now.Sub(since) >= idle {
			delete(c.idle, class)
			c.tables.RemoveClass(class)
		}
	}
}

// SecretSource serves SDS: Envoy's Secret type, from tables of its own
// with a class per proxy identity (the workload certificate "default" and
// the mesh's root "ROOTCA", say).
type SecretSource interface {
	Tables
	// Class names the secrets class of a stream from its context (its
	// peer's identity); "" when it has none, and is served no secrets.
	Class(ctx context.Context) cache.Class
	// Fill fills a class's tables before they are first served.
	Fill(class cache.Class)
}

// LocalitySource serves EDS to proxies with a locality from tables of its
// own with a class per locality: load assignments whose priorities and
// weights depend on where the proxy is, shared by the proxies of a
// locality.
type LocalitySource interface {
	Tables
	// Class names the locality class of a proxy; "" for a proxy without a
	// locality, which is served the shared load assignments.
	Class(*core.Node) cache.Class
	// Fill fills a class's tables before they are first served.
	Fill(class cache.Class)
}

type metrics struct {
	refused prometheus.Counter
	// connsRefused counts the connections closed past
	// Config.MaxConnectionsPerSource.
	connsRefused prometheus.Counter
	// unadmitted counts the calls refused before a message of theirs was
	// read (Screen, AdmitStream).
	unadmitted prometheus.Counter
	moved      prometheus.Counter
	shed       prometheus.Counter
	untrusted  prometheus.Counter
	timeouts   prometheus.Counter
	// unanswered counts the responses the generations stopped waiting
	// for; parked the writes that outlasted parkAfter, whose sender was
	// replaced.
	unanswered, parked prometheus.Counter
	// paced counts the times a due response waited for its type's pace.
	paced           prometheus.Counter
	queue           prometheus.Histogram
	send            prometheus.Histogram
	streams         prometheus.Gauge
	subscribedBytes prometheus.Gauge
	responses       *prometheus.CounterVec
	nacks           *prometheus.CounterVec
	limited         *prometheus.CounterVec
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := metrics{
		refused: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_streams_refused_total",
			Help: "New xDS streams refused by the stream rate limit."}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_connections_refused_total",
			Help: "Client connections closed as they were accepted: their source address held the most connections it may."}),
		unadmitted: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_calls_unadmitted_total",
			Help: "Calls (xDS streams, certificate requests) refused before any of their messages was read: without a credential or with one that cannot be valid, or, when a stream starts, an identity refused or holding the most streams it may."}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_streams_reclassified_total",
			Help: "xDS streams ended because their proxy's class changed (the proxy reconnects)."}),
		shed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_streams_shed_total",
			Help: "xDS streams ended because their proxy is no longer served here (its namespace was placed on another shard; the proxy reconnects)."}),
		untrusted: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_streams_untrusted_total",
			Help: "xDS streams ended because the client CA was replaced and no longer trusts their certificate."}),
		unanswered: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_unanswered_responses_total",
			Help: "Responses found unanswered (or unwritten) past the answer wait, their stream then behind: until it has answered every response, nothing due to it holds the next generations back."}),
		parked: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_parked_writes_total",
			Help: "Writes that waited on a proxy's flow control past a moment: another sender took their sender's place."}),
		paced: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_paced_total",
			Help: "Times a due response waited for its type's pace (--response-bytes-per-second): the last of the type was large for the time since; the changes made meanwhile go together when it ends."}),
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
		subscribedBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardpilot_pusher_xds_subscribed_bytes",
			Help: "Bytes the names the streams subscribe to hold, each interned set of them counted once (what Config.NameBudget.Total bounds)."}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_responses_total",
			Help: "xDS responses sent, by type."}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_nacks_total",
			Help: "xDS requests that rejected a response, by type."}, []string{"type"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_pusher_xds_limited_total",
			Help: "Requests held to a limit, by limit: node_size, subscribed_names, subscribed_bytes and subscribed_bytes_{stream,connection,identity,total} end the stream, locality_classes serves the mesh-wide load assignments, invisible_names leaves out names the proxy's class may not see."}, []string{"limit"}),
	}
	for _, l := range append([]string{limitNode, limitNames, limitBytes, limitLocality, limitVisible, limitResponse, limitRate}, limitHeld[:]...) {
		m.limited.WithLabelValues(l)
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{m.refused, m.connsRefused, m.unadmitted, m.moved, m.shed, m.untrusted, m.timeouts, m.unanswered, m.parked, m.paced, m.queue, m.send, m.streams, m.subscribedBytes, m.responses, m.nacks, m.limited} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("server: register metrics: %w", err)
			}
		}
	}
	books := &cfg.Streams.mu
	srv := &Server{cfg: cfg, m: m, pushq: newPushQueue(), budget: newBudget(books, cfg.NameBudget, m.subscribedBytes)}
	srv.conns.mu, srv.conns.maxPerSource, srv.conns.refused = books, max(cfg.MaxConnectionsPerSource, 0), m.connsRefused
	srv.classes = newClassSet(books, cfg.Cache, cfg.Hooks.OnNewClass)
	if cfg.Secrets != nil {
		srv.secrets = newClassSet(books, cfg.Secrets, cfg.Secrets.Fill)
	}
	if cfg.Localities != nil {
		srv.localities = newClassSet(books, cfg.Localities, cfg.Localities.Fill)
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

// table returns the table serving a class and type, adding the class
// (filled by the classifier) when it is new.
func (s *Server) table(class cache.Class, typeURL string) (*cache.Table, error) {
	return s.classes.table(class, typeURL)
}

// join counts a stream in its class and returns the class's table of a
// type.
func (s *Server) join(class cache.Class, typeURL string) (*cache.Table, error) {
	t, _, err := s.classes.join(class, typeURL, 0)
	return t, err
}

// leave uncounts a stream from its class.
func (s *Server) leave(class cache.Class) { s.classes.leave(class) }

// dropIdleClasses drops the classes, the identities' secrets and the
// localities' load assignments without a
// stream for ClassIdle.
func (s *Server) dropIdleClasses(now time.Time) {
	s.classes.dropIdle(now, s.cfg.ClassIdle)
	if s.secrets != nil {
		s.secrets.dropIdle(now, s.cfg.ClassIdle)
	}
	if s.localities != nil {
		s.localities.dropIdle(now, s.cfg.ClassIdle)
	}
}

// EndUntrusted ends, with Unauthenticated, the stream of every connected
// proxy whose credentials trusted no longer accepts (its client CA was
// replaced), and returns how many; the proxy reconnects with credentials
// the new CA signed, or not at all.
func (s *Server) EndUntrusted(trusted func(context.Context) bool) int {
	n := 0
	for _, st := range s.cfg.Streams.all() {
		if !trusted(st.ctx) && st.end(status.Error(codes.Unauthenticated, "shardpilot: the client certificate is no longer trusted (the client CA changed)")) {
			n++
		}
	}
	if n > 0 {
		s.m.untrusted.Add(float64(n))
		s.cfg.Log.Warn("ended the streams of proxies whose certificates the new client CA does not trust", "streams", n)
	}
	return n
}

// Reclassify ends the stream of every connected proxy whose class is no
// longer the one it was served from (a Sidecar or a Gateway that applies to
// it appeared, changed or went), and returns how many. Each such proxy
// reconnects, says which versions it holds, and is sent what differs in
// its new class.
func (s *Server) Reclassify() int {
	n := 0
	for _, st := range s.cfg.Streams.moved(s.cfg.Hooks.OnClassify) {
		if st.end(errMoved) {
			n++
		}
	}
	if n > 0 {
		s.m.moved.Add(float64(n))
		s.cfg.Log.Info("ended the streams of proxies whose class changed", "streams", n)
	}
	return n
}

// Shed ends, with UNAVAILABLE and why, the stream of every connected
// proxy that leave says is no longer served here (its namespace was placed
// on another shard), and returns how many; a moment later it closes their
// connections (with any other stream on them: an Envoy has one ADS
// stream per connection). Each proxy reconnects through its control-plane
// address, which now leads to the pushers that serve it.
func (s *Server) Shed(leave func(*core.Node) bool, why string) int {
	n := 0
	gone := status.Error(codes.Unavailable, why)
	var remotes []string
	for _, st := range s.cfg.Streams.all() {
		st.mu.Lock()
		node := st.node
		st.mu.Unlock()
		if node != nil && leave(node) && st.end(gone) {
			n++
			if p, ok := peer.FromContext(st.ctx); ok && p.Addr != nil {
				remotes = append(remotes, p.Addr.String())
			}
		}
	}
	if len(remotes) > 0 {
		// Time for the status to be written: the proxy learns why.
		time.AfterFunc(shedClose, func() {
			for _, r := range remotes {
				s.conns.close(r)
			}
		})
	}
	if n > 0 {
		s.m.shed.Add(float64(n))
		s.cfg.Log.Info("ended the streams of proxies no longer served here", "streams", n, "why", why)
	}
	return n
}

// maxRequestOverhead is what a request holds beside its node and names:
// type URL, version, nonce, error detail, and each name's encoding.
const maxRequestOverhead = 256 << 10

// admittedStream is a stream with the context its admission gave it.
type admittedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a admittedStream) Context() context.Context { return a.ctx }

// tap runs on the connection's reader when a call starts, before any of
// its messages is read: it screens the call (Hooks.OnCall) and gives its
// context the cancel the senders end a stream with.
func (s *Server) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if err := s.cfg.Hooks.OnCall(ctx, info.Header); err != nil {
		s.m.unadmitted.Inc()
		return ctx, err
	}
	return tapCancel(ctx, info)
}

// shedClose is how long after ending a shed stream its connection is closed.
const shedClose = 100 * time.Millisecond

func (s *Server) epoch() int64 { return s.cfg.Cache.Epoch() }

// Run serves on lis until ctx is done.
func (s *Server) Run(ctx context.Context, lis net.Listener) error {
	gs := s.grpcServer()
	var wg sync.WaitGroup
	wctx, stopWatching := context.WithCancel(ctx)
	defer stopWatching()
	// The senders outlive every stream handler: a handler waits for a
	// write of its stream in progress.
	s.senders(s.cfg.MaxConcurrentPushes)
	defer func() { s.pushq.stop(); s.sending.Wait(); s.unpooled.Wait() }()
	wg.Go(func() { s.watchdog(wctx) })
	if s.cfg.ClassIdle > 0 {
		wg.Go(func() { s.dropIdle(wctx) })
	}
	err := s.serveUntil(ctx, gs, lis)
	stopWatching()
	wg.Wait()
	return err
}

// grpcServer returns the gRPC server the streams are served on, with
// every service registered (the embedder's too).
func (s *Server) grpcServer() *grpc.Server {
	params := keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}
	if s.cfg.MaxConnectionAge > 0 {
		params.MaxConnectionAge, params.MaxConnectionAgeGrace = s.cfg.MaxConnectionAge, time.Minute
	}
	opts := []grpc.ServerOption{
		grpc.KeepaliveParams(params),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Run returns only after every stream handler has.
		grpc.WaitForHandlers(true),
		grpc.MaxConcurrentStreams(s.cfg.MaxStreamsPerConnection),
		grpc.InTapHandle(s.tap),
		// The largest request the limits let through (a node and every
		// name subscribed to), so that gRPC does not read one larger
		// only for the stream to refuse it.
		grpc.MaxRecvMsgSize(s.cfg.MaxNodeBytes + s.cfg.MaxNameBytes + maxRequestOverhead),
		grpc.ReadBufferSize(s.cfg.ReadBufferSize),
		grpc.WriteBufferSize(s.cfg.WriteBufferSize), // shared between writes (gRPC's default)
	}
	if w := s.cfg.InitialWindowSize; w > 0 {
		opts = append(opts, grpc.InitialWindowSize(w), grpc.InitialConnWindowSize(w))
	}
	opts = append(opts, s.cfg.GRPCOptions...)
	var interceptors []grpc.StreamServerInterceptor
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
	interceptors = append(interceptors, s.admitStream)
	opts = append(opts, grpc.ChainStreamInterceptor(interceptors...), grpc.ForceServerCodecV2(newCodec()))
	gs := grpc.NewServer(opts...)
	s.register(gs)
	s.cfg.Hooks.OnRegister(gs)
	return gs
}

// admitStream admits a stream before its first message is read
// (Hooks.OnStream), and refuses it while its identity owes the rate of
// new names.
func (s *Server) admitStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := s.cfg.Hooks.OnStream(ss.Context())
	if err != nil {
		s.m.unadmitted.Inc()
		return err
	}
	// An identity that asked for more new names than its rate has paid
	// for opens no stream until it has: nothing of what it sends is read
	// meanwhile.
	if id := s.cfg.Hooks.OnIdentity(ctx); id != "" && s.budget.owes(id) {
		s.m.unadmitted.Inc()
		s.m.limited.WithLabelValues(limitRate).Inc()
		return status.Errorf(codes.ResourceExhausted, "shardpilot: identity %s asked for more new names than its rate of %d bytes a second; retry later", id, int(s.budget.rate))
	}
	if ctx != ss.Context() {
		ss = admittedStream{ServerStream: ss, ctx: ctx}
	}
	return handler(srv, ss)
}

// dropIdle drops the classes idle for ClassIdle until ctx is done.
func (s *Server) dropIdle(ctx context.Context) {
	tick := time.NewTicker(max(s.cfg.ClassIdle/4, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			s.dropIdleClasses(now)
		}
	}
}

// serveUntil serves on lis until ctx is done, then stops gracefully,
// bounded by the drain timeout; it returns the error serving stopped on.
func (s *Server) serveUntil(ctx context.Context, gs *grpc.Server, lis net.Listener) error {
	errc := make(chan error, 1)
	go func() { errc <- gs.Serve(listener{Listener: lis, conns: &s.conns}) }()
	select {
	case err := <-errc:
		gs.Stop()
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
	return nil
}

// watchdog watches the writes and the answers: a write that outlasts
// parkAfter has its sender replaced (the writing goroutine retires once
// its stream's turn ends), so that proxies slow to read do not hold the
// senders from the others; one that outlasts the send timeout ends its
// stream, which makes the write return; a response unanswered (or
// unwritten) past the answer wait no longer holds back the generations.
func (s *Server) watchdog(ctx context.Context) {
	tick := time.NewTicker(parkAfter)
	defer tick.Stop()
	var answersChecked time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			checkAnswers := s.cfg.AnswerWait > 0 && now.Sub(answersChecked) >= s.cfg.AnswerWait/4
			if checkAnswers {
				answersChecked = now
			}
			for _, st := range s.cfg.Streams.all() {
				s.watchWrite(st, now)
				if checkAnswers {
					s.watchAnswers(st, now)
				}
			}
		}
	}
}

// parkAfter is how long a sender waits on one write before another sender
// takes its place.
const parkAfter = 100 * time.Millisecond

// watchWrite parks or times out a stream's write in progress.
func (s *Server) watchWrite(st *stream, now time.Time) {
	started := st.sending.Load()
	if started == 0 {
		return
	}
	took := now.Sub(time.Unix(0, started))
	if s.cfg.SendTimeout > 0 && took >= s.cfg.SendTimeout {
		if st.end(errTimedOut) {
			s.m.timeouts.Inc()
			s.cfg.Log.Warn("a response's write outlasted the send timeout; ending the stream", "stream", st.id, "timeout", s.cfg.SendTimeout)
		}
		return
	}
	if took >= parkAfter && s.cfg.MaxConcurrentPushes > 0 && st.park(started) {
		s.m.parked.Inc()
		s.sending.Go(s.sender)
	}
}

// watchAnswers finds a stream behind once a response of it went
// unanswered (or unwritten) past the answer wait, and excuses its
// watches: the types due behind a stalled write, and whatever the next
// generations make due to it until it has caught up, no longer hold them
// back (see stream.behind).
func (s *Server) watchAnswers(st *stream, now time.Time) {
	late := now.Add(-s.cfg.AnswerWait).UnixNano()
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, w := range st.watches {
		if w.inflight && w.sentAt <= late && !w.status.Unanswered {
			w.status.Unanswered = true
			s.m.unanswered.Inc()
			s.cfg.Log.Debug("a response went unanswered past the answer wait; the next generations no longer wait for its stream until it catches up",
				"stream", st.id, "proxy", st.node.GetId(), "type", w.short, "wait", s.cfg.AnswerWait)
			st.behind.Store(true)
		}
	}
	if !st.behind.Load() {
		return
	}
	for _, w := range st.watches {
		w.owed.Excuse()
	}
}
