package model

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// FieldError says which field of an object is invalid and why. Field is a
// path in the object as its user wrote it, for example
// "spec.http[0].route[1].destination.host".
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks one object on its own. Field paths name the fields of the
// Istio resource the object came from (spec.hosts, spec.http[0]...), since
// that is what a user edits.
func Validate(o Object) error {
	switch o := o.(type) {
	case *meshv1.Service:
		return validateService(o)
	case *meshv1.Endpoints:
		return validateEndpoints(o)
	case *meshv1.RouteRule:
		return validateRouteRule(o)
	case *meshv1.TrafficPolicy:
		return validateTrafficPolicy(o)
	case *meshv1.Scope:
		return validateScope(o)
	case *meshv1.Gateway:
		return validateGateway(o)
	case *meshv1.AuthorizationPolicy:
		return validateAuthorization(o)
	case *meshv1.PeerAuthentication:
		return validatePeerAuth(o)
	case *meshv1.RequestAuthentication:
		return validateRequestAuth(o)
	case *meshv1.MeshConfig:
		return validateMeshConfig(o)
	case *meshv1.Telemetry:
		return validateTelemetry(o)
	case *meshv1.EnvoyFilter:
		return validateEnvoyFilter(o)
	}
	return fmt.Errorf("model: validate: unknown object type %T", o)
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// ValidHostname reports whether h is a DNS name, optionally with a leading
// "*." wildcard.
func ValidHostname(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if len(l) > 63 || !dnsLabel.MatchString(l) {
			return false
		}
	}
	return true
}

func validateService(s *meshv1.Service) error {
	if len(s.Hostnames) == 0 {
		return fieldErr("spec.hosts", "at least one host is required")
	}
	for i, h := range s.Hostnames {
		if !ValidHostname(h) {
			return fieldErr(fmt.Sprintf("spec.hosts[%d]", i), "%q is not a DNS name", h)
		}
	}
	if len(s.Ports) == 0 {
		return fieldErr("spec.ports", "at least one port is required")
	}
	names := map[string]bool{}
	numbers := map[uint32]bool{}
	for i, p := range s.Ports {
		f := fmt.Sprintf("spec.ports[%d]", i)
		if p.Number == 0 || p.Number > 65535 {
			return fieldErr(f+".number", "%d is not a port number", p.Number)
		}
		if p.TargetPort > 65535 {
			return fieldErr(f+".targetPort", "%d is not a port number", p.TargetPort)
		}
		if p.Name == "" {
			return fieldErr(f+".name", "a port name is required")
		}
		if names[p.Name] {
			return fieldErr(f+".name", "port name %q is used twice", p.Name)
		}
		if numbers[p.Number] {
			return fieldErr(f+".number", "port %d is listed twice", p.Number)
		}
		names[p.Name], numbers[p.Number] = true, true
		if p.Protocol == meshv1.Protocol_PROTOCOL_UNSPECIFIED {
			return fieldErr(f+".protocol", "a protocol is required")
		}
	}
	return nil
}

func validateEndpoints(e *meshv1.Endpoints) error {
	if e.Service == "" {
		return fieldErr("service", "the service name is required")
	}
	seen := map[string]int{}
	for i, ep := range e.Endpoints {
		f := fmt.Sprintf("endpoints[%d]", i)
		if _, err := netip.ParseAddr(ep.Address); err != nil && !ValidHostname(ep.Address) {
			return fieldErr(f+".address", "%q is neither an IP address nor a DNS name", ep.Address)
		}
		for name, p := range ep.Ports {
			if p == 0 || p > 65535 {
				return fieldErr(f+".ports."+name, "%d is not a port number", p)
			}
		}
		// Two endpoints with one address and the same ports would reach one
		// workload twice; grpc-go rejects such an assignment outright.
		id := EndpointID(ep)
		if j, dup := seen[id]; dup {
			return fieldErr(f+".address", "%s with the same ports is also endpoint %d", ep.Address, j)
		}
		seen[id] = i
	}
	return nil
}

