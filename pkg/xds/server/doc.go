// Package server serves ADS (aggregated discovery, SotW and Delta) and the
// per-type discovery services over gRPC from a go-control-plane cache, and
// reports connected streams, responses and NACKs as metrics.
//
// Server.Run serves on a listener until its context is done, then stops
// gracefully (bounded by a drain timeout) and returns after the gRPC server
// has stopped.
package server
