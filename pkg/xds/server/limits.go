package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits refused, by reason, in shardpilot_pusher_xds_limited_total.
const (
	limitNode     = "node_size"
	limitNames    = "subscribed_names"
	limitBytes    = "subscribed_bytes"
	limitLocality = "locality_classes"
	limitVisible  = "invisible_names"
	limitResponse = "response_size"
)

// tooManyBytes refuses a subscription whose names take more than
// Config.MaxNameBytes.
func (st *stream) tooManyBytes(n int) error {
	st.srv.m.limited.WithLabelValues(limitBytes).Inc()
	return status.Errorf(codes.ResourceExhausted, "shardpilot: a subscription of names of %d bytes; at most %d are taken", n, st.srv.cfg.MaxNameBytes)
}

// nameBytes is the bytes of names together.
func nameBytes(names []string) int {
	n := 0
	for _, s := range names {
		n += len(s)
	}
	return n
}

// tooManyNames refuses a subscription past Config.MaxNames.
func (st *stream) tooManyNames(n int) error {
	st.srv.m.limited.WithLabelValues(limitNames).Inc()
	return status.Errorf(codes.ResourceExhausted, "shardpilot: a subscription of %d names; at most %d are taken", n, st.srv.cfg.MaxNames)
}
