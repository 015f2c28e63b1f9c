package generate

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	previoushosts "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	previouspriorities "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	xdstype "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The defaults istiod applies where the user's configuration is silent, so
// that traffic behaves the same under either control plane (see
// docs/istio-compatibility.md).

// defaultRetryOn is what a retry policy retries on when it names nothing.
const defaultRetryOn = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"

// defaultRetries is how often a request is retried when its route says
// nothing of retries.
const defaultRetries = 2

// hostSelectionRetries is how often Envoy picks another host for a retry
// that the previous-hosts predicate refuses.
const hostSelectionRetries = 5

// dnsRefreshRate is how often a DNS cluster resolves again when its answer
// carried no TTL and the mesh's dnsRefreshRate says nothing; a TTL is
// respected.
var dnsRefreshRate = durationpb.New(60e9)

// Retry predicates, marshalled once and shared by every route (generated
// resources are never modified).
var (
	// previousHosts avoids the hosts a request was already tried on.
	previousHosts = []*route.RetryPolicy_RetryHostPredicate{{Name: "envoy.retry_host_predicates.previous_hosts",
		ConfigType: &route.RetryPolicy_RetryHostPredicate_TypedConfig{TypedConfig: mustAny(&previoushosts.PreviousHostsPredicate{})}}}
	// remoteLocalities retries in the priorities not tried yet.
	remoteLocalities = &route.RetryPolicy_RetryPriority{Name: "envoy.retry_priorities.previous_priorities",
		ConfigType: &route.RetryPolicy_RetryPriority_TypedConfig{TypedConfig: mustAny(&previouspriorities.PreviousPrioritiesConfig{UpdateFrequency: 2})}}
)

// noTimeout is a zero duration: no limit.
func noTimeout() *durationpb.Duration { return durationpb.New(0) }

// retryPolicy is the retry policy of a route: the route's own (attempts 0
// turns retries off), else the default. A route whose destination hashes
// consistently retries on the same host (no previous-hosts predicate).
func retryPolicy(r *meshv1.RetryPolicy, consistentHash bool) *route.RetryPolicy {
	out := &route.RetryPolicy{
		RetryOn:                       defaultRetryOn,
		NumRetries:                    wrapperspb.UInt32(defaultRetries),
		HostSelectionRetryMaxAttempts: hostSelectionRetries,
	}
	avoidPrevious := !consistentHash
	if r != nil {
		if r.Attempts == 0 {
			return nil
		}
		out.NumRetries = wrapperspb.UInt32(r.Attempts)
		if r.RetryOn != "" {
			out.RetryOn, out.RetriableStatusCodes = splitRetryOn(r.RetryOn)
			if len(out.RetriableStatusCodes) > 0 && !strings.Contains(out.RetryOn, "retriable-status-codes") {
				out.RetryOn += ",retriable-status-codes"
			}
		}
		out.PerTryTimeout = r.PerTryTimeout
		if r.RetryIgnorePreviousHosts != nil {
			avoidPrevious = *r.RetryIgnorePreviousHosts
		}
		if r.RetryRemoteLocalities {
			out.RetryPriority = remoteLocalities
		}
		if r.Backoff != nil {
			out.RetryBackOff = &route.RetryPolicy_RetryBackOff{BaseInterval: r.Backoff}
		}
	}
	if avoidPrevious {
		out.RetryHostPredicate = previousHosts
	}
	return out
}

// splitRetryOn separates the HTTP status codes of a retryOn list from
// Envoy's retry conditions.
func splitRetryOn(retryOn string) (string, []uint32) {
	var on []string
	var codes []uint32
	for part := range strings.SplitSeq(retryOn, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if n, err := strconv.Atoi(part); err == nil && http.StatusText(n) != "" {
			codes = append(codes, uint32(n))
			continue
		}
		on = append(on, part)
	}
	return strings.Join(on, ","), codes
}

// setTimeout limits a route's requests to timeout (nil: no limit). An
// Envoy applies the same limit to gRPC calls; a proxyless client reads it
// as the stream's maximum duration.
func setTimeout(a *route.RouteAction, timeout *durationpb.Duration, envoy bool) {
	if timeout == nil {
		timeout = noTimeout()
	}
	a.Timeout = timeout
	if envoy {
		//lint:ignore SA1019 what Envoy reads for the grpc-timeout header, as istiod sends it
		a.MaxGrpcTimeout = timeout
		return
	}
	a.MaxStreamDuration = &route.RouteAction_MaxStreamDuration{MaxStreamDuration: timeout}
}

// headerOps are a route's (or a destination's) header changes as Envoy
// takes them; setting or adding the authority rewrites the host instead.
type headerOps struct {
	requestAdd, responseAdd       []*core.HeaderValueOption
	requestRemove, responseRemove []string
	authority                     string
}