// EndpointID identifies the workload an endpoint reaches: its address and
// its port mapping. Workloads may share an address (a VM running several)
// when they listen on different ports.
func EndpointID(ep *meshv1.Endpoint) string {
	var b strings.Builder
	b.WriteString(ep.Address)
	for _, name := range slices.Sorted(maps.Keys(ep.Ports)) {
		fmt.Fprintf(&b, " %s=%d", name, ep.Ports[name])
	}
	return b.String()
}

func validateRouteRule(r *meshv1.RouteRule) error {
	if len(r.Hosts) == 0 {
		if err := validateDelegate(r); err != nil {
			return err
		}
	}
	for i, h := range r.Hosts {
		if h != "*" && !ValidHostname(h) {
			return fieldErr(fmt.Sprintf("spec.hosts[%d]", i), "%q is not a DNS name", h)
		}
	}
	for i, h := range r.Http {
		if err := validateHTTPRoute(fmt.Sprintf("spec.http[%d]", i), h); err != nil {
			return err
		}
	}
	for _, section := range []struct {
		name   string
		routes []*meshv1.L4Route
	}{{"tcp", r.Tcp}, {"tls", r.Tls}} {
		for i, l4 := range section.routes {
			if err := validateL4Route(fmt.Sprintf("spec.%s[%d]", section.name, i), l4); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateDelegate checks a route rule without hosts: a delegate, whose
// http routes serve the routes that delegate to it.
func validateDelegate(r *meshv1.RouteRule) error {
	switch {
	case len(r.Http) == 0:
		return fieldErr("spec.hosts", "at least one host is required (a delegate, without hosts, needs http routes)")
	case len(r.Tcp) > 0 || len(r.Tls) > 0:
		return fieldErr("spec.hosts", "a delegate (without hosts) has http routes only")
	case len(r.Gateways) > 0:
		return fieldErr("spec.gateways", "a delegate (without hosts) takes the gateways of the routes that delegate to it")
	}
	for i, h := range r.Http {
		if h.Delegate != nil {
			return fieldErr(fmt.Sprintf("spec.http[%d].delegate", i), "a delegate cannot delegate further (one level, as in Istio)")
		}
	}
	return nil
}

// validateHTTPMatch checks an http route's match conditions (at f).
func validateHTTPMatch(f string, m *meshv1.HTTPMatch) error {
	if err := validateStringMatch(f+".uri", m.Uri); err != nil {
		return err
	}
	if err := validateStringMatch(f+".method", m.Method); err != nil {
		return err
	}
	for _, set := range []struct {
		field string
		m     map[string]*meshv1.StringMatch
	}{{"headers", m.Headers}, {"queryParams", m.QueryParams}, {"withoutHeaders", m.WithoutHeaders}} {
		for _, name := range slices.Sorted(maps.Keys(set.m)) {
			if err := validateStringMatch(f+"."+set.field+"."+name, set.m[name]); err != nil {
				return err
			}
		}
	}
	return nil
}

// validateHTTPRoute checks one http route (at f).
func validateHTTPRoute(f string, h *meshv1.HTTPRoute) error {
	for j, m := range h.Match {
		if err := validateHTTPMatch(fmt.Sprintf("%s.match[%d]", f, j), m); err != nil {
			return err
		}
	}
	for j, o := range h.GetCors().GetAllowOrigins() {
		if err := validateStringMatch(fmt.Sprintf("%s.corsPolicy.allowOrigins[%d]", f, j), o); err != nil {
			return err
		}
	}
	actions := 0
	for _, set := range []bool{len(h.Route) > 0, h.Redirect != nil, h.DirectResponse != nil, h.Delegate != nil} {
		if set {
			actions++
		}
	}
	if actions == 0 {
		return fieldErr(f+".route", "at least one destination (or a redirect, a direct response, a delegate) is required")
	}
	if actions > 1 {
		return fieldErr(f, "a route either routes to destinations, redirects, responds directly or delegates: one of them")
	}
	if dr := h.DirectResponse; dr != nil && (dr.Status < 200 || dr.Status > 599) {
		return fieldErr(f+".directResponse.status", "%d is not an HTTP status (200 to 599)", dr.Status)
	}
	if m := h.Mirror; m != nil && !ValidHostname(m.GetDestination().GetHost()) {
		return fieldErr(f+".mirror.host", "%q is not a DNS name", m.GetDestination().GetHost())
	}
	if err := validateDestinations(f, h.Route); err != nil {
		return err
	}
	if h.Timeout != nil && h.Timeout.AsDuration() < 0 {
		return fieldErr(f+".timeout", "must not be negative")
	}
	if rp := h.Retries; rp != nil && rp.PerTryTimeout != nil && rp.PerTryTimeout.AsDuration() < 0 {
		return fieldErr(f+".retries.perTryTimeout", "must not be negative")
	}
	return nil
}

// validateL4Route checks one tcp or tls route (at f).
func validateL4Route(f string, l4 *meshv1.L4Route) error {
	if len(l4.Route) == 0 {
		return fieldErr(f+".route", "at least one destination is required")
	}
	for j, m := range l4.Match {
		if m.Port > 65535 {
			return fieldErr(fmt.Sprintf("%s.match[%d].port", f, j), "%d is not a port number", m.Port)
		}
		for k, h := range m.SniHosts {
			if h != "*" && !ValidHostname(strings.TrimPrefix(h, "*.")) {
				return fieldErr(fmt.Sprintf("%s.match[%d].sniHosts[%d]", f, j, k), "%q is not a DNS name", h)
			}
		}
	}
	return validateDestinations(f, l4.Route)
}

// validateDestinations checks a route's destinations: each a host and a
// port, weights when there are several.
func validateDestinations(f string, ds []*meshv1.RouteDestination) error {
	var total uint32
	for j, d := range ds {
		df := fmt.Sprintf("%s.route[%d]", f, j)
		if d.Destination == nil || d.Destination.Host == "" {
			return fieldErr(df+".destination.host", "a destination host is required")
		}
		if !ValidHostname(d.Destination.Host) {
			return fieldErr(df+".destination.host", "%q is not a DNS name", d.Destination.Host)
		}
		if d.Destination.Port > 65535 {
			return fieldErr(df+".destination.port.number", "%d is not a port number", d.Destination.Port)
		}
		total += d.Weight
	}
	if len(ds) > 1 && total == 0 {
		return fieldErr(f+".route", "weights are required when a route has several destinations")
	}
	return nil
}

func validateStringMatch(field string, m *meshv1.StringMatch) error {
	if m == nil {
		return nil
	}
	switch k := m.Kind.(type) {
	case nil:
		return fieldErr(field, "one of exact, prefix or regex is required")
	case *meshv1.StringMatch_Regex:
		if _, err := regexp.Compile(k.Regex); err != nil {
			return fieldErr(field+".regex", "%q is not an RE2 regex: %s", truncate(k.Regex), truncate(err.Error()))
		}
		if n := programSize(k.Regex); n > MaxRegexProgramSize {
			return fieldErr(field+".regex", "%q compiles to %d instructions; Envoy refuses regexes above %d (its RE2 program size limit): simplify it", truncate(k.Regex), n, MaxRegexProgramSize)
		}
	}
	return nil
}

// MaxRegexProgramSize is Envoy's default limit on the size of a compiled
// RE2 program (runtime key re2.max_program_size.error_level); a route
// with a larger regex is refused, NACKing the whole configuration.
const MaxRegexProgramSize = 100

// PrefixRedirect starts a redirect's uri that replaces the matched path
// prefix by the rest, rather than the whole path (the Gateway API's
// ReplacePrefixMatch, written as Istio writes it).
const PrefixRedirect = "%PREFIX()%"

// programSize approximates RE2's program size by the instructions of Go's
// compiled program (the same construction: "a{100}" is 102 in both).
func programSize(expr string) int {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return 0
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0
	}
	return len(prog.Inst)
}

func validateTrafficPolicy(p *meshv1.TrafficPolicy) error {
	if p.Host == "" {
		return fieldErr("spec.host", "a host is required")
	}
	if !ValidHostname(p.Host) {
		return fieldErr("spec.host", "%q is not a DNS name", p.Host)
	}
	names := map[string]bool{}
	for i, s := range p.Subsets {
		f := fmt.Sprintf("spec.subsets[%d]", i)
		if !dnsLabel.MatchString(s.Name) {
			return fieldErr(f+".name", "%q is not a valid subset name", s.Name)
		}
		if names[s.Name] {
			return fieldErr(f+".name", "subset %q is defined twice", s.Name)
		}
		names[s.Name] = true
	}
	return nil
}

func validateGateway(g *meshv1.Gateway) error {
	if len(g.Servers) == 0 {
		return fieldErr("spec.servers", "at least one server is required")
	}
	for i, s := range g.Servers {
		f := fmt.Sprintf("spec.servers[%d]", i)
		if s.Port == 0 || s.Port > 65535 {
			return fieldErr(f+".port.number", "%d is not a port number", s.Port)
		}
		if s.Protocol == meshv1.Protocol_PROTOCOL_UNSPECIFIED {
			return fieldErr(f+".port.protocol", "a protocol is required")
		}
		if len(s.Hosts) == 0 {
			return fieldErr(f+".hosts", "at least one host is required")
		}
		for j, h := range s.Hosts {
			_, host, found := strings.Cut(h, "/")
			if !found {
				host = h
			}
			if host != "*" && !ValidHostname(host) {
				return fieldErr(fmt.Sprintf("%s.hosts[%d]", f, j), "%q is not [<namespace>/]<host>", h)
			}
		}
	}
	return nil
}

func validateScope(s *meshv1.Scope) error {
	for i, e := range s.Egress {
		f := fmt.Sprintf("spec.egress[%d]", i)
		if len(e.Hosts) == 0 {
			return fieldErr(f+".hosts", "at least one host is required")
		}
		for j, h := range e.Hosts {
			ns, host, ok := strings.Cut(h, "/")
			if !ok || ns == "" || host == "" {
				return fieldErr(fmt.Sprintf("%s.hosts[%d]", f, j), "%q is not <namespace>/<host>", h)
			}
		}
	}
	return nil
}

// Refs answers what cross-object validation asks of the rest of the mesh.
type Refs interface {
	// KnownHost reports whether a service defines the host exactly.
	KnownHost(host string) bool
	// Endpoints returns the endpoints of the service that defines host,
	// from every shard.
	Endpoints(host string) []*meshv1.Endpoint
}

// ValidateRefs checks what an object refers to against the rest of the
// mesh: route destinations must exist (a route to nowhere would turn
// working traffic into errors), and a traffic policy's subsets must each
// select some endpoint of a service that has endpoints.
func ValidateRefs(o Object, refs Refs) error {
	switch o := o.(type) {
	case *meshv1.RouteRule:
		for i, h := range o.Http {
			for j, d := range h.Route {
				if host := d.GetDestination().GetHost(); !knownHost(host, refs.KnownHost) {
					return fieldErr(fmt.Sprintf("spec.http[%d].route[%d].destination.host", i, j), "unknown host %q: no ServiceEntry or Service defines it", host)
				}
			}
			if m := h.Mirror; m != nil && !knownHost(m.GetDestination().GetHost(), refs.KnownHost) {
				return fieldErr(fmt.Sprintf("spec.http[%d].mirror.host", i), "unknown host %q: no ServiceEntry or Service defines it", m.GetDestination().GetHost())
			}
		}
		for _, section := range []struct {
			name   string
			routes []*meshv1.L4Route
		}{{"tcp", o.Tcp}, {"tls", o.Tls}} {
			for i, r := range section.routes {
				for j, d := range r.Route {
					if host := d.GetDestination().GetHost(); !knownHost(host, refs.KnownHost) {
						return fieldErr(fmt.Sprintf("spec.%s[%d].route[%d].destination.host", section.name, i, j), "unknown host %q: no ServiceEntry or Service defines it", host)
					}
				}
			}
		}
	case *meshv1.TrafficPolicy:
		eps := refs.Endpoints(o.Host)
		if len(eps) == 0 {
			return nil
		}
		for i, sub := range o.Subsets {
			if !slices.ContainsFunc(eps, func(ep *meshv1.Endpoint) bool { return Selects(sub.Labels, ep.Labels) }) {
				return fieldErr(fmt.Sprintf("spec.subsets[%d].labels", i), "subset %q selects none of the %d endpoints of %s", sub.Name, len(eps), o.Host)
			}
		}
	}
	return nil
}

// Selects reports whether labels carry every label of selector.
func Selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// knownHost reports whether host is known exactly or through a wildcard host
// ("*.example.com").
func knownHost(host string, known func(string) bool) bool {
	if known(host) {
		return true
	}
	for rest := host; ; {
		_, after, ok := strings.Cut(rest, ".")
		if !ok {
			return false
		}
		if known("*." + after) {
			return true
		}
		rest = after
	}
}

// AuthorizationKeys are the "when" keys an AuthorizationPolicy may use:
// exact keys, and those taking a [<name>].
var (
	AuthorizationKeys      = []string{"source.ip", "source.namespace", "source.principal", "destination.port", "request.auth.principal", "request.auth.audiences", "request.auth.presenter"}
	AuthorizationNamedKeys = []string{"request.headers", "request.auth.claims"}
	httpMethod             = regexp.MustCompile(`^[A-Z]+$`)
)

// ValidAuthorizationKey reports whether a "when" key is supported.
func ValidAuthorizationKey(key string) bool {
	if slices.Contains(AuthorizationKeys, key) {
		return true
	}
	for _, k := range AuthorizationNamedKeys {
		if name, ok := strings.CutPrefix(key, k+"["); ok && strings.HasSuffix(name, "]") && len(name) > 1 {
			return true
		}
	}
	return false
}

// wildcard reports whether an Istio string match is exact or has "*" at
// one end only (or is "*" alone).
func wildcard(v string) bool {
	if v == "*" {
		return true
	}
	inner := strings.TrimSuffix(strings.TrimPrefix(v, "*"), "*")
	return inner != "" && !strings.Contains(inner, "*") && !(strings.HasPrefix(v, "*") && strings.HasSuffix(v, "*"))
}

func validIPBlock(b string) bool {
	if _, err := netip.ParsePrefix(b); err == nil {
		return true
	}
	_, err := netip.ParseAddr(b)
	return err == nil
}

func validateAuthorization(p *meshv1.AuthorizationPolicy) error {
	for i, r := range p.Rules {
		f := fmt.Sprintf("spec.rules[%d]", i)
		for j, src := range r.From {
			sf := fmt.Sprintf("%s.from[%d].source", f, j)
			for name, list := range map[string][]string{"principals": src.Principals, "notPrincipals": src.NotPrincipals,
				"namespaces": src.Namespaces, "notNamespaces": src.NotNamespaces,
				"requestPrincipals": src.RequestPrincipals, "notRequestPrincipals": src.NotRequestPrincipals} {
				for k, v := range list {
					if !wildcard(v) {
						return fieldErr(fmt.Sprintf("%s.%s[%d]", sf, name, k), "%q: a value may have one \"*\" at its start or its end", v)
					}
				}
			}
			for name, list := range map[string][]string{"ipBlocks": src.IpBlocks, "notIpBlocks": src.NotIpBlocks} {
				for k, v := range list {
					if !validIPBlock(v) {
						return fieldErr(fmt.Sprintf("%s.%s[%d]", sf, name, k), "%q is neither an IP address nor a CIDR block", v)
					}
				}
			}
		}
		for j, op := range r.To {
			of := fmt.Sprintf("%s.to[%d].operation", f, j)
			for name, list := range map[string][]uint32{"ports": op.Ports, "notPorts": op.NotPorts} {
				for k, v := range list {
					if v == 0 || v > 65535 {
						return fieldErr(fmt.Sprintf("%s.%s[%d]", of, name, k), "%d is not a port number", v)
					}
				}
			}
			for name, list := range map[string][]string{"methods": op.Methods, "notMethods": op.NotMethods} {
				for k, v := range list {
					if !httpMethod.MatchString(v) {
						return fieldErr(fmt.Sprintf("%s.%s[%d]", of, name, k), "%q is not an HTTP method (GET, POST...)", v)
					}
				}
			}
			for name, list := range map[string][]string{"paths": op.Paths, "notPaths": op.NotPaths, "hosts": op.Hosts, "notHosts": op.NotHosts} {
				for k, v := range list {
					if !wildcard(v) {
						return fieldErr(fmt.Sprintf("%s.%s[%d]", of, name, k), "%q: a value may have one \"*\" at its start or its end", v)
					}
				}
			}
		}
		for j, c := range r.When {
			cf := fmt.Sprintf("%s.when[%d]", f, j)
			if !ValidAuthorizationKey(c.Key) {
				return fieldErr(cf+".key", "%q is not supported: want one of %s, or %s[<name>]", c.Key,
					strings.Join(AuthorizationKeys, ", "), strings.Join(AuthorizationNamedKeys, "[<name>], "))
			}
			if len(c.Values) == 0 && len(c.NotValues) == 0 {
				return fieldErr(cf, "values or notValues is required")
			}
			for k, v := range append(slices.Clone(c.Values), c.NotValues...) {
				switch c.Key {
				case "source.ip":
					if !validIPBlock(v) {
						return fieldErr(fmt.Sprintf("%s.values[%d]", cf, k), "%q is neither an IP address nor a CIDR block", v)
					}
				case "destination.port":
					if n, err := strconv.ParseUint(v, 10, 16); err != nil || n == 0 {
						return fieldErr(fmt.Sprintf("%s.values[%d]", cf, k), "%q is not a port number", v)
					}
				}
			}
		}
	}
	return nil
}

func validatePeerAuth(p *meshv1.PeerAuthentication) error {
	for port := range p.PortModes {
		if port == 0 || port > 65535 {
			return fieldErr("spec.portLevelMtls", "%d is not a port number", port)
		}
		if len(p.Selector) == 0 {
			return fieldErr("spec.portLevelMtls", "port-level modes need a selector (as in Istio)")
		}
	}
	return nil
}

func validateRequestAuth(r *meshv1.RequestAuthentication) error {
	issuers := map[string]bool{}
	for i, j := range r.JwtRules {
		f := fmt.Sprintf("spec.jwtRules[%d]", i)
		if j.Issuer == "" {
			return fieldErr(f+".issuer", "an issuer is required")
		}
		if issuers[j.Issuer] {
			return fieldErr(f+".issuer", "issuer %q is given twice", j.Issuer)
		}
		issuers[j.Issuer] = true
		if j.Jwks != "" && j.JwksUri != "" {
			return fieldErr(f, "jwks and jwksUri are alternatives: give one")
		}
		if j.JwksUri != "" {
			if u, err := url.Parse(j.JwksUri); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
				return fieldErr(f+".jwksUri", "%q is not an http(s) URL", j.JwksUri)
			}
		}
		if j.Jwks != "" && !json.Valid([]byte(j.Jwks)) {
			return fieldErr(f+".jwks", "not JSON (a JSON Web Key Set)")
		}
		for k, h := range j.FromHeaders {
			if h.Name == "" {
				return fieldErr(fmt.Sprintf("%s.fromHeaders[%d].name", f, k), "a header name is required")
			}
		}
	}
	return nil
}

// validateMeshConfig checks the mesh's settings; field paths name the
// fields of Istio's MeshConfig, under the ConfigMap's `mesh` key.
func validateMeshConfig(m *meshv1.MeshConfig) error {
	for _, d := range []struct {
		field string
		value *durationpb.Duration
		min   time.Duration
	}{
		{"mesh.connectTimeout", m.ConnectTimeout, time.Millisecond},
		{"mesh.protocolDetectionTimeout", m.ProtocolDetectionTimeout, 0},
		{"mesh.dnsRefreshRate", m.DnsRefreshRate, time.Millisecond},
		{"mesh.defaultHttpRetryPolicy.perTryTimeout", m.DefaultHttpRetry.GetPerTryTimeout(), time.Millisecond},
	} {
		if d.value == nil {
			continue
		}
		if err := d.value.CheckValid(); err != nil || d.value.AsDuration() < d.min {
			return fieldErr(d.field, "%s is not a duration of at least %s", d.value.AsDuration(), d.min)
		}
	}
	if m.TrustDomain != "" && !ValidHostname(m.TrustDomain) && !dnsLabel.MatchString(m.TrustDomain) {
		return fieldErr("mesh.trustDomain", "%q is not a DNS name", m.TrustDomain)
	}
	if m.RootNamespace != "" && !dnsLabel.MatchString(m.RootNamespace) {
		return fieldErr("mesh.rootNamespace", "%q is not a namespace name", m.RootNamespace)
	}
	return nil
}
