package generate

import (
	"cmp"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	cares "github.com/envoyproxy/go-control-plane/envoy/extensions/network/dns_resolver/cares/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	matcher "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// ads is the config source every generated resource points to.
func ads() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// Clusters returns the outbound EDS clusters of every service: one per
// hostname and port, and one more per subset of its traffic policy; and for
// sidecars, the inbound clusters and the passthrough and black hole clusters.
func Clusters(m *Mesh, proxy Proxy) []*cluster.Cluster {
	var out []*cluster.Cluster
	for _, s := range m.Services {
		out = append(out, ServiceClusters(m, s, proxy)...)
	}
	out = append(out, AliasClusters(m, proxy)...)
	out = append(out, InboundClusters(m, proxy)...)
	return append(out, CatchAllClusters(m, proxy)...)
}

// AliasClusters are a proxyless client's clusters of the alias services'
// names it dials that are not routed as a service of the mesh (see
// virtualHost): each resolves the name by DNS, as the cluster's own
// Service would be reached. An Envoy gets none (its traffic to such a
// name passes through, as istiod sends it).
func AliasClusters(m *Mesh, proxy Proxy) []*cluster.Cluster {
	if proxy != Proxyless {
		return nil
	}
	var out []*cluster.Cluster
	forEachProxylessAlias(m, func(a *Service, host string, p *meshv1.Port) {
		if m.aliasTarget(host, p.Number) == "" {
			c := outboundCluster(m, ClusterName(p.Number, "", host), p, nil, meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED, proxy)
			out = append(out, dnsCluster(m, c, a, host, p, nil, proxy))
		}
	})
	return out
}

// CatchAllClusters are the clusters that belong to no service: Envoy's
// passthrough and black hole clusters.
func CatchAllClusters(m *Mesh, proxy Proxy) []*cluster.Cluster {
	if proxy != Envoy {
		return nil
	}
	return sidecarClusters(m)
}

// GatewayCatchAllClusters are a gateway's clusters that belong to no
// service: the black hole alone, as istiod sends a gateway (nothing of its
// passes traffic through to where it was going).
func GatewayCatchAllClusters(m *Mesh) []*cluster.Cluster {
	return slices.DeleteFunc(sidecarClusters(m), func(c *cluster.Cluster) bool { return c.Name != BlackHoleCluster })
}

// connectTimeout is how long a cluster's connections may take to open
// (MeshConfig connectTimeout, 10s by default).
func (m *Mesh) connectTimeout() *durationpb.Duration {
	if t := m.Config.GetConnectTimeout(); t != nil {
		return t
	}
	return durationpb.New(10 * time.Second)
}

// ServiceClusters returns one service's clusters; they depend on the
// service alone (and which of its hosts it owns), not on its endpoints.
func ServiceClusters(m *Mesh, s *Service, proxy Proxy) []*cluster.Cluster {
	if !s.routable() {
		return nil
	}
	var out []*cluster.Cluster
	for _, h := range m.Owned(s) {
		for _, p := range s.Spec.Ports {
			policy := effectivePolicy(s.Policy, nil, p.Number)
			c := outboundCluster(m, ClusterName(p.Number, "", h), p, policy, policy.GetLoadBalancer(), proxy)
			mutualTLS(c, m, s, h, p, "", policy, proxy)
			out = append(out, headless(dnsCluster(m, c, s, h, p, nil, proxy), s, p, proxy))
			for _, sub := range s.Policy.GetSubsets() {
				policy := effectivePolicy(s.Policy, sub, p.Number)
				c := outboundCluster(m, ClusterName(p.Number, sub.Name, h), p, policy, policy.GetLoadBalancer(), proxy)
				mutualTLS(c, m, s, h, p, sub.Name, policy, proxy)
				out = append(out, headless(dnsCluster(m, c, s, h, p, sub.Labels, proxy), s, p, proxy))
			}
		}
	}
	return out
}

// headless makes an Envoy's cluster of a headless Kubernetes service an
// original-destination one (see originalDestination); a proxyless client,
// which cannot follow an address it did not resolve itself, keeps the
// service's endpoints.
func headless(c *cluster.Cluster, s *Service, p *meshv1.Port, proxy Proxy) *cluster.Cluster {
	if proxy == Envoy && s.Spec.GetHeadless() && s.Spec.GetResolution() == meshv1.Resolution_RESOLUTION_STATIC {
		originalDestination(c, s, p)
	}
	return c
}

// effectivePolicy is the traffic policy of a service's port (and subset),
// as Istio merges them: the destination's, replaced as a whole by its
// settings for the port when it has some (what they leave out is the
// default, not inherited); then the subset's, each of its load balancer,
// connection pool, outlier detection and TLS that is set overriding, or,
// when the subset has settings for the port, all four replaced by those.
func effectivePolicy(tp *meshv1.TrafficPolicy, sub *meshv1.Subset, port uint32) *meshv1.TrafficPolicy {
	if tp == nil {
		return nil
	}
	out := &meshv1.TrafficPolicy{Host: tp.Host, LoadBalancer: tp.LoadBalancer, ConsistentHash: tp.ConsistentHash,
		ConnectionPool: tp.ConnectionPool, OutlierDetection: tp.OutlierDetection, Tls: tp.Tls, LocalityLb: tp.LocalityLb}
	if pp := portPolicy(tp.PortLevelSettings, port); pp != nil {
		out.LoadBalancer, out.ConsistentHash, out.LocalityLb = pp.LoadBalancer, pp.ConsistentHash, pp.LocalityLb
		out.ConnectionPool, out.OutlierDetection, out.Tls = pp.ConnectionPool, pp.OutlierDetection, pp.Tls
	}
	if sub == nil {
		return out
	}
	level := &meshv1.PortPolicy{LoadBalancer: sub.LoadBalancer, ConsistentHash: sub.ConsistentHash, LocalityLb: sub.LocalityLb,
		ConnectionPool: sub.ConnectionPool, OutlierDetection: sub.OutlierDetection, Tls: sub.Tls}
	whole := false
	if pp := portPolicy(sub.PortLevelSettings, port); pp != nil {
		level, whole = pp, true
	}
	if whole || level.LoadBalancer != meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED || level.ConsistentHash != nil || level.LocalityLb != nil {
		out.LoadBalancer, out.ConsistentHash, out.LocalityLb = level.LoadBalancer, level.ConsistentHash, level.LocalityLb
	}
	if whole || level.ConnectionPool != nil {
		out.ConnectionPool = level.ConnectionPool
	}
	if whole || level.OutlierDetection != nil {
		out.OutlierDetection = level.OutlierDetection
	}
	if whole || level.Tls != nil {
		out.Tls = level.Tls
	}
	return out
}

// portPolicy returns the settings for a port among a policy's, or nil.
func portPolicy(ps []*meshv1.PortPolicy, port uint32) *meshv1.PortPolicy {
	for _, pp := range ps {
		if pp.Port == port {
			return pp
		}
	}
	return nil
}

// dnsCluster makes the cluster of a DNS service resolve names itself
// instead of taking addresses over EDS (which never carries a hostname):
// STRICT_DNS over every endpoint for Istio's DNS, LOGICAL_DNS over the
// first for DNS_ROUND_ROBIN, as Istio generates them; the service's host
// itself on the port when it lists no endpoint. A proxyless gRPC client
// gets LOGICAL_DNS for both (grpc-go resolves one name). Clusters of other
// services are returned as they are.
func dnsCluster(m *Mesh, c *cluster.Cluster, s *Service, host string, p *meshv1.Port, subset map[string]string, proxy Proxy) *cluster.Cluster {
	if !ResolvesNames(s.Spec) {
		return c
	}
	res := s.Spec.Resolution
	cla := loadAssignment(c.Name, s, p, subset, meshv1.ClientTLS_MODE_DISABLE) // names, not workloads with sidecars
	if len(s.Endpoints) == 0 {
		cla.Endpoints = []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: socketAddress(host, p.Number)}}}}}}
	}
	kind := cluster.Cluster_STRICT_DNS
	if res == meshv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN || proxy == Proxyless {
		kind = cluster.Cluster_LOGICAL_DNS
		// One name: the first endpoint of the first locality.
		if len(cla.Endpoints) > 0 && len(cla.Endpoints[0].LbEndpoints) > 0 {
			first := cla.Endpoints[0]
			cla.Endpoints = []*endpoint.LocalityLbEndpoints{{Locality: first.Locality, LbEndpoints: first.LbEndpoints[:1]}}
		}
	}
	c.ClusterDiscoveryType = &cluster.Cluster_Type{Type: kind}
	c.EdsClusterConfig = nil
	c.LoadAssignment = cla
	c.DnsLookupFamily = cluster.Cluster_V4_ONLY
	if proxy == Envoy {
		// Resolved again as the answer's TTL says, every minute (the
		// mesh's dnsRefreshRate) when it carried none, with a little
		// jitter, through c-ares.
		//lint:ignore SA1019 the field istiod sets
		c.DnsRefreshRate, c.RespectDnsTtl = cmp.Or(m.Config.GetDnsRefreshRate(), dnsRefreshRate), true
		//lint:ignore SA1019 the field istiod sets
		c.DnsJitter = durationpb.New(100 * time.Millisecond)
		c.TypedDnsResolverConfig = &core.TypedExtensionConfig{Name: "envoy.network.dns_resolver.cares",
			TypedConfig: mustAny(&cares.CaresDnsResolverConfig{UdpMaxQueries: wrapperspb.UInt32(100)})}
	}
	return c
}

