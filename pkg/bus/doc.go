// Package bus carries mesh change events over NATS JetStream.
//
// One stream (SHARDPILOT_MESH by default) holds the subjects
// mesh.v1.<kind>.<namespace>; every message is one meshv1.ChangeEvent, and its
// JetStream message id is the etcd revision that committed it (with the
// event's index when a revision holds several), so a publisher that repeats
// itself after a crash is de-duplicated by the server.
//
// Consume delivers events in stream order and returns model.ErrGap as soon as a
// stream sequence is missing (the consumer fell behind the stream's
// retention, or messages were purged): the caller reloads from the store.
//
// A Bus is safe for concurrent use; every call that waits takes a context.
package bus
