package istio

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

func (n *normalizer) virtualService(in Input, spec *virtualService) {
	ns := in.Resource.Metadata.Namespace
	rr := &meshv1.RouteRule{Origin: n.origin(in), Gateways: spec.Gateways, ExportTo: spec.ExportTo}
	for _, h := range spec.Hosts {
		rr.Hosts = append(rr.Hosts, n.fqdn(h, ns))
	}
	for i := range spec.HTTP {
		route, ok := n.httpRoute(in, fmt.Sprintf("spec.http[%d]", i), &spec.HTTP[i])
		if !ok {
			return
		}
		if route != nil {
			rr.Http = append(rr.Http, route)
		}
	}
	for _, section := range []struct {
		name   string
		routes []l4Route
		out    *[]*meshv1.L4Route
	}{{"tcp", spec.TCP, &rr.Tcp}, {"tls", spec.TLS, &rr.Tls}} {
		for i, r := range section.routes {
			route, ok := n.l4Route(in, fmt.Sprintf("spec.%s[%d]", section.name, i), section.name == "tls", r)
			if !ok {
				return
			}
			if route != nil {
				*section.out = append(*section.out, route)
			}
		}
	}
	n.emit(in, rr)
}

// httpRoute converts the http route at f. It reports false, having said
// why, when the VirtualService is refused; a nil route never applies (no
// match alternative is left).
func (n *normalizer) httpRoute(in Input, f string, h *httpRoute) (*meshv1.HTTPRoute, bool) {
	ns := in.Resource.Metadata.Namespace
	route := &meshv1.HTTPRoute{Name: h.Name}
	for _, m := range h.Match {
		route.Match = append(route.Match, httpMatch(&m))
	}
	for j, d := range h.Route {
		if d.Weight < 0 {
			n.problem(in, fmt.Sprintf("%s.route[%d].weight", f, j), "weight %d is negative", d.Weight)
			return nil, false
		}
		dst := &meshv1.Destination{Host: n.fqdn(d.Destination.Host, ns), Subset: d.Destination.Subset}
		if d.Destination.Port != nil {
			dst.Port = d.Destination.Port.Number
		}
		route.Route = append(route.Route, &meshv1.RouteDestination{Destination: dst, Weight: uint32(d.Weight), Headers: routeHeaders(d.Headers)})
	}
	var ok bool
	if route.Timeout, ok = n.duration(in, f+".timeout", h.Timeout); !ok {
		return nil, false
	}
	if r := h.Retries; r != nil {
		if route.Retries, ok = n.retries(in, f+".retries", r); !ok {
			return nil, false
		}
	}
	if !n.httpExtras(in, f, h, route) {
		return nil, false
	}
	if d := h.Delegate; d != nil {
		if d.Name == "" {
			n.problem(in, f+".delegate.name", "the delegate VirtualService's name is required")
			return nil, false
		}
		route.Delegate = &meshv1.Delegate{Name: d.Name, Namespace: cmp.Or(d.Namespace, ns)}
	}
	if c := h.CorsPolicy; c != nil {
		if route.Cors, ok = n.cors(in, f+".corsPolicy", c); !ok {
			return nil, false
		}
	}
	if len(h.Match) > 0 && len(route.Match) == 0 {
		return nil, true // no alternative left: the route never applies
	}
	return route, true
}

// l4Route converts the tcp or tls route at f. It reports false, having
// said why, when the VirtualService is refused; a nil route never applies
// (its matches all left out).
func (n *normalizer) l4Route(in Input, f string, tls bool, r l4Route) (*meshv1.L4Route, bool) {
	ns := in.Resource.Metadata.Namespace
	if tls && len(r.Match) == 0 {
		n.problem(in, f+".match", "a tls route needs a match with sniHosts")
		return nil, false
	}
	route := &meshv1.L4Route{}
	for j, m := range r.Match {
		mf := fmt.Sprintf("%s.match[%d]", f, j)
		switch {
		case tls && len(m.SniHosts) == 0:
			n.problem(in, mf+".sniHosts", "at least one SNI host is required")
			return nil, false
		case !tls && len(m.SniHosts) > 0:
			n.problem(in, mf+".sniHosts", "SNI hosts belong to tls routes, not tcp routes")
			return nil, false
		}
		if !n.l4Match(in, mf, m.DestinationSubnets) {
			continue
		}
		lm := &meshv1.L4Match{Port: m.Port, Gateways: m.Gateways, SourceLabels: m.SourceLabels, SourceNamespace: m.SourceNamespace}
		for _, h := range m.SniHosts {
			lm.SniHosts = append(lm.SniHosts, n.fqdn(h, ns))
		}
		route.Match = append(route.Match, lm)
	}
	if !n.l4Destinations(in, f, r.Route, route) {
		return nil, false
	}
	if len(r.Match) > 0 && len(route.Match) == 0 {
		return nil, true
	}
	return route, true
}