func outboundCluster(m *Mesh, name string, p *meshv1.Port, policy *meshv1.TrafficPolicy, lb meshv1.LoadBalancer, proxy Proxy) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		ConnectTimeout:       m.connectTimeout(),
		LbPolicy:             lbPolicy(lb, proxy),
	}
	if proxy == Envoy {
		c.CommonLbConfig = &cluster.Cluster_CommonLbConfig{}
		// An Envoy waits for the endpoints however long they take.
		c.EdsClusterConfig.EdsConfig.InitialFetchTimeout = durationpb.New(0)
	}
	if ch := policy.GetConsistentHash(); ch != nil {
		c.LbPolicy = cluster.Cluster_RING_HASH
		if size := ch.MinimumRingSize; size > 0 || proxy == Envoy {
			// An Envoy is told Envoy's own default, as istiod tells it.
			c.LbConfig = &cluster.Cluster_RingHashLbConfig_{RingHashLbConfig: &cluster.Cluster_RingHashLbConfig{
				MinimumRingSize: wrapperspb.UInt64(cmp.Or(size, 1024))}}
		}
	}
	cp := policy.GetConnectionPool()
	if cp.GetConnectTimeout() != nil {
		c.ConnectTimeout = cp.ConnectTimeout
	}
	switch {
	case proxy == Envoy:
		c.CircuitBreakers = circuitBreakers(cp)
	case cp.GetMaxRequests() > 0:
		// grpc-go enforces max_requests alone (gRFC A32).
		c.CircuitBreakers = &cluster.CircuitBreakers{Thresholds: []*cluster.CircuitBreakers_Thresholds{{MaxRequests: wrapperspb.UInt32(cp.MaxRequests)}}}
	}
	outlierDetection(c, policy.GetOutlierDetection())
	if proxy == Envoy {
		if opts := upstreamHTTPOptions(p, cp, m.Config.GetH2Upgrade()); opts != nil {
			c.TypedExtensionProtocolOptions = map[string]*anypb.Any{httpProtocolOptions: mustAny(opts)}
		}
	}
	if proxy == Envoy && localityWeighted(policy) {
		c.CommonLbConfig.LocalityConfigSpecifier = &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig_{
			LocalityWeightedLbConfig: &cluster.Cluster_CommonLbConfig_LocalityWeightedLbConfig{}}
	}
	c.TransportSocket = upstreamTLS(policy.GetTls(), proxy)
	return c
}

