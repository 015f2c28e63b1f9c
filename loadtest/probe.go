package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
)

// probe is one SotW ADS client of a pusher that keeps, decoded, the
// clusters, listeners and route configurations it is sent (no
// endpoints): what a heavy input did to a proxy's configuration, and
// whether two pushers serve the same one.
type probe struct {
	addr string
	node *core.Node

	mu       sync.Mutex
	clusters map[string]*cluster.Cluster
	routes   map[string]*route.RouteConfiguration
	// listeners are kept as sent, for the digest.
	listeners map[string]*anypb.Any
}

func newProbe(addr, ns string) *probe {
	return &probe{addr: addr, node: &core.Node{Id: "sidecar~10.99.0.2~probe." + ns + "~" + ns + ".svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(ns)}}}}
}

// run keeps a stream open until ctx is done, opening it again when it breaks.
func (p *probe) run(ctx context.Context) {
	for ctx.Err() == nil {
		_ = p.stream(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (p *probe) stream(ctx context.Context) error {
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(1<<30)))
	if err != nil {
		return err
	}
	defer conn.Close()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	node := p.node
	versions := map[string]string{}
	var rds []string
	request := func(typ string, names []string, nonce string) error {
		err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typ, VersionInfo: versions[typ], ResourceNames: names, ResponseNonce: nonce})
		node = nil
		return err
	}
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := request(typ, nil, ""); err != nil {
			return err
		}
	}
	for {
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		versions[resp.TypeUrl] = resp.VersionInfo
		var names []string
		switch resp.TypeUrl {
		case resource.ClusterType:
			p.keepClusters(resp.Resources)
		case resource.ListenerType:
			if want := p.keepListeners(resp.Resources); !slices.Equal(want, rds) {
				rds = want
				if err := request(resource.RouteType, rds, ""); err != nil {
					return err
				}
			}
		case resource.RouteType:
			p.keepRoutes(resp.Resources)
			names = rds
		}
		if err := request(resp.TypeUrl, names, resp.Nonce); err != nil {
			return err
		}
	}
}

func (p *probe) keepClusters(rs []*anypb.Any) {
	held := make(map[string]*cluster.Cluster, len(rs))
	for _, a := range rs {
		c := &cluster.Cluster{}
		if a.UnmarshalTo(c) == nil {
			held[c.Name] = c
		}
	}
	p.mu.Lock()
	p.clusters = held
	p.mu.Unlock()
}

// keepListeners keeps the listeners and returns the route configurations
// their HTTP connection managers name, sorted.
func (p *probe) keepListeners(rs []*anypb.Any) []string {
	held := make(map[string]*anypb.Any, len(rs))
	var rds []string
	for _, a := range rs {
		l := &listener.Listener{}
		if a.UnmarshalTo(l) != nil {
			continue
		}
		held[l.Name] = a
		for _, fc := range append(slices.Clone(l.FilterChains), l.DefaultFilterChain) {
			for _, f := range fc.GetFilters() {
				m := &hcm.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(m) == nil && m.GetRds() != nil {
					rds = append(rds, m.GetRds().RouteConfigName)
				}
			}
		}
	}
	slices.Sort(rds)
	p.mu.Lock()
	p.listeners = held
	p.mu.Unlock()
	return slices.Compact(rds)
}

func (p *probe) keepRoutes(rs []*anypb.Any) {
	held := make(map[string]*route.RouteConfiguration, len(rs))
	for _, a := range rs {
		rc := &route.RouteConfiguration{}
		if a.UnmarshalTo(rc) == nil {
			held[rc.Name] = rc
		}
	}
	p.mu.Lock()
	p.routes = held
	p.mu.Unlock()
}

// view is what a probe holds at one moment.
type view struct {
	clusters map[string]*cluster.Cluster
	routes   map[string]*route.RouteConfiguration
	// hashes holds each resource's hash by type and name, and digest
	// all of them: two pushers serving the same configuration give alike.
	hashes map[string]string
	digest string
}

// view returns what the probe holds.
func (p *probe) view() view {
	p.mu.Lock()
	v := view{clusters: p.clusters, routes: p.routes, hashes: map[string]string{}}
	listeners := p.listeners
	p.mu.Unlock()
	opts := proto.MarshalOptions{Deterministic: true}
	add := func(key string, m proto.Message) {
		b, _ := opts.Marshal(m)
		sum := sha256.Sum256(b)
		v.hashes[key] = hex.EncodeToString(sum[:8])
	}
	for name, c := range v.clusters {
		add("cluster "+name, c)
	}
	for name, a := range listeners {
		l := &listener.Listener{}
		if a.UnmarshalTo(l) == nil {
			add("listener "+name, l)
		}
	}
	for name, rc := range v.routes {
		add("route configuration "+name, rc)
	}
	h := sha256.New()
	for _, k := range sortedKeys(v.hashes) {
		h.Write([]byte(k + "=" + v.hashes[k] + "\n"))
	}
	v.digest = hex.EncodeToString(h.Sum(nil))
	return v
}

// differ names a resource two views hold differently ("" when none does).
func differ(a, b view) string {
	for _, k := range sortedKeys(a.hashes) {
		if a.hashes[k] != b.hashes[k] {
			return k
		}
	}
	for _, k := range sortedKeys(b.hashes) {
		if _, ok := a.hashes[k]; !ok {
			return k
		}
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
