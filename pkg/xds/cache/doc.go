// Package cache holds the xDS resources the pusher serves, in tables that
// make a push cost what changed rather than what a proxy subscribes to.
//
// A Table holds the resources of one class and type (ClusterLoadAssignments:
// one mesh-wide table every class shares). Each resource is validated
// against Envoy's schema and marshalled once, when a new object arrives
// at the cache (another class's table handed the same object copies its
// entry, while any table holds it), and kept with its content hash and the
// table version at which it last changed; a route configuration is
// validated and encoded a virtual host at a time, each host once while it
// lives (the cache remembers it weakly; the runtime's cleanups forget it
// under the validator's own lock). A ring log records which names changed
// at each version, so a stream that was sent version v learns what changed
// since in O(changed); one that fell behind the log's tail does one
// O(subscribed) scan.
//
// Streams that ask for the same names share one interned Set (every Envoy
// of a class asks for the same clusters' endpoints). An Update wakes only
// the watchers of the wildcard set and of the sets holding a changed name,
// with a flag and a non-blocking send (Watcher.Notify); it never diffs per
// stream. Encoded response bodies are cached per set and (from, to)
// versions, so the streams of a class that move in lockstep share one
// encoding: a server adds its nonce and writes the bytes.
//
// Versions proxies see are content versions: a SotW response's version is
// the sum of the name-and-content hashes of what the proxy holds once it
// applies it, and a Delta resource's version is its content hash, the same
// on every replica, so a proxy that moves to another replica is sent only
// what it lacks.
//
// A Cache and its Tables are safe for concurrent use. Update calls for one
// table are serialised; responses are computed under a table's read lock.
// The order of its locks with the server's is written down once, in
// package server's documentation (Concurrency). The backlog, what the
// watches owe the last generations, is held unit by unit in each watch's
// Owed.
package cache