// speaksH2 reports whether an Envoy speaks HTTP/2 to a service port by
// its cluster's explicit protocol options (not when it follows its
// client's protocol): to gRPC and HTTP/2 ports, and to HTTP ports the
// policy upgrades or, where it says nothing, the mesh (meshUpgrade).
func speaksH2(p *meshv1.Port, cp *meshv1.ConnectionPool, meshUpgrade bool) bool {
	if cp.GetUseClientProtocol() {
		return false
	}
	policy := cp.GetH2UpgradePolicy()
	return p.Protocol == meshv1.Protocol_PROTOCOL_GRPC || p.Protocol == meshv1.Protocol_PROTOCOL_HTTP2 ||
		isHTTP(p) && (policy == meshv1.ConnectionPool_H2_UPGRADE_UPGRADE || policy == meshv1.ConnectionPool_H2_UPGRADE_DEFAULT && meshUpgrade)
}

// httpProtocolOptions is the key of a cluster's HTTP protocol options.
const httpProtocolOptions = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

// upstreamHTTPOptions are how an Envoy speaks HTTP to a service port, as
// istiod decides it: HTTP/2 to gRPC and HTTP/2 ports, and to HTTP ports
// the policy upgrades (or, where it says nothing, the mesh:
// meshUpgrade); the client's protocol when the policy says so; the
// connection pool's idle timeout and per-connection limits. nil leaves
// Envoy's default, HTTP/1.1.
func upstreamHTTPOptions(p *meshv1.Port, cp *meshv1.ConnectionPool, meshUpgrade bool) *upstreamhttp.HttpProtocolOptions {
	opts := &upstreamhttp.HttpProtocolOptions{}
	h2 := func() *core.Http2ProtocolOptions {
		o := &core.Http2ProtocolOptions{}
		if n := cp.GetMaxConcurrentStreams(); n > 0 {
			o.MaxConcurrentStreams = wrapperspb.UInt32(n)
		}
		return o
	}
	switch {
	case cp.GetUseClientProtocol():
		opts.UpstreamProtocolOptions = &upstreamhttp.HttpProtocolOptions_UseDownstreamProtocolConfig{
			UseDownstreamProtocolConfig: &upstreamhttp.HttpProtocolOptions_UseDownstreamHttpConfig{
				HttpProtocolOptions: &core.Http1ProtocolOptions{}, Http2ProtocolOptions: h2()}}
	case speaksH2(p, cp, meshUpgrade):
		opts.UpstreamProtocolOptions = &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: h2()}}}
	}
	if cp.GetIdleTimeout() != nil || cp.GetMaxRequestsPerConnection() > 0 || cp.GetMaxConnectionDuration() != nil {
		opts.CommonHttpProtocolOptions = &core.HttpProtocolOptions{IdleTimeout: cp.GetIdleTimeout(),
			MaxRequestsPerConnection: positive(cp.GetMaxRequestsPerConnection()), MaxConnectionDuration: cp.GetMaxConnectionDuration()}
	}
	if opts.UpstreamProtocolOptions == nil && opts.CommonHttpProtocolOptions == nil {
		return nil
	}
	if opts.UpstreamProtocolOptions == nil {
		// Envoy requires a protocol with the options: HTTP/1.1.
		opts.UpstreamProtocolOptions = &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_{
			ExplicitHttpConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig{
				ProtocolConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_HttpProtocolOptions{HttpProtocolOptions: &core.Http1ProtocolOptions{}}}}
	}
	return opts
}

