package server

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// Config configures a Server.
type Config struct {
	Cache Cache
	// Hooks are every call the server makes to the control plane around
	// it (a proxy's class, admission, ACKs, limits): see Hooks.
	Hooks Hooks
	Log   *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
	// DrainTimeout bounds the graceful stop. Default 10s.
	DrainTimeout time.Duration
	// GRPCOptions are added to the gRPC server's options (TLS credentials,
	// for one); the server sets the in-tap handle itself.
	GRPCOptions []grpc.ServerOption
	// Streams, when set, is the registry of the open streams, which records
	// each stream's sent, ACKed and NACKed versions; default a new one.
	Streams *Streams
	// Secrets, when set, serves SDS from a table per proxy identity.
	Secrets SecretSource
	// Localities, when set, serves the load assignments of a proxy with a
	// locality from a table per locality; proxies without one are served
	// the cache's.
	Localities LocalitySource
	// MaxConnectionAge closes a proxy's connection after this long (with a
	// grace period for the stream to move), so that load rebalances across
	// replicas as they scale. Default 30m; negative disables.
	MaxConnectionAge time.Duration
	// MaxConcurrentPushes is how many senders write the streams'
	// responses, so how many are written at once; the rest wait
	// (shardpilot_pusher_xds_push_queue_seconds). Default 100; negative
	// means unlimited (a goroutine per stream writing).
	MaxConcurrentPushes int
	// ResponseBytesPerSecond, when positive, bounds on average the bytes
	// of one type a stream is sent a second: after a response of n bytes,
	// the next of its type (and the types after it in push order) waits
	// until n / ResponseBytesPerSecond has passed, and carries every change
	// made meanwhile. At 20,000 hosts a sidecar's route configuration is
	// 9.8 MB, and one a route change made twice a second kept a hundred
	// proxies' streams full, their endpoint changes behind it; 1 MiB a
	// second let them through. It also holds back the route changes of
	// smaller meshes (470 KiB at 1,000 hosts waits up to half a second),
	// so it is off by default. A response with names the proxy newly asks
	// for does not wait.
	ResponseBytesPerSecond int
	// DeltaResponseBytes, when positive, bounds the resources of one Delta
	// response of load assignments or virtual hosts, encoded: past it,
	// what is left goes in the next responses of the type, each after the
	// stream's answer, and after what changed meanwhile, smallest change
	// first. 20,000 services arriving at once are 60,000 resources to
	// every proxy; a change made meanwhile went out behind them. Clusters
	// and listeners go whole (see partial).
	DeltaResponseBytes int
	// SendTimeout bounds how long writing one response may take: a proxy
	// that does not read its stream loses its push slot and its stream
	// when it passes. Default 10s; negative disables.
	SendTimeout time.Duration
	// AnswerWait is how long a response may go unanswered (or unwritten)
	// before the next generations stop waiting for it: the pusher holds a
	// generation while the last one's responses are due (see
	// pusher.Config.MaxHold), and one proxy that never answers must not
	// hold every change back. The stream is reported (/debug/syncz, a
	// counter) and served on as usual. Default 1s; negative waits for
	// every answer.
	AnswerWait time.Duration
	// StreamRate bounds how many new streams per second the server accepts
	// (a reconnect storm is spread out instead of arriving at once);
	// 0 means unlimited. Refused streams get UNAVAILABLE and retry.
	StreamRate float64
	// MaxStreamsPerConnection bounds the concurrent streams of one client
	// connection (an Envoy opens one ADS stream). Default 100.
	MaxStreamsPerConnection uint32
	// MaxConnectionsPerSource bounds the open connections of one source
	// address: past it, a new connection is closed as it is accepted,
	// before its TLS handshake. Proxies behind one address (a NAT, a
	// gateway) share it. Default 1,000; negative leaves it unbounded.
	MaxConnectionsPerSource int
	// ReadBufferSize and WriteBufferSize are each connection's gRPC
	// buffers; gRPC takes both from pools shared by every connection for
	// as long as a read or a write lasts, so an idle connection holds
	// neither, but a proxy slow to read holds its write buffer while the
	// changes flow: 16 KiB, one HTTP/2 data frame, costs one write per
	// frame and half the default's memory. Default 32 KiB to read, 16 KiB
	// to write.
	ReadBufferSize, WriteBufferSize int
	// InitialWindowSize is the HTTP/2 flow-control window the server
	// grants each stream and each connection for requests. Fixed (not
	// grown by gRPC's bandwidth estimate), a client cannot make the server
	// buffer more than it per connection; a reconnecting Delta proxy's
	// first request, listing every resource it holds, is the largest.
	// Default 1 MiB; negative lets gRPC size it.
	InitialWindowSize int32
	// ClassIdle is how long a class added for a proxy is kept after its
	// last proxy left, so that clients cannot grow the server's state
	// without bound. Default 5m; negative keeps every class.
	ClassIdle time.Duration
	// MaxNodeBytes bounds a stream's node as encoded (Istio's agent sends
	// a few KiB): a larger one ends the stream with InvalidArgument, so
	// that a client cannot make every stream hold megabytes. Default
	// 64 KiB.
	MaxNodeBytes int
	// MaxNames bounds the names one stream subscribes to of one type
	// (SotW or Delta): more end the stream with ResourceExhausted. Default
	// 50,000, above the clusters of the largest meshes.
	MaxNames int
	// MaxNameBytes bounds the bytes of those names together: more end the
	// stream with ResourceExhausted, so that names of a kilobyte each
	// cannot buy a stream tens of megabytes. Default 4 MiB (50,000
	// cluster names of 80 bytes).
	MaxNameBytes int
	// NameBudget bounds the bytes of names streams subscribe to, per
	// stream, connection, identity and in all.
	NameBudget NameBudget
	// MaxLocalities bounds the locality classes (the load assignments of
	// one locality, a table each): a proxy of a locality beyond them is
	// served the mesh-wide assignments, as a proxy without one is. Default
	// 1,000.
	MaxLocalities int
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if c.Cache == nil || c.Hooks == nil {
		return errors.New("server: a cache and hooks (a proxy's class at least) are required")
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 10 * time.Second
	}
	if c.Streams == nil {
		c.Streams = NewStreams()
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
	if c.AnswerWait == 0 {
		c.AnswerWait = time.Second
	}
	if c.StreamRate < 0 {
		return errors.New("server: the stream rate must not be negative")
	}
	if c.ClassIdle == 0 {
		c.ClassIdle = 5 * time.Minute
	}
	if c.MaxStreamsPerConnection == 0 {
		c.MaxStreamsPerConnection = 100
	}
	if c.MaxConnectionsPerSource == 0 {
		c.MaxConnectionsPerSource = 1000
	}
	if c.ReadBufferSize == 0 {
		c.ReadBufferSize = 32 << 10
	}
	if c.WriteBufferSize == 0 {
		c.WriteBufferSize = 16 << 10
	}
	if c.ReadBufferSize < 0 || c.WriteBufferSize < 0 {
		return fmt.Errorf("server: gRPC buffers of %d and %d bytes: want positive sizes", c.ReadBufferSize, c.WriteBufferSize)
	}
	if c.InitialWindowSize == 0 {
		c.InitialWindowSize = 1 << 20
	}
	if c.MaxNodeBytes == 0 {
		c.MaxNodeBytes = 64 << 10
	}
	if c.MaxNames == 0 {
		c.MaxNames = 50_000
	}
	if c.MaxNameBytes == 0 {
		c.MaxNameBytes = 4 << 20
	}
	if c.MaxLocalities == 0 {
		c.MaxLocalities = 1000
	}
	if err := c.NameBudget.validate(); err != nil {
		return err
	}
	if c.MaxNodeBytes < 0 || c.MaxNames < 0 || c.MaxNameBytes < 0 || c.MaxLocalities < 0 {
		return fmt.Errorf("server: limits of %d node bytes, %d names, %d name bytes and %d localities: want positive numbers", c.MaxNodeBytes, c.MaxNames, c.MaxNameBytes, c.MaxLocalities)
	}
	if c.InitialWindowSize > 0 && c.InitialWindowSize < 64<<10 {
		return fmt.Errorf("server: an initial window of %d bytes: want at least 64 KiB (HTTP/2's default)", c.InitialWindowSize)
	}
	return nil
}