// httpMatch converts one match alternative of an http route.
func httpMatch(m *httpMatchRequest) *meshv1.HTTPMatch {
	hm := &meshv1.HTTPMatch{
		Name:            m.Name,
		Uri:             m.URI.model(),
		Method:          m.Method.model(),
		Headers:         headerMatches(m.Headers),
		Port:            m.Port,
		IgnoreUriCase:   m.IgnoreURICase,
		Gateways:        m.Gateways,
		QueryParams:     headerMatches(m.QueryParams),
		WithoutHeaders:  headerMatches(m.WithoutHeaders),
		SourceNamespace: m.SourceNamespace,
		SourceLabels:    m.SourceLabels,
	}
	// The authority and the scheme are pseudo-headers, as Istio
	// matches them.
	for name, sm := range map[string]*stringMatch{":authority": m.Authority, ":scheme": m.Scheme} {
		if sm != nil {
			if hm.Headers == nil {
				hm.Headers = map[string]*meshv1.StringMatch{}
			}
			hm.Headers[name] = sm.model()
		}
	}
	return hm
}

// retries reads an http route's retries (at f).
func (n *normalizer) retries(in Input, f string, r *httpRetry) (*meshv1.RetryPolicy, bool) {
	if r.Attempts < 0 {
		n.problem(in, f+".attempts", "%d is negative", r.Attempts)
		return nil, false
	}
	out := &meshv1.RetryPolicy{Attempts: uint32(r.Attempts), RetryOn: r.RetryOn,
		RetryIgnorePreviousHosts: r.RetryIgnorePreviousHosts, RetryRemoteLocalities: r.RetryRemoteLocalities}
	ok := n.durations(in, f, durationField{"perTryTimeout", r.PerTryTimeout, &out.PerTryTimeout}, durationField{"backoff", r.Backoff, &out.Backoff})
	return out, ok
}

// l4Match reports whether a tcp or tls match alternative can apply: one
// naming a condition not acted on yet never matches (warned).
func (n *normalizer) l4Match(in Input, f string, destinationSubnets json.RawMessage) bool {
	if t := bytes.TrimSpace(destinationSubnets); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		n.warn(in, f, "never matches: it names destinationSubnets, not acted on yet")
		return false
	}
	return true
}

// l4Destinations reads a tcp or tls route's destinations.
func (n *normalizer) l4Destinations(in Input, f string, ds []l4Destination, route *meshv1.L4Route) bool {
	ns := in.Resource.Metadata.Namespace
	if len(ds) == 0 {
		n.problem(in, f+".route", "at least one destination is required")
		return false
	}
	for j, d := range ds {
		if d.Weight < 0 {
			n.problem(in, fmt.Sprintf("%s.route[%d].weight", f, j), "weight %d is negative", d.Weight)
			return false
		}
		dst := &meshv1.Destination{Host: n.fqdn(d.Destination.Host, ns), Subset: d.Destination.Subset}
		if d.Destination.Port != nil {
			dst.Port = d.Destination.Port.Number
		}
		route.Route = append(route.Route, &meshv1.RouteDestination{Destination: dst, Weight: uint32(d.Weight)})
	}
	return true
}

func (m *stringMatch) model() *meshv1.StringMatch {
	switch {
	case m == nil:
		return nil
	case m.Exact != nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: *m.Exact}}
	case m.Prefix != nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: *m.Prefix}}
	case m.Regex != nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: *m.Regex}}
	}
	return &meshv1.StringMatch{}
}

func headerMatches(h map[string]stringMatch) map[string]*meshv1.StringMatch {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]*meshv1.StringMatch, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		m := h[k]
		out[k] = m.model()
	}
	return out
}

// cors reads a route's corsPolicy.
func (n *normalizer) cors(in Input, f string, c *corsPolicy) (*meshv1.Cors, bool) {
	out := &meshv1.Cors{AllowMethods: c.AllowMethods, AllowHeaders: c.AllowHeaders, ExposeHeaders: c.ExposeHeaders}
	for _, o := range c.AllowOrigin {
		out.AllowOrigins = append(out.AllowOrigins, &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: o}})
	}
	for i := range c.AllowOrigins {
		out.AllowOrigins = append(out.AllowOrigins, c.AllowOrigins[i].model())
	}
	var ok bool
	if out.MaxAge, ok = n.duration(in, f+".maxAge", c.MaxAge); !ok {
		return nil, false
	}
	if c.AllowCredentials != nil {
		out.AllowCredentials = meshv1.Cors_CREDENTIALS_DENY
		if *c.AllowCredentials {
			out.AllowCredentials = meshv1.Cors_CREDENTIALS_ALLOW
		}
	}
	switch strings.ToUpper(c.UnmatchedPreflights) {
	case "", "UNSPECIFIED", "FORWARD":
	case "IGNORE":
		out.IgnoreUnmatchedPreflights = true
	default:
		n.problem(in, f+".unmatchedPreflights", "%q is not FORWARD or IGNORE", c.UnmatchedPreflights)
		return nil, false
	}
	return out, true
}

