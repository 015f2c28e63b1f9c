// Package pusher keeps an in-memory copy of the mesh in step with the store
// and turns it into the xDS resources the proxies are served.
//
// It loads the store at a revision R, then follows the change stream from
// the stream position taken just before the load, applying an event only if
// it is newer than R and than the key's known mod revision: events are
// idempotent and never applied out of order per key. A gap in the stream, a
// RESYNC event past R, or a stream error makes it load the store again.
// While the store or the bus is down it keeps serving what it generated last.
//
// Changes are debounced before a generation: a short quiet period takes
// one sync's events together, and while the last generation's responses
// are still due (Tables.Backlog) the batch waits, up to a maximum hold.
// The generators' view of the mesh comes from a meshbuild.Builder, which
// rebuilds only the services an endpoint change touches. Proxies are
// grouped into classes (see package classify); a generation builds each
// class's clusters, routes and listeners once from the part of the mesh
// the class sees, and the load assignments once for the whole mesh, taking
// per-service resources from an LRU cache keyed by their inputs' store
// revisions; an endpoint-only change rebuilds and hands over only the load
// assignments of the services it touched. Once full generations take
// long (a large mesh every proxy sees), endpoint changes do not wait for
// them: a batch's load assignments go out ahead of its join, and those
// that arrive while a generation runs go out between its classes. The
// cache forwards only what changed. Each generation (and each pass of
// endpoints ahead) opens an epoch, so that an ACK can be traced back to
// when its changes were observed (shardpilot_pusher_convergence_seconds).
//
// Two goroutines carry a change. The follow goroutine reads: it loads the
// store, reads the change stream and decodes each event, beside a
// generation. The owner keeps the mesh: one loop over what follow hands it,
// the fills and questions of the proxies' streams, and its own timer (the
// debounce and the lingering clusters); the mesh state, the debouncer and
// the generation caches are its alone and carry no lock (owner.go).
//
// Pusher.Run returns after its goroutines have stopped. The accessors are
// safe for concurrent use.
package pusher
