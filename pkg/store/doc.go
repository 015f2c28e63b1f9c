// Package store keeps normalized mesh objects in etcd, one key per object
// under /mesh/v1/ (see package model for the layout).
//
// Writes go through guarded transactions: Put writes only when the content
// (everything but the Origin) changed, comparing against the key's mod
// revision so that a concurrent writer is never overwritten blindly; Delete
// removes a key only at the mod revision it was read at. List reads a prefix
// at one revision and Watch streams every change after a revision, so a
// consumer can load a consistent snapshot and then follow it.
//
// A Store is safe for concurrent use. Calls that wait take a context and
// return when it is cancelled.
package store
