package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits refused, by reason, in shardpilot_pusher_xds_limited_total.
const (
	limitNode     = "node_size"
	limitNames    = "subscribed_names"
	limitLocality = "locality_classes"
	limitVisible  = "invisible_names"
	limitResponse = "response_size"
)

// tooManyNames refuses a subscription past Config.MaxNames.
func (st *stream) tooManyNames(n int) error {
	st.srv.m.limited.WithLabelValues(limitNames).Inc()
	return status.Errorf(codes.ResourceExhausted, "shardpilot: a subscription of %d names; at most %d are taken", n, st.srv.cfg.MaxNames)
}
