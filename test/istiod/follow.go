package istiod

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

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
)

// Follower holds one proxy's ADS stream open, as Envoy does: clusters and
// listeners by wildcard, the load assignments and route configurations
// they name by name, every answer ACKed and the subscriptions moved as
// the clusters and listeners change. Config is what it holds now: what a
// proxy that connected before the changes were made ends up with.
type Follower struct {
	node *core.Node
	// listeners are the listeners a proxyless client asks for by name (a
	// target each, host:port), nil for an Envoy: it then walks from them
	// to their route configurations, their clusters and their load
	// assignments, as grpc-go's xDS client does.
	listeners []string
	client    discovery.AggregatedDiscoveryServiceClient
	conn      *grpc.ClientConn
	cancel    context.CancelFunc
	done      chan struct{}

	mu  sync.Mutex
	cfg Config
	// answers counts the responses read, streams those opened; err is
	// why the follower stopped.
	answers, streams int
	err              error
}

// Follow opens a proxy's stream to a control plane at addr (plaintext
// ADS) and keeps it open, opening it again when the control plane ends it
// (as the pushers do when a proxy's class changes); Close ends it.
func Follow(ctx context.Context, addr string, node *core.Node) (*Follower, error) {
	return followStream(ctx, addr, node, nil)
}

// FollowProxyless opens the stream of a proxyless gRPC client dialling
// the targets (xds:///host:port), as Follow opens an Envoy's.
func FollowProxyless(ctx context.Context, addr string, node *core.Node, targets []string) (*Follower, error) {
	return followStream(ctx, addr, node, slices.Sorted(slices.Values(targets)))
}

func followStream(ctx context.Context, addr string, node *core.Node, listeners []string) (*Follower, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Follower{node: node, listeners: listeners, client: discovery.NewAggregatedDiscoveryServiceClient(conn), conn: conn, cancel: cancel,
		done: make(chan struct{}), cfg: Config{
			Clusters: map[string]*cluster.Cluster{}, Endpoints: map[string]*endpoint.ClusterLoadAssignment{},
			Listeners: map[string]*listener.Listener{}, RouteConfig: map[string]*route.RouteConfiguration{}}}
	go f.run(ctx)
	return f, nil
}

// Close ends the stream and waits for its reader.
func (f *Follower) Close() {
	f.cancel()
	<-f.done
	f.conn.Close()
}

// Config returns a copy of what the proxy holds now, and the number of
// answers it has read; a follower that stopped returns why.
func (f *Follower) Config() (*Config, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.answers, f.err
	}
	return &Config{Clusters: maps.Clone(f.cfg.Clusters), Endpoints: maps.Clone(f.cfg.Endpoints),
		Listeners: maps.Clone(f.cfg.Listeners), RouteConfig: maps.Clone(f.cfg.RouteConfig)}, f.answers, nil
}

// Config is what one proxy was sent: clusters, their load assignments,
// listeners and the route configurations they name, by name.
type Config struct {
	Clusters    map[string]*cluster.Cluster
	Endpoints   map[string]*endpoint.ClusterLoadAssignment
	Listeners   map[string]*listener.Listener
	RouteConfig map[string]*route.RouteConfiguration
}

// edsName is the load assignment an EDS cluster names.
func edsName(c *cluster.Cluster) string {
	if n := c.GetEdsClusterConfig().GetServiceName(); n != "" {
		return n
	}
	return c.Name
}

// subscription is what the follower asks of a type named by name, and the
// version and nonce of its last answer.
type subscription struct {
	names          []string
	version, nonce string
}

// badAnswer is an answer no Envoy would take: the follower stops on it,
// where it opens a stream again on any other end.
type badAnswer struct{ error }

// reopen is how long the follower waits before opening a stream the
// control plane ended.
const reopen = 100 * time.Millisecond

func (f *Follower) run(ctx context.Context) {
	defer close(f.done)
	subs := map[string]*subscription{resource.ClusterType: {}, resource.ListenerType: {},
		resource.EndpointType: {names: []string{}}, resource.RouteType: {names: []string{}}}
	if f.listeners != nil {
		subs[resource.ListenerType].names, subs[resource.ClusterType].names = f.listeners, []string{}
	}
	for {
		err := f.follow(ctx, subs)
		if ctx.Err() != nil {
			return
		}
		var bad badAnswer
		if errors.As(err, &bad) {
			f.mu.Lock()
			f.err = fmt.Errorf("the proxy's stream ended: %w", err)
			f.mu.Unlock()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(reopen):
		}
	}
}

