// Package ingest turns what a source observed into the store's content.
//
// A source (a folder below this one) produces the complete set of objects it
// currently holds, normalized into model objects, plus the problems it found.
// A Syncer validates that set, writes what changed, deletes what the source
// no longer holds, and reports every rejected object with where it came from
// and why. An invalid object never replaces the last valid version of the
// same key, and a location the source could not read keeps its objects: bad
// input is reported, never propagated, and never deletes good config.
//
// Syncer.Sync is not safe for concurrent use with itself; run one Syncer per
// source. It does no I/O but through its Store.
package ingest