// positive wraps a limit, leaving zero (unset) out.
func positive(v uint32) *wrapperspb.UInt32Value {
	if v == 0 {
		return nil
	}
	return wrapperspb.UInt32(v)
}

// upstreamTLS originates TLS to the service as its policy asks, but for an
// Envoy's Istio mutual TLS, which mutualTLS sets. An Envoy's MUTUAL
// certificate comes over SDS on the ADS stream ("default", or the
// credential's), and SIMPLE and MUTUAL validate against the system's
// roots. A proxyless gRPC client gets ISTIO_MUTUAL alone, as Istio
// generates for it, from its bootstrap's certificate provider "default"
// (files an agent keeps current): grpc-go takes certificates from
// providers alone.
func upstreamTLS(t *meshv1.ClientTLS, proxy Proxy) *core.TransportSocket {
	switch mode := t.GetMode(); {
	case mode == meshv1.ClientTLS_MODE_UNSPECIFIED, mode == meshv1.ClientTLS_MODE_DISABLE:
		return nil
	case proxy == Proxyless && mode != meshv1.ClientTLS_MODE_ISTIO_MUTUAL:
		return nil
	case proxy == Envoy && mode == meshv1.ClientTLS_MODE_ISTIO_MUTUAL:
		return nil // see mutualTLS
	}
	ctx := &tlsv3.UpstreamTlsContext{Sni: t.Sni, CommonTlsContext: &tlsv3.CommonTlsContext{}}
	switch t.Mode {
	case meshv1.ClientTLS_MODE_ISTIO_MUTUAL:
		ctx.CommonTlsContext = meshCertificates(Proxyless, false)
	case meshv1.ClientTLS_MODE_MUTUAL:
		name := "default"
		if t.CredentialName != "" {
			name = CredentialResource(t.CredentialName)
		}
		ctx.CommonTlsContext.TlsCertificateSdsSecretConfigs = []*tlsv3.SdsSecretConfig{sdsSecret(name)}
	}
	verifySubjectAltNames(ctx.CommonTlsContext, t, proxy)
	return tlsSocket(ctx)
}

