package gatewayapi

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/durationpb"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// rules are a route's translated rules, or why one could not be.
type rules struct {
	http []*meshv1.HTTPRoute
	l4   []*meshv1.L4Route // a TLSRoute's or TCPRoute's, without matches
	// unsupported says which field has no translation ("" when none):
	// the route is not accepted.
	unsupported string
}

func (rs *rules) refuse(format string, args ...any) {
	if rs.unsupported == "" {
		rs.unsupported = fmt.Sprintf(format, args...)
	}
}

// httpRules translates an HTTPRoute's rules.
func (t *translator) httpRules(r *gwv1.HTTPRoute, refs *refs) *rules {
	rs := &rules{}
	for i, rule := range r.Spec.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		h := &meshv1.HTTPRoute{Name: ruleName(r.Namespace, r.Name, rule.Name, i)}
		for j, m := range rule.Matches {
			h.Match = append(h.Match, httpMatch(m, rs, fmt.Sprintf("%s.matches[%d]", f, j)))
		}
		t.httpFilters(h, rule.Filters, r.Namespace, refs, rs, f)
		if rule.Timeouts != nil {
			h.Timeout = duration(rule.Timeouts.Request)
		}
		if rt := rule.Retry; rt != nil {
			h.Retries = retry(rt)
		}
		if rule.Timeouts != nil && rule.Timeouts.BackendRequest != nil {
			if h.Retries != nil {
				h.Retries.PerTryTimeout = duration(rule.Timeouts.BackendRequest)
			} else if h.Timeout == nil {
				h.Timeout = duration(rule.Timeouts.BackendRequest)
			}
		}
		if rule.SessionPersistence != nil {
			rs.refuse("%s.sessionPersistence: session persistence is not supported", f)
		}
		backends := make([]backend, len(rule.BackendRefs))
		for j, b := range rule.BackendRefs {
			backends[j] = backend{ref: b.BackendRef, field: fmt.Sprintf("%s.backendRefs[%d]", f, j), filters: b.Filters}
		}
		t.destinations(h, KindHTTPRoute, r.Namespace, backends, refs, rs)
		rs.http = append(rs.http, h)
	}
	rs.http = model.ByPrecedence(rs.http)
	return rs
}

// ruleName is a rule's name, or Istio's for an unnamed one.
func ruleName(ns, route string, name *gwv1.SectionName, i int) string {
	if name != nil && *name != "" {
		return string(*name)
	}
	return ns + "." + route + "." + strconv.Itoa(i)
}

func duration(d *gwv1.Duration) *durationpb.Duration {
	if d == nil {
		return nil
	}
	v, err := time.ParseDuration(string(*d))
	if err != nil || v == 0 {
		return nil // the CRD's pattern admits only durations; 0 is none
	}
	return durationpb.New(v)
}

// retry is a rule's retries: on connection failures and the codes named.
func retry(rt *gwv1.HTTPRouteRetry) *meshv1.RetryPolicy {
	on := []string{"connect-failure", "refused-stream", "unavailable", "cancelled"}
	for _, c := range rt.Codes {
		on = append(on, strconv.Itoa(int(c)))
	}
	p := &meshv1.RetryPolicy{Attempts: 2, RetryOn: strings.Join(on, ",")}
	if rt.Attempts != nil {
		p.Attempts = uint32(max(*rt.Attempts, 0))
	}
	if p.Attempts == 0 {
		p.RetryOn = ""
	}
	p.Backoff = duration(rt.Backoff)
	return p
}

func httpMatch(m gwv1.HTTPRouteMatch, rs *rules, field string) *meshv1.HTTPMatch {
	out := &meshv1.HTTPMatch{}
	typ, value := gwv1.PathMatchPathPrefix, "/"
	if m.Path != nil {
		if m.Path.Type != nil {
			typ = *m.Path.Type
		}
		if m.Path.Value != nil {
			value = *m.Path.Value
		}
	}
	switch typ {
	case gwv1.PathMatchExact:
		out.Uri = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: value}}
	case gwv1.PathMatchRegularExpression:
		out.Uri = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: value}}
	default:
		if value != "/" {
			value = strings.TrimSuffix(value, "/")
		}
		out.Uri = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: value}}
	}
	for _, h := range m.Headers {
		regex := h.Type != nil && *h.Type == gwv1.HeaderMatchRegularExpression
		out.Headers = put(out.Headers, strings.ToLower(string(h.Name)), h.Value, regex)
	}
	for _, q := range m.QueryParams {
		regex := q.Type != nil && *q.Type == gwv1.QueryParamMatchRegularExpression
		out.QueryParams = put(out.QueryParams, string(q.Name), q.Value, regex)
	}
	if m.Method != nil {
		out.Method = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: string(*m.Method)}}
	}
	return out
}

