package generate

import (
	"math"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	faultcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/common/fault/v3"
	corsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	fault "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// faultFilterName is the fault filter every HTTP connection manager
// carries before the router; routes configure it per route.
const faultFilterName = "envoy.filters.http.fault"

// fractional turns a 0-100 percentage into Envoy's fraction, in millionths.
func fractional(pct float64) *typev3.FractionalPercent {
	return &typev3.FractionalPercent{
		Numerator:   uint32(math.Round(pct * 10000)),
		Denominator: typev3.FractionalPercent_MILLION,
	}
}

// grpcCodes maps gRPC status names to codes.
var grpcCodes = func() map[string]uint32 {
	m := map[string]uint32{}
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		m[snake(c.String())] = uint32(c)
	}
	return m
}()

// snake turns "DeadlineExceeded" into "DEADLINE_EXCEEDED" (and "OK" into "OK").
func snake(s string) string {
	var b strings.Builder
	prevLower := false
	for _, r := range s {
		upper := r >= 'A' && r <= 'Z'
		if upper && prevLower {
			b.WriteByte('_')
		}
		b.WriteRune(r)
		prevLower = !upper
	}
	return strings.ToUpper(b.String())
}

// faultConfig is the per-route configuration of the fault filter.
func faultConfig(f *meshv1.Fault) *anypb.Any {
	hf := &fault.HTTPFault{}
	if d := f.GetDelay(); d != nil {
		hf.Delay = &faultcommon.FaultDelay{
			FaultDelaySecifier: &faultcommon.FaultDelay_FixedDelay{FixedDelay: d.FixedDelay},
			Percentage:         fractional(d.Percentage),
		}
	}
	if a := f.GetAbort(); a != nil {
		hf.Abort = &fault.FaultAbort{Percentage: fractional(a.Percentage)}
		if a.GrpcStatus != "" {
			hf.Abort.ErrorType = &fault.FaultAbort_GrpcStatus{GrpcStatus: grpcCodes[strings.ToUpper(a.GrpcStatus)]}
		} else {
			hf.Abort.ErrorType = &fault.FaultAbort_HttpStatus{HttpStatus: a.HttpStatus}
		}
	}
	return mustAny(hf)
}

