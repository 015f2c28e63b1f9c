package generate

import (
	"cmp"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	rbacconfig "github.com/envoyproxy/go-control-plane/envoy/config/rbac/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	jwt "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// The JWT filter puts a validated token's payload in its metadata under
// this key, where the RBAC filter reads the claims.
const jwtPayloadKey = "payload"

// claim matches a claim of the request's validated JWT.
func claim(name string, m *matcher.StringMatcher) *rbacconfig.Principal {
	//lint:ignore SA1019 the principal istiod sends for a JWT claim
	return &rbacconfig.Principal{Identifier: &rbacconfig.Principal_Metadata{Metadata: &matcher.MetadataMatcher{
		Filter: "envoy.filters.http.jwt_authn",
		Path:   []*matcher.MetadataMatcher_PathSegment{{Segment: &matcher.MetadataMatcher_PathSegment_Key{Key: jwtPayloadKey}}, {Segment: &matcher.MetadataMatcher_PathSegment_Key{Key: name}}},
		Value:  &matcher.ValueMatcher{MatchPattern: &matcher.ValueMatcher_StringMatch{StringMatch: m}},
	}}}
}

// requestPrincipalsSupported reports whether request principals are of
// the forms checked: "*", "<iss>/<sub>", "<iss>/*" and "*/<sub>".
func requestPrincipalsSupported(values []string) bool {
	for _, v := range values {
		if v == "*" {
			continue
		}
		iss, sub := splitPrincipal(v)
		if iss == "" || sub == "" {
			return false
		}
		for _, part := range []string{iss, sub} {
			if part != "*" && strings.Contains(part, "*") {
				return false
			}
		}
	}
	return true
}

// splitPrincipal splits "<iss>/<sub>" at its last slash (issuers are URLs).
func splitPrincipal(v string) (iss, sub string) {
	i := strings.LastIndex(v, "/")
	if i < 0 {
		return "", ""
	}
	return v[:i], v[i+1:]
}

func requestPrincipal(v string) *rbacconfig.Principal {
	if v == "*" {
		return claim("iss", stringMatch("*", false))
	}
	iss, sub := splitPrincipal(v)
	return andIDs([]*rbacconfig.Principal{claim("iss", stringMatch(iss, false)), claim("sub", stringMatch(sub, false))})
}

// claimCondition translates a "when" on request.auth.*; checked is false
// where the proxy has no JWT filter.
func claimCondition(c *meshv1.AuthorizationCondition, opts rbacOptions) ([]*rbacconfig.Principal, bool) {
	if !opts.jwt || opts.tcp {
		return nil, false
	}
	var match func(string) *rbacconfig.Principal
	switch {
	case c.Key == "request.auth.principal":
		if !requestPrincipalsSupported(c.Values) || !requestPrincipalsSupported(c.NotValues) {
			return nil, false
		}
		match = requestPrincipal
	case c.Key == "request.auth.audiences":
		match = func(v string) *rbacconfig.Principal { return claim("aud", stringMatch(v, false)) }
	case c.Key == "request.auth.presenter":
		match = func(v string) *rbacconfig.Principal { return claim("azp", stringMatch(v, false)) }
	default: // request.auth.claims[<name>]
		name := strings.TrimSuffix(strings.TrimPrefix(c.Key, "request.auth.claims["), "]")
		match = func(v string) *rbacconfig.Principal { return claim(name, stringMatch(v, false)) }
	}
	var ids []*rbacconfig.Principal
	field(&ids, c.Values, false, match)
	field(&ids, c.NotValues, true, match)
	return ids, true
}

// JWTFilter returns the JWT filter of a class's RequestAuthentications for
// an Envoy, as Istio's: a request with a token none of their issuers
// validates is refused, one without a token passes (for an
// AuthorizationPolicy to decide); a validated token's payload is in the
// filter's metadata for the RBAC filters. Nil without a
// RequestAuthentication.
func JWTFilter(sec Security) *hcm.HttpFilter {
	providers := map[string]*jwt.JwtProvider{}
	var names []string
	for _, p := range sec {
		ra, ok := p.Spec.(*meshv1.RequestAuthentication)
		if !ok {
			continue
		}
		for _, r := range ra.JwtRules {
			name := "origins-" + strconv.Itoa(len(names))
			provider := &jwt.JwtProvider{
				Issuer: r.Issuer, Audiences: r.Audiences, Forward: r.ForwardOriginalToken,
				FromParams: r.FromParams, ForwardPayloadHeader: r.OutputPayloadToHeader, PayloadInMetadata: jwtPayloadKey,
				// OAuth's space-separated claims are matched a word at a time.
				NormalizePayloadInMetadata: &jwt.JwtProvider_NormalizePayload{SpaceDelimitedClaims: []string{"permission", "scope"}},
			}
			for _, h := range r.FromHeaders {
				provider.FromHeaders = append(provider.FromHeaders, &jwt.JwtHeader{Name: h.Name, ValuePrefix: h.Prefix})
			}
			if r.Jwks != "" {
				provider.JwksSourceSpecifier = &jwt.JwtProvider_LocalJwks{LocalJwks: &core.DataSource{Specifier: &core.DataSource_InlineString{InlineString: r.Jwks}}}
			} else {
				provider.JwksSourceSpecifier = &jwt.JwtProvider_RemoteJwks{RemoteJwks: &jwt.RemoteJwks{
					HttpUri: &core.HttpUri{Uri: r.JwksUri, HttpUpstreamType: &core.HttpUri_Cluster{Cluster: JWKSClusterName(r.JwksUri)},
						Timeout: durationpb.New(5 * time.Second)},
					CacheDuration: durationpb.New(5 * time.Minute),
					AsyncFetch:    &jwt.JwksAsyncFetch{},
				}}
			}
			providers[name] = provider
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil
	}
	provider := func(n string) *jwt.JwtRequirement {
		return &jwt.JwtRequirement{RequiresType: &jwt.JwtRequirement_ProviderName{ProviderName: n}}
	}
	anyOf := func(rs ...*jwt.JwtRequirement) *jwt.JwtRequirement {
		return &jwt.JwtRequirement{RequiresType: &jwt.JwtRequirement_RequiresAny{RequiresAny: &jwt.JwtRequirementOrList{Requirements: rs}}}
	}
	// Each provider's token, where present, must be valid; a request with
	// none passes (for the RBAC filters to decide). With several
	// providers, as istiod: any one provider validating, or every
	// provider's token valid or missing (providers may share where they
	// read a token from).
	missing := &jwt.JwtRequirement{RequiresType: &jwt.JwtRequirement_AllowMissing{AllowMissing: &emptypb.Empty{}}}
	requires := anyOf(provider(names[0]), missing)
	if len(names) > 1 {
		var each, alternatives []*jwt.JwtRequirement
		for _, n := range names {
			each = append(each, anyOf(provider(n), missing))
			alternatives = append(alternatives, provider(n))
		}
		requires = anyOf(append(alternatives, &jwt.JwtRequirement{RequiresType: &jwt.JwtRequirement_RequiresAll{
			RequiresAll: &jwt.JwtRequirementAndList{Requirements: each}}})...)
	}
	config := &jwt.JwtAuthentication{
		Providers: providers,
		Rules: []*jwt.RequirementRule{{
			Match:           &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
			RequirementType: &jwt.RequirementRule_Requires{Requires: requires},
		}},
		// A CORS preflight carries no token: the CORS filter answers it.
		BypassCorsPreflight: true,
	}
	return &hcm.HttpFilter{Name: "envoy.filters.http.jwt_authn", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(config)}}
}

// JWKSClusterName names the cluster an Envoy fetches a JWKS URI's keys
// through.
func JWKSClusterName(uri string) string {
	host, port := jwksHost(uri)
	return "jwks|" + host + "|" + strconv.FormatUint(uint64(port), 10)
}

func jwksHost(uri string) (string, uint32) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", 0
	}
	port := uint32(443)
	if u.Scheme == "http" {
		port = 80
	}
	if p, err := strconv.ParseUint(u.Port(), 10, 16); err == nil {
		port = uint32(p)
	}
	return u.Hostname(), port
}