// httpExtras converts a route's fault, rewrite, redirect, mirror and header
// operations.
func (n *normalizer) httpExtras(in Input, f string, h *httpRoute, route *meshv1.HTTPRoute) bool {
	ns := in.Resource.Metadata.Namespace
	if fl := h.Fault; fl != nil {
		route.Fault = &meshv1.Fault{}
		if d := fl.Delay; d != nil {
			fixed, ok := n.duration(in, f+".fault.delay.fixedDelay", d.FixedDelay)
			if !ok {
				return false
			}
			if fixed == nil {
				n.problem(in, f+".fault.delay.fixedDelay", "a fixed delay is required")
				return false
			}
			pct, ok := n.percentage(in, f+".fault.delay.percentage", d.Percentage, d.Percent)
			if !ok {
				return false
			}
			route.Fault.Delay = &meshv1.Fault_Delay{FixedDelay: fixed, Percentage: pct}
		}
		if a := fl.Abort; a != nil {
			pct, ok := n.percentage(in, f+".fault.abort.percentage", a.Percentage, 0)
			if !ok {
				return false
			}
			if a.HTTPStatus == 0 && a.GrpcStatus == "" {
				n.problem(in, f+".fault.abort", "an httpStatus or a grpcStatus is required")
				return false
			}
			if a.HTTPStatus != 0 && (a.HTTPStatus < 200 || a.HTTPStatus > 599) {
				n.problem(in, f+".fault.abort.httpStatus", "%d is not an HTTP status", a.HTTPStatus)
				return false
			}
			route.Fault.Abort = &meshv1.Fault_Abort{HttpStatus: uint32(a.HTTPStatus), GrpcStatus: a.GrpcStatus, Percentage: pct}
		}
	}
	if rw := h.Rewrite; rw != nil {
		route.Rewrite = &meshv1.Rewrite{Uri: rw.URI, Authority: rw.Authority}
	}
	if rd := h.Redirect; rd != nil {
		route.Redirect = &meshv1.Redirect{Uri: rd.URI, Authority: rd.Authority, RedirectCode: rd.RedirectCode, Scheme: rd.Scheme, Port: rd.Port}
	}
	if dr := h.DirectResponse; dr != nil {
		route.DirectResponse = &meshv1.DirectResponse{Status: dr.Status}
		if b := dr.Body; b != nil {
			if b.String != nil {
				route.DirectResponse.Body = *b.String
			} else {
				route.DirectResponse.Body = string(b.Bytes)
			}
		}
	}
	if m := h.Mirror; m != nil {
		dst := &meshv1.Destination{Host: n.fqdn(m.Host, ns), Subset: m.Subset}
		if m.Port != nil {
			dst.Port = m.Port.Number
		}
		pct := 100.0
		if h.MirrorPercentage != nil {
			pct = h.MirrorPercentage.Value
		}
		if pct < 0 || pct > 100 {
			n.problem(in, f+".mirrorPercentage.value", "%v is not a percentage", pct)
			return false
		}
		route.Mirror = &meshv1.Mirror{Destination: dst, Percentage: pct}
	}
	route.Headers = routeHeaders(h.Headers)
	return true
}

// routeHeaders converts a route's or a destination's header changes.
func routeHeaders(hd *headers) *meshv1.Headers {
	if hd == nil {
		return nil
	}
	return &meshv1.Headers{Request: headerOperations(hd.Request), Response: headerOperations(hd.Response)}
}

func headerOperations(h *headerOps) *meshv1.HeaderOperations {
	if h == nil {
		return nil
	}
	return &meshv1.HeaderOperations{Set: h.Set, Add: h.Add, Remove: h.Remove}
}

// percentage reads Istio's percentage (or its deprecated integer percent);
// unset means all requests.
func (n *normalizer) percentage(in Input, field string, p *percent, deprecated int32) (float64, bool) {
	v := 100.0
	switch {
	case p != nil:
		v = p.Value
	case deprecated != 0:
		v = float64(deprecated)
	}
	if v < 0 || v > 100 {
		n.problem(in, field, "%v is not a percentage", v)
		return 0, false
	}
	return v, true
}