// follow opens a stream, asks for what the proxy subscribes to, saying
// the versions it holds as Envoy does when it reconnects, and takes every
// answer in until the stream ends.
func (f *Follower) follow(ctx context.Context, subs map[string]*subscription) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := f.client.StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.streams++
	f.mu.Unlock()
	for _, sub := range subs {
		sub.nonce = "" // a nonce names an answer of the stream that sent it
	}
	// What the clusters and listeners held name is asked for, as Envoy
	// asks for what its warming clusters name: the stream may have ended
	// between their answer and the request that follows it.
	if f.streams > 1 {
		subs[resource.EndpointType].names, subs[resource.RouteType].names = f.edsNames(), f.rdsNames()
		if f.listeners != nil {
			subs[resource.ClusterType].names = f.cdsNames()
		}
	}
	first := true
	for _, typeURL := range []string{resource.ClusterType, resource.ListenerType, resource.EndpointType, resource.RouteType} {
		sub := subs[typeURL]
		if sub.names != nil && len(sub.names) == 0 {
			continue
		}
		req := &discovery.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: sub.version, ResourceNames: sub.names}
		if first {
			req.Node, first = f.node, false
		}
		if err := stream.Send(req); err != nil {
			return err
		}
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		sub := subs[resp.TypeUrl]
		if sub == nil {
			return badAnswer{fmt.Errorf("an answer of type %s, which was not asked for", resp.TypeUrl)}
		}
		if err := f.apply(resp, sub.names); err != nil {
			return badAnswer{err}
		}
		sub.version, sub.nonce = resp.VersionInfo, resp.Nonce
		if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo,
			ResponseNonce: resp.Nonce, ResourceNames: sub.names}); err != nil {
			return err
		}
		// New clusters or listeners name new load assignments or route
		// configurations: ask for those, as Envoy does.
		var typeURL string
		var names []string
		switch resp.TypeUrl {
		case resource.ClusterType:
			typeURL, names = resource.EndpointType, f.edsNames()
		case resource.ListenerType:
			typeURL, names = resource.RouteType, f.rdsNames()
		case resource.RouteType:
			if f.listeners == nil {
				continue
			}
			typeURL, names = resource.ClusterType, f.cdsNames()
		default:
			continue
		}
		if dep := subs[typeURL]; !slices.Equal(dep.names, names) {
			dep.names = names
			if err := stream.Send(&discovery.DiscoveryRequest{TypeUrl: typeURL, VersionInfo: dep.version,
				ResponseNonce: dep.nonce, ResourceNames: names}); err != nil {
				return err
			}
		}
	}
}

// apply takes an answer in: a state of the world of its type, of the names
// subscribed where the type is asked by name.
func (f *Follower) apply(resp *discovery.DiscoveryResponse, names []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers++
	switch resp.TypeUrl {
	case resource.ClusterType:
		return replace(resp, f.cfg.Clusters, (*cluster.Cluster).GetName)
	case resource.ListenerType:
		return replace(resp, f.cfg.Listeners, (*listener.Listener).GetName)
	case resource.EndpointType:
		return update(resp, names, f.cfg.Endpoints, (*endpoint.ClusterLoadAssignment).GetClusterName)
	default:
		return update(resp, names, f.cfg.RouteConfig, (*route.RouteConfiguration).GetName)
	}
}

// replace makes into the answer's resources.
func replace[T proto.Message](resp *discovery.DiscoveryResponse, into map[string]T, key func(T) string) error {
	clear(into)
	return update(resp, nil, into, key)
}

// update keeps the answer's resources in into and drops those no longer
// named (names nil: keeps the rest).
func update[T proto.Message](resp *discovery.DiscoveryResponse, names []string, into map[string]T, key func(T) string) error {
	for _, a := range resp.Resources {
		m, err := a.UnmarshalNew()
		if err != nil {
			return err
		}
		r, ok := m.(T)
		if !ok {
			return fmt.Errorf("a %s among the %s answer", a.TypeUrl, resp.TypeUrl)
		}
		into[key(r)] = r
	}
	if names != nil {
		for k := range into {
			if !slices.Contains(names, k) {
				delete(into, k)
			}
		}
	}
	return nil
}

// edsNames are the load assignments the clusters held name, sorted.
func (f *Follower) edsNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := []string{}
	for _, c := range f.cfg.Clusters {
		if c.GetType() == cluster.Cluster_EDS {
			names = append(names, edsName(c))
		}
	}
	slices.Sort(names)
	return names
}

// rdsNames are the route configurations the listeners held name, sorted.
func (f *Follower) rdsNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := []string{}
	for _, l := range f.cfg.Listeners {
		names = append(names, routeNames(l)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// cdsNames are the clusters the route configurations held send to, sorted.
func (f *Follower) cdsNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := []string{}
	for _, rc := range f.cfg.RouteConfig {
		for _, vh := range rc.VirtualHosts {
			for _, r := range vh.Routes {
				if c := r.GetRoute().GetCluster(); c != "" {
					names = append(names, c)
				}
				for _, w := range r.GetRoute().GetWeightedClusters().GetClusters() {
					names = append(names, w.Name)
				}
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// routeNames are the route configurations a listener's HTTP connection
// managers name (an API listener's, for a proxyless client).
func routeNames(l *listener.Listener) []string {
	var names []string
	if api := l.GetApiListener().GetApiListener(); api != nil {
		m := &hcm.HttpConnectionManager{}
		if api.UnmarshalTo(m) == nil && m.GetRds().GetRouteConfigName() != "" {
			names = append(names, m.GetRds().GetRouteConfigName())
		}
	}
	chains := l.FilterChains
	if l.DefaultFilterChain != nil {
		chains = append(slices.Clip(chains), l.DefaultFilterChain)
	}
	for _, fc := range chains {
		for _, flt := range fc.Filters {
			m := &hcm.HttpConnectionManager{}
			if flt.GetTypedConfig().UnmarshalTo(m) == nil && m.GetRds().GetRouteConfigName() != "" {
				names = append(names, m.GetRds().GetRouteConfigName())
			}
		}
	}
	return names
}