// JWKSClusters returns the clusters an Envoy class fetches its remote JWKS
// through: DNS, over TLS (validated with the system's roots) for https.
func JWKSClusters(sec Security) []*cluster.Cluster {
	seen := map[string]bool{}
	var out []*cluster.Cluster
	for _, p := range sec {
		ra, ok := p.Spec.(*meshv1.RequestAuthentication)
		if !ok {
			continue
		}
		for _, r := range ra.JwtRules {
			if r.JwksUri == "" || seen[JWKSClusterName(r.JwksUri)] {
				continue
			}
			name := JWKSClusterName(r.JwksUri)
			seen[name] = true
			host, port := jwksHost(r.JwksUri)
			c := &cluster.Cluster{
				Name:                 name,
				ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_LOGICAL_DNS},
				ConnectTimeout:       durationpb.New(5 * time.Second),
				LoadAssignment: &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
					LbEndpoints: []*endpoint.LbEndpoint{{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: socketAddress(host, port)}}}},
				}}},
			}
			if strings.HasPrefix(r.JwksUri, "https://") {
				c.TransportSocket = tlsSocket(&tlsv3.UpstreamTlsContext{Sni: host, CommonTlsContext: &tlsv3.CommonTlsContext{
					ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
						TrustedCa: &core.DataSource{Specifier: &core.DataSource_Filename{Filename: SystemRoots}}}}}})
			}
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b *cluster.Cluster) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// SystemRoots is where an Envoy's image keeps the public roots (Istio's
// proxy image: Debian's bundle).
const SystemRoots = "/etc/ssl/certs/ca-certificates.crt"