// verifySubjectAltNames makes the client accept only a server certificate
// that names one of the policy's subject alt names, as Istio does: exact
// URI names (SPIFFE IDs) or DNS names. Envoy checks them against the
// system's roots (SIMPLE, MUTUAL), which it needs to verify names at all;
// grpc-go against its provider's root.
func verifySubjectAltNames(common *tlsv3.CommonTlsContext, t *meshv1.ClientTLS, proxy Proxy) {
	if len(t.GetSubjectAltNames()) == 0 {
		return
	}
	if proxy == Proxyless {
		v := common.GetValidationContext()
		for _, san := range t.SubjectAltNames {
			//lint:ignore SA1019 the field istiod sets
			v.MatchSubjectAltNames = append(v.MatchSubjectAltNames, &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: san}})
		}
		return
	}
	names := &tlsv3.CertificateValidationContext{}
	for _, san := range t.SubjectAltNames {
		kind := tlsv3.SubjectAltNameMatcher_DNS
		if strings.Contains(san, "://") {
			kind = tlsv3.SubjectAltNameMatcher_URI
		}
		names.MatchTypedSubjectAltNames = append(names.MatchTypedSubjectAltNames, &tlsv3.SubjectAltNameMatcher{SanType: kind,
			Matcher: &matcher.StringMatcher{MatchPattern: &matcher.StringMatcher_Exact{Exact: san}}})
	}
	names.TrustedCa = &core.DataSource{Specifier: &core.DataSource_Filename{Filename: SystemRoots}}
	common.ValidationContextType = &tlsv3.CommonTlsContext_ValidationContext{ValidationContext: names}
}

// workloadSecret is a workload secret ("default", "ROOTCA") an Envoy
// fetches over SDS: from Istio's agent on its sds-grpc cluster (agent), as
// istiod configures it, else from the pushers on its ADS stream.
func workloadSecret(name string, agent bool) *tlsv3.SdsSecretConfig {
	if !agent {
		return sdsSecret(name)
	}
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: &core.ConfigSource{
		ResourceApiVersion:  core.ApiVersion_V3,
		InitialFetchTimeout: durationpb.New(0),
		ConfigSourceSpecifier: &core.ConfigSource_ApiConfigSource{ApiConfigSource: &core.ApiConfigSource{
			ApiType: core.ApiConfigSource_GRPC, SetNodeOnFirstMessageOnly: true, TransportApiVersion: core.ApiVersion_V3,
			GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: "sds-grpc"}}}},
		}},
	}}
}

// sdsSecret is a secret an Envoy fetches over SDS on its ADS stream.
func sdsSecret(name string) *tlsv3.SdsSecretConfig {
	return &tlsv3.SdsSecretConfig{Name: name, SdsConfig: ads()}
}

// meshCertificates is a proxy's own workload certificate and the mesh's
// root it validates peers with, under Istio's names: for an Envoy the SDS
// secrets "default" and "ROOTCA", for a proxyless gRPC client or server its
// bootstrap's certificate provider "default".
func meshCertificates(proxy Proxy, agent bool) *tlsv3.CommonTlsContext {
	if proxy == Proxyless {
		provider := func(name string) *tlsv3.CertificateProviderPluginInstance {
			return &tlsv3.CertificateProviderPluginInstance{InstanceName: "default", CertificateName: name}
		}
		return &tlsv3.CommonTlsContext{
			TlsCertificateProviderInstance: provider("default"),
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContext{
				ValidationContext: &tlsv3.CertificateValidationContext{CaCertificateProviderInstance: provider("ROOTCA")}},
		}
	}
	return &tlsv3.CommonTlsContext{
		TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{workloadSecret("default", agent)},
		ValidationContextType:          &tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig{ValidationContextSdsSecretConfig: workloadSecret("ROOTCA", agent)},
	}
}

func tlsSocket(ctx proto.Message) *core.TransportSocket {
	return &core.TransportSocket{Name: "envoy.transport_sockets.tls", ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(ctx)}}
}

// lbPolicy maps a load balancer to Envoy's; an Envoy balances by least
// request unless told otherwise, as istiod has it. grpc-go knows only round
// robin, ring hash and least request, so proxyless clients get round robin
// for the rest (its default, as istiod leaves it).
func lbPolicy(lb meshv1.LoadBalancer, proxy Proxy) cluster.Cluster_LbPolicy {
	switch lb {
	case meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST:
		return cluster.Cluster_LEAST_REQUEST
	case meshv1.LoadBalancer_LOAD_BALANCER_RANDOM:
		if proxy == Envoy {
			return cluster.Cluster_RANDOM
		}
	case meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED:
		if proxy == Envoy {
			return cluster.Cluster_LEAST_REQUEST
		}
	}
	return cluster.Cluster_ROUND_ROBIN
}