// headerOptions turns set and add operations into Envoy's header options.
func headerOptions(ops *meshv1.HeaderOperations) []*core.HeaderValueOption {
	var out []*core.HeaderValueOption
	for _, k := range sortedKeys(ops.GetSet()) {
		out = append(out, &core.HeaderValueOption{Header: &core.HeaderValue{Key: k, Value: ops.Set[k]},
			AppendAction: core.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	for _, k := range sortedKeys(ops.GetAdd()) {
		out = append(out, &core.HeaderValueOption{Header: &core.HeaderValue{Key: k, Value: ops.Add[k]},
			AppendAction: core.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD})
	}
	return out
}

// decorate adds a route's header changes, fault and (for an Envoy) CORS
// policy to a route.
func decorate(r *route.Route, h *meshv1.HTTPRoute, ops headerOps, envoy bool) {
	r.RequestHeadersToAdd, r.RequestHeadersToRemove = ops.requestAdd, ops.requestRemove
	r.ResponseHeadersToAdd, r.ResponseHeadersToRemove = ops.responseAdd, ops.responseRemove
	if h.Fault != nil && (h.Fault.Delay != nil || h.Fault.Abort != nil) {
		r.TypedPerFilterConfig = map[string]*anypb.Any{faultFilterName: faultConfig(h.Fault)}
	}
	if h.Cors != nil && envoy {
		if r.TypedPerFilterConfig == nil {
			r.TypedPerFilterConfig = map[string]*anypb.Any{}
		}
		r.TypedPerFilterConfig[corsFilterName] = mustAny(corsPolicy(h.Cors))
	}
}

// corsFilterName is Envoy's CORS filter, which a route's policy configures.
const corsFilterName = "envoy.filters.http.cors"

// corsPolicy is a route's CORS policy as Envoy's filter takes it.
func corsPolicy(c *meshv1.Cors) *corsv3.CorsPolicy {
	out := &corsv3.CorsPolicy{AllowMethods: strings.Join(c.AllowMethods, ","), AllowHeaders: strings.Join(c.AllowHeaders, ","),
		ExposeHeaders: strings.Join(c.ExposeHeaders, ",")}
	for _, o := range c.AllowOrigins {
		out.AllowOriginStringMatch = append(out.AllowOriginStringMatch, headerMatcher("", o).GetStringMatch())
	}
	if c.MaxAge != nil {
		out.MaxAge = strconv.FormatInt(int64(c.MaxAge.AsDuration().Seconds()), 10)
	}
	switch c.AllowCredentials {
	case meshv1.Cors_CREDENTIALS_ALLOW:
		out.AllowCredentials = wrapperspb.Bool(true)
	case meshv1.Cors_CREDENTIALS_DENY:
		out.AllowCredentials = wrapperspb.Bool(false)
	}
	if c.IgnoreUnmatchedPreflights {
		out.ForwardNotMatchingPreflights = wrapperspb.Bool(false)
	}
	return out
}

// redirectAction answers with a redirect.
func redirectAction(rd *meshv1.Redirect) *route.Route_Redirect {
	ra := &route.RedirectAction{HostRedirect: rd.Authority, PortRedirect: rd.Port}
	if prefix, ok := strings.CutPrefix(rd.Uri, model.PrefixRedirect); ok {
		// The matched prefix replaced (the Gateway API's ReplacePrefixMatch).
		ra.PathRewriteSpecifier = &route.RedirectAction_PrefixRewrite{PrefixRewrite: prefix}
	} else if rd.Uri != "" {
		ra.PathRewriteSpecifier = &route.RedirectAction_PathRedirect{PathRedirect: rd.Uri}
	}
	if rd.Scheme != "" {
		ra.SchemeRewriteSpecifier = &route.RedirectAction_SchemeRedirect{SchemeRedirect: rd.Scheme}
	}
	switch rd.RedirectCode {
	case 0, 301:
		ra.ResponseCode = route.RedirectAction_MOVED_PERMANENTLY
	case 302:
		ra.ResponseCode = route.RedirectAction_FOUND
	case 303:
		ra.ResponseCode = route.RedirectAction_SEE_OTHER
	case 307:
		ra.ResponseCode = route.RedirectAction_TEMPORARY_REDIRECT
	case 308:
		ra.ResponseCode = route.RedirectAction_PERMANENT_REDIRECT
	}
	return &route.Route_Redirect{Redirect: ra}
}

// hashPolicy turns a consistent hash into the route's hash policy.
func hashPolicy(ch *meshv1.ConsistentHash) []*route.RouteAction_HashPolicy {
	var hp *route.RouteAction_HashPolicy
	switch k := ch.GetKey().(type) {
	case *meshv1.ConsistentHash_HttpHeaderName:
		hp = &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Header_{
			Header: &route.RouteAction_HashPolicy_Header{HeaderName: k.HttpHeaderName}}}
	case *meshv1.ConsistentHash_HttpCookieName:
		hp = &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_Cookie_{
			Cookie: &route.RouteAction_HashPolicy_Cookie{Name: k.HttpCookieName, Ttl: ch.HttpCookieTtl}}}
	case *meshv1.ConsistentHash_UseSourceIp:
		hp = &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_ConnectionProperties_{
			ConnectionProperties: &route.RouteAction_HashPolicy_ConnectionProperties{SourceIp: true}}}
	case *meshv1.ConsistentHash_HttpQueryParameterName:
		hp = &route.RouteAction_HashPolicy{PolicySpecifier: &route.RouteAction_HashPolicy_QueryParameter_{
			QueryParameter: &route.RouteAction_HashPolicy_QueryParameter{Name: k.HttpQueryParameterName}}}
	default:
		return nil
	}
	return []*route.RouteAction_HashPolicy{hp}
}