// then returns o followed by d's changes.
func (o headerOps) then(d headerOps) headerOps {
	o.requestAdd = append(slices.Clip(o.requestAdd), d.requestAdd...)
	o.requestRemove = append(slices.Clip(o.requestRemove), d.requestRemove...)
	o.responseAdd = append(slices.Clip(o.responseAdd), d.responseAdd...)
	o.responseRemove = append(slices.Clip(o.responseRemove), d.responseRemove...)
	return o
}

func translateHeaders(h *meshv1.Headers) headerOps {
	var out headerOps
	if h == nil {
		return out
	}
	req, resp := h.GetRequest(), h.GetResponse()
	out.requestAdd = headerOptions(req)
	out.responseAdd = headerOptions(resp)
	out.requestRemove = slices.DeleteFunc(slices.Clone(req.GetRemove()), pseudoHeader)
	out.responseRemove = slices.DeleteFunc(slices.Clone(resp.GetRemove()), pseudoHeader)
	for _, ops := range []map[string]string{req.GetAdd(), req.GetSet()} { // set wins
		for k, v := range ops {
			if isAuthority(k) {
				out.authority = v
			}
		}
	}
	out.requestAdd = slices.DeleteFunc(out.requestAdd, func(o *core.HeaderValueOption) bool { return pseudoHeader(o.Header.Key) })
	out.responseAdd = slices.DeleteFunc(out.responseAdd, func(o *core.HeaderValueOption) bool { return pseudoHeader(o.Header.Key) })
	return out
}

// pseudoHeader reports whether Envoy refuses to change a header: the
// pseudo-headers and host, which is the authority.
func pseudoHeader(name string) bool {
	return strings.HasPrefix(name, ":") || strings.EqualFold(name, "host")
}

func isAuthority(name string) bool {
	return strings.EqualFold(name, ":authority") || strings.EqualFold(name, "host")
}

// defaultThresholds are the circuit breakers of a cluster whose policy sets
// no limit: none (Envoy's own, 1024 connections and requests and 3
// retries, turn away traffic a rolling update makes).
func defaultThresholds() *cluster.CircuitBreakers_Thresholds {
	return &cluster.CircuitBreakers_Thresholds{
		MaxConnections:     wrapperspb.UInt32(math.MaxUint32),
		MaxPendingRequests: wrapperspb.UInt32(math.MaxUint32),
		MaxRequests:        wrapperspb.UInt32(math.MaxUint32),
		MaxRetries:         wrapperspb.UInt32(math.MaxUint32),
	}
}

// circuitBreakers are a cluster's limits: the policy's where it sets them,
// else none.
func circuitBreakers(cp *meshv1.ConnectionPool) *cluster.CircuitBreakers {
	t := defaultThresholds()
	if v := positive(cp.GetMaxConnections()); v != nil {
		t.MaxConnections = v
	}
	if v := positive(cp.GetMaxPendingRequests()); v != nil {
		t.MaxPendingRequests = v
	}
	if v := positive(cp.GetMaxRequests()); v != nil {
		t.MaxRequests = v
	}
	if v := positive(cp.GetMaxRetries()); v != nil {
		t.MaxRetries = v
	}
	return &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{t}}
}

// outlierDetection ejects failing endpoints by consecutive errors only
// (success-rate ejection off) and, unless the policy says otherwise, turns
// off Envoy's panic mode, which would send traffic to ejected endpoints
// once too few are healthy.
func outlierDetection(c *cluster.Cluster, od *meshv1.OutlierDetection) {
	if od == nil {
		return
	}
	out := &cluster.OutlierDetection{
		EnforcingSuccessRate: wrapperspb.UInt32(0),
		Interval:             od.Interval,
		BaseEjectionTime:     od.BaseEjectionTime,
		MaxEjectionPercent:   positive(od.MaxEjectionPercent),
	}
	if v := od.Consecutive_5XxErrors; v > 0 {
		out.Consecutive_5Xx, out.EnforcingConsecutive_5Xx = wrapperspb.UInt32(v), wrapperspb.UInt32(100)
	}
	if v := od.ConsecutiveGatewayErrors; v > 0 {
		out.ConsecutiveGatewayFailure, out.EnforcingConsecutiveGatewayFailure = wrapperspb.UInt32(v), wrapperspb.UInt32(100)
	}
	if od.SplitExternalLocalOriginErrors {
		out.SplitExternalLocalOriginErrors = true
		if v := od.ConsecutiveLocalOriginFailures; v > 0 {
			out.ConsecutiveLocalOriginFailure, out.EnforcingConsecutiveLocalOriginFailure = wrapperspb.UInt32(v), wrapperspb.UInt32(100)
		}
		out.EnforcingLocalOriginSuccessRate = wrapperspb.UInt32(0)
	}
	c.OutlierDetection = out
	if c.CommonLbConfig == nil {
		c.CommonLbConfig = &cluster.Cluster_CommonLbConfig{}
	}
	c.CommonLbConfig.HealthyPanicThreshold = &xdstype.Percent{Value: float64(od.MinHealthPercent)}
}