// put adds an exact or regular-expression match to a map of them; the
// first of a name wins, as the API asks.
func put(to map[string]*meshv1.StringMatch, name, value string, regex bool) map[string]*meshv1.StringMatch {
	if to == nil {
		to = map[string]*meshv1.StringMatch{}
	}
	if _, dup := to[name]; dup {
		return to
	}
	to[name] = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: value}}
	if regex {
		to[name] = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: value}}
	}
	return to
}

// httpFilters applies a rule's filters to h.
func (t *translator) httpFilters(h *meshv1.HTTPRoute, filters []gwv1.HTTPRouteFilter, ns string, refs *refs, rs *rules, field string) {
	for i, f := range filters {
		ff := fmt.Sprintf("%s.filters[%d]", field, i)
		switch f.Type {
		case gwv1.HTTPRouteFilterRequestHeaderModifier:
			h.Headers = withHeaders(h.Headers, f.RequestHeaderModifier, true)
		case gwv1.HTTPRouteFilterResponseHeaderModifier:
			h.Headers = withHeaders(h.Headers, f.ResponseHeaderModifier, false)
		case gwv1.HTTPRouteFilterRequestRedirect:
			h.Redirect = redirect(f.RequestRedirect)
		case gwv1.HTTPRouteFilterURLRewrite:
			h.Rewrite = rewrite(f.URLRewrite)
		case gwv1.HTTPRouteFilterRequestMirror:
			t.mirror(h, f.RequestMirror, KindHTTPRoute, ns, refs, rs, ff)
		case gwv1.HTTPRouteFilterCORS:
			h.Cors = cors(f.CORS)
		default:
			rs.refuse("%s: filter type %s is not supported", ff, f.Type)
		}
	}
}

func withHeaders(h *meshv1.Headers, f *gwv1.HTTPHeaderFilter, request bool) *meshv1.Headers {
	if f == nil {
		return h
	}
	if h == nil {
		h = &meshv1.Headers{}
	}
	ops := &meshv1.HeaderOperations{Remove: f.Remove}
	for _, s := range f.Set {
		if ops.Set == nil {
			ops.Set = map[string]string{}
		}
		ops.Set[string(s.Name)] = s.Value
	}
	for _, a := range f.Add {
		if ops.Add == nil {
			ops.Add = map[string]string{}
		}
		ops.Add[string(a.Name)] = a.Value
	}
	if request {
		h.Request = ops
	} else {
		h.Response = ops
	}
	return h
}

func redirect(f *gwv1.HTTPRequestRedirectFilter) *meshv1.Redirect {
	if f == nil {
		return nil
	}
	out := &meshv1.Redirect{RedirectCode: 302}
	if f.StatusCode != nil {
		out.RedirectCode = uint32(*f.StatusCode)
	}
	if f.Scheme != nil {
		out.Scheme = *f.Scheme
	}
	if f.Hostname != nil {
		out.Authority = string(*f.Hostname)
	}
	if f.Port != nil {
		out.Port = uint32(*f.Port)
	}
	if p := f.Path; p != nil {
		switch {
		case p.Type == gwv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
			out.Uri = *p.ReplaceFullPath
		case p.Type == gwv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil:
			out.Uri = model.PrefixRedirect + *p.ReplacePrefixMatch
		}
	}
	return out
}

func rewrite(f *gwv1.HTTPURLRewriteFilter) *meshv1.Rewrite {
	if f == nil {
		return nil
	}
	out := &meshv1.Rewrite{}
	if f.Hostname != nil {
		out.Authority = string(*f.Hostname)
	}
	if p := f.Path; p != nil {
		switch {
		case p.Type == gwv1.FullPathHTTPPathModifier && p.ReplaceFullPath != nil:
			out.FullPath = *p.ReplaceFullPath
		case p.Type == gwv1.PrefixMatchHTTPPathModifier && p.ReplacePrefixMatch != nil:
			out.Uri = strings.TrimSuffix(*p.ReplacePrefixMatch, "/")
			if out.Uri == "" {
				out.Uri = "/"
			}
		}
	}
	return out
}

