package istiod

import (
	"context"
	"fmt"
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// Config is what one proxy was sent: clusters, their load assignments,
// listeners and the route configurations they name, by name.
type Config struct {
	Clusters    map[string]*cluster.Cluster
	Endpoints   map[string]*endpoint.ClusterLoadAssignment
	Listeners   map[string]*listener.Listener
	RouteConfig map[string]*route.RouteConfiguration
}

// Fetch asks a control plane at addr (plaintext ADS) for a proxy's whole
// configuration, in the order an Envoy asks: clusters, their endpoints,
// listeners, their routes.
func Fetch(ctx context.Context, addr string, node *core.Node) (*Config, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, fmt.Errorf("ads %s: %w", addr, err)
	}
	s := &session{stream: stream, node: node}
	out := &Config{Clusters: map[string]*cluster.Cluster{}, Endpoints: map[string]*endpoint.ClusterLoadAssignment{},
		Listeners: map[string]*listener.Listener{}, RouteConfig: map[string]*route.RouteConfiguration{}}
	if err := collect(s, resource.ClusterType, nil, out.Clusters, (*cluster.Cluster).GetName); err != nil {
		return nil, err
	}
	edsNames := []string{} // by name: none asks for none
	for _, c := range out.Clusters {
		if c.GetType() == cluster.Cluster_EDS {
			edsNames = append(edsNames, edsName(c))
		}
	}
	if err := collect(s, resource.EndpointType, edsNames, out.Endpoints, (*endpoint.ClusterLoadAssignment).GetClusterName); err != nil {
		return nil, err
	}
	if err := collect(s, resource.ListenerType, nil, out.Listeners, (*listener.Listener).GetName); err != nil {
		return nil, err
	}
	rdsNames := []string{}
	for _, l := range out.Listeners {
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				m := &hcm.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(m) == nil && m.GetRds().GetRouteConfigName() != "" {
					rdsNames = append(rdsNames, m.GetRds().GetRouteConfigName())
				}
			}
		}
	}
	slices.Sort(rdsNames)
	if err := collect(s, resource.RouteType, slices.Compact(rdsNames), out.RouteConfig, (*route.RouteConfiguration).GetName); err != nil {
		return nil, err
	}
	return out, nil
}

// collect asks for the resources of a type (names nil: all of them; none
// at all: nothing is asked) and keeps those of the answer in into, by key.
func collect[T proto.Message](s *session, typeURL string, names []string, into map[string]T, key func(T) string) error {
	if names != nil && len(names) == 0 {
		return nil
	}
	return s.get(typeURL, names, func(a *anypb.Any) error {
		m, err := a.UnmarshalNew()
		if err != nil {
			return err
		}
		r, ok := m.(T)
		if !ok {
			return fmt.Errorf("a %s among the %s answer", a.TypeUrl, typeURL)
		}
		into[key(r)] = r
		return nil
	})
}

func edsName(c *cluster.Cluster) string {
	if n := c.GetEdsClusterConfig().GetServiceName(); n != "" {
		return n
	}
	return c.Name
}

type session struct {
	stream   discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	node     *core.Node
	sentNode bool
}

// get subscribes to a type (names nil: all of them) and hands each
// resource of its first answer to fn, ACKing every answer it reads.
func (s *session) get(typeURL string, names []string, fn func(*anypb.Any) error) error {
	req := &discovery.DiscoveryRequest{TypeUrl: typeURL, ResourceNames: names}
	if !s.sentNode {
		req.Node, s.sentNode = s.node, true
	}
	if err := s.stream.Send(req); err != nil {
		return fmt.Errorf("ads: ask for %s: %w", typeURL, err)
	}
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			return fmt.Errorf("ads: %s: %w", typeURL, err)
		}
		ack := &discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		if resp.TypeUrl == typeURL {
			ack.ResourceNames = names
		} else {
			// Another type's push (istiod pushes what it has): keep its
			// subscription as it is by naming what was sent.
			for _, a := range resp.Resources {
				ack.ResourceNames = append(ack.ResourceNames, resourceName(a))
			}
			if resp.TypeUrl == resource.ClusterType || resp.TypeUrl == resource.ListenerType {
				ack.ResourceNames = nil
			}
		}
		if err := s.stream.Send(ack); err != nil {
			return fmt.Errorf("ads: ack %s: %w", resp.TypeUrl, err)
		}
		if resp.TypeUrl != typeURL {
			continue
		}
		for _, a := range resp.Resources {
			if err := fn(a); err != nil {
				return fmt.Errorf("ads: %s: %w", typeURL, err)
			}
		}
		return nil
	}
}

func resourceName(a *anypb.Any) string {
	m, err := a.UnmarshalNew()
	if err != nil {
		return ""
	}
	type named interface{ GetName() string }
	if n, ok := m.(named); ok {
		return n.GetName()
	}
	if la, ok := m.(*endpoint.ClusterLoadAssignment); ok {
		return la.ClusterName
	}
	return ""
}
