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
// # Concurrency
//
// The goroutines: each stream's handler (it alone changes the stream's
// node, classes and watches) and its reader (it receives and hands each
// request to the handler); the senders, a fixed pool that computes and
// writes the responses of the streams queued; the generator (the pusher's
// owner), whose Update and Patch of a table notify its watchers; and the
// server's own (the answer watcher, the idle-class dropper, the status
// readers) and the embedder's calls (Reclassify, Shed, EndUntrusted).
//
// The locks of this package and of package cache, three and five, and the
// only order in which one is taken while another is held (left before
// right; every pair held together is on one of these lines):
//
//	stream.mu → books → cache.Cache.mu
//	books → cache.Table.updating → cache.Table.mu → cache.validator.mu
//	stream.mu → cache.Set.mu → cache.Table.mu → pushQueue.mu
//
// stream.mu guards what a stream's handler shares with the senders and
// the status readers. The books (Streams.mu, which every server given the
// registry shares) guard the bookkeeping of what is open: the list of
// streams, the streams of each class, the connections of each source and
// the names each holder holds (classSet, conns, budget); each step is a
// few map operations, and only the dropping of an idle class's tables
// goes on into the cache. cache.Cache.mu guards the cache's tables by
// class and is held alone; a table's updating lock orders its writers,
// its read-write lock its entries, log and sets; a set's lock has the
// streams of a set encode a response once between them. pushQueue.mu guards the queue of streams
// waiting for a sender and every stream's place with the senders (queued,
// running, parked, done). Who walks the streams copies the list under the
// books and then takes each stream's lock. Hooks are called with none of
// them held.
//
// What a table's change does under its lock is bounded: Watcher.Notify
// (watch.Notify) sets the watch's due flag, adds its unit to the backlog
// (cache.Owed) and queues the stream for a sender (pushQueue.mu, held for
// a few instructions); it never blocks on a write, never waits for a
// stream's lock, and never starts a goroutine.
//
// The atomics, each read without a lock by a goroutine that does not own
// it: a watch's due flag and the generation that made it due (set by
// Notify, cleared by the sender); its units of the backlog (cache.Owed);
// a stream's behind flag (set by the answer watcher, read by Notify), the
// start of its write in progress (read by the senders' parking) and why it
// ended (read by its handler); the server's stream numbering.
//
// Server.Run serves on a listener until its context is done, then stops
// gracefully (bounded by a drain timeout) and returns after the gRPC server,
// every stream's handler and the senders have stopped.
package server
