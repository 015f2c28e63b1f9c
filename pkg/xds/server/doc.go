// Package server serves ADS (aggregated discovery, SotW and Delta) and the
// per-type discovery services over gRPC from the tables of package cache,
// and reports connected streams, responses and NACKs as metrics.
//
// Each stream has one goroutine, its handler, which receives. A request
// changes the stream's per-type watch (its subscription set, its ACKed
// version) under the stream's lock; a table that changes marks the watch
// due and queues the stream for the server's senders, a fixed pool, one of
// which computes the response from the table's log and writes it. At most
// one response per type is in flight. Responses go out in the order
// secrets, clusters, endpoints, listeners, routes when several are due. SotW requests are decoded by the server's
// own codec without allocating; everything else uses the proto codec.
//
// The xDS rules follow go-control-plane's: a SotW type is a wildcard
// subscription when its first request names nothing (or names "*"), and
// stays one while the requests name nothing; a request with a stale nonce
// is ignored; listeners and clusters are sent whole, other SotW types only
// as they change; Delta resource versions are content hashes.
//
// The server calls into the control plane around it through one
// interface, Hooks (a call's screening, a stream's admission, readiness,
// a proxy's admission, class and end, a new class's fill, the response
// limit, what its ACKs confirm), always from the goroutine of the stream
// concerned and with none of its locks held, and reads tables from the
// cache and the secrets and locality sources; the embedder tells it of
// changes by its methods (Reclassify, Shed, EndUntrusted). It reads the
// generation (epoch) a change belongs to from the cache, which the
// generator numbers.
//
// Server.Run serves on a listener until its context is done, then stops
// gracefully (bounded by a drain timeout) and returns after the gRPC server,
// every stream's handler and the senders have stopped.
package server
