// Package cache holds the xDS resources the pusher serves, shared by every
// proxy of a class, on go-control-plane's LinearCache: one cache per class
// and type, created when the first proxy of a class asks (after the caller
// has filled it), and one mesh-wide cache for the types every class shares
// (ClusterLoadAssignments). Update diffs a full set of resources against
// what the cache holds by content hash, so only changed resources are
// replaced and only the proxies watching them are woken.
//
// Proxies see content versions: a SotW response's version is a hash of
// what the proxy holds once it applies it, and a Delta resource's is the
// hash of its content, the same on every replica, so a proxy that moves to
// another replica is sent only what it lacks. A NACKed response is not
// re-sent in a loop.
//
// A Cache is safe for concurrent use.
package cache
