package generate

import (
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// ads is the config source every generated resource points to.
func ads() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

// Clusters returns the outbound EDS clusters of every service: one per
// hostname and port, and one more per subset of its traffic policy.
func Clusters(m *Mesh, proxy Proxy) []*cluster.Cluster {
	var out []*cluster.Cluster
	for _, s := range m.Services {
		if s.Spec.Resolution == meshv1.Resolution_RESOLUTION_NONE && len(s.Endpoints) == 0 {
			// Passthrough services have no endpoints to balance over.
			continue
		}
		for _, h := range s.Spec.Hostnames {
			if m.Service(h) != s {
				continue
			}
			for _, p := range s.Spec.Ports {
				out = append(out, outboundCluster(ClusterName(p.Number, "", h), p, s.Policy.GetLoadBalancer(), proxy))
				for _, sub := range s.Policy.GetSubsets() {
					lb := sub.LoadBalancer
					if lb == meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED {
						lb = s.Policy.GetLoadBalancer()
					}
					out = append(out, outboundCluster(ClusterName(p.Number, sub.Name, h), p, lb, proxy))
				}
			}
		}
	}
	return out
}

func outboundCluster(name string, p *meshv1.Port, lb meshv1.LoadBalancer, proxy Proxy) *cluster.Cluster {
	c := &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		ConnectTimeout:       durationpb.New(10 * time.Second),
		LbPolicy:             lbPolicy(lb, proxy),
	}
	if proxy == Envoy && (p.Protocol == meshv1.Protocol_PROTOCOL_GRPC || p.Protocol == meshv1.Protocol_PROTOCOL_HTTP2) {
		opts, _ := anypb.New(&upstreamhttp.HttpProtocolOptions{
			UpstreamProtocolOptions: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_{
				ExplicitHttpConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig{
					ProtocolConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{
						Http2ProtocolOptions: &core.Http2ProtocolOptions{},
					},
				},
			},
		})
		c.TypedExtensionProtocolOptions = map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts}
	}
	return c
}

// lbPolicy maps a load balancer to Envoy's; grpc-go knows only round robin,
// ring hash and least request, so proxyless clients get round robin for the rest.
func lbPolicy(lb meshv1.LoadBalancer, proxy Proxy) cluster.Cluster_LbPolicy {
	switch lb {
	case meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST:
		return cluster.Cluster_LEAST_REQUEST
	case meshv1.LoadBalancer_LOAD_BALANCER_RANDOM:
		if proxy == Envoy {
			return cluster.Cluster_RANDOM
		}
	}
	return cluster.Cluster_ROUND_ROBIN
}