func cors(f *gwv1.HTTPCORSFilter) *meshv1.Cors {
	if f == nil {
		return nil
	}
	out := &meshv1.Cors{}
	for _, o := range f.AllowOrigins {
		m := &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: string(o)}}
		if strings.Contains(string(o), "*") {
			parts := strings.Split(string(o), "*")
			for i, p := range parts {
				parts[i] = regexp.QuoteMeta(p)
			}
			m = &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: strings.Join(parts, ".*")}}
		}
		out.AllowOrigins = append(out.AllowOrigins, m)
	}
	for _, m := range f.AllowMethods {
		out.AllowMethods = append(out.AllowMethods, string(m))
	}
	for _, h := range f.AllowHeaders {
		out.AllowHeaders = append(out.AllowHeaders, string(h))
	}
	for _, h := range f.ExposeHeaders {
		out.ExposeHeaders = append(out.ExposeHeaders, string(h))
	}
	if f.MaxAge > 0 {
		out.MaxAge = durationpb.New(time.Duration(f.MaxAge) * time.Second)
	}
	if f.AllowCredentials != nil {
		out.AllowCredentials = meshv1.Cors_CREDENTIALS_DENY
		if *f.AllowCredentials {
			out.AllowCredentials = meshv1.Cors_CREDENTIALS_ALLOW
		}
	}
	return out
}

// mirror sets a rule's mirror (the first: the model mirrors to one).
func (t *translator) mirror(h *meshv1.HTTPRoute, f *gwv1.HTTPRequestMirrorFilter, kind, ns string, refs *refs, rs *rules, field string) {
	if f == nil {
		return
	}
	if h.Mirror != nil {
		rs.refuse("%s: only one mirror per rule is supported", field)
		return
	}
	pct := 100.0
	if f.Fraction != nil {
		den := float64(100)
		if f.Fraction.Denominator != nil && *f.Fraction.Denominator > 0 {
			den = float64(*f.Fraction.Denominator)
		}
		pct = 100 * float64(f.Fraction.Numerator) / den
	} else if f.Percent != nil {
		pct = float64(*f.Percent)
	}
	dst := t.backend(refs, kind, ns, field+".requestMirror.backendRef", f.BackendRef)
	if dst.Host != invalidHost {
		h.Mirror = &meshv1.Mirror{Destination: dst, Percentage: pct}
	}
}

// backend is one of a rule's backend references.
type backend struct {
	ref     gwv1.BackendRef
	field   string
	filters []gwv1.HTTPRouteFilter
}

// destinations sets a rule's destinations: 404 when it names none, 500
// when none of weight resolves.
func (t *translator) destinations(h *meshv1.HTTPRoute, kind, ns string, backends []backend, refs *refs, rs *rules) {
	if h.Redirect != nil {
		return
	}
	if len(backends) == 0 {
		h.DirectResponse = &meshv1.DirectResponse{Status: 404}
		return
	}
	valid := 0
	for _, b := range backends {
		weight := uint32(1)
		if b.ref.Weight != nil {
			weight = uint32(max(*b.ref.Weight, 0))
		}
		dst := t.backend(refs, kind, ns, b.field, b.ref.BackendObjectReference)
		if weight == 0 {
			continue
		}
		rd := &meshv1.RouteDestination{Destination: dst, Weight: weight}
		for i, f := range b.filters {
			switch f.Type {
			case gwv1.HTTPRouteFilterRequestHeaderModifier:
				rd.Headers = withHeaders(rd.Headers, f.RequestHeaderModifier, true)
			case gwv1.HTTPRouteFilterResponseHeaderModifier:
				rd.Headers = withHeaders(rd.Headers, f.ResponseHeaderModifier, false)
			default:
				rs.refuse("%s.filters[%d]: filter type %s is not supported on a backend", b.field, i, f.Type)
			}
		}
		if dst.Host != invalidHost {
			valid++
		}
		h.Route = append(h.Route, rd)
	}
	if valid == 0 {
		h.Route = nil
		h.DirectResponse = &meshv1.DirectResponse{Status: 500}
	}
}
