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
// endpoints), each with a hash of its content: what a heavy input did to
// a proxy's configuration, and whether two pushers serve the same one.
type probe struct {
	addr string
	node *core.Node

	mu sync.Mutex
	v  view
}

// view is what a probe holds at one moment. Each type's map is replaced
// whole by the next response of that type, never changed in place.
type view struct {
	clusters  map[string]*cluster.Cluster
	listeners map[string]*listener.Listener
	routes    map[string]*route.RouteConfiguration
	// hashes holds each type's resources' hashes by name.
	hashes map[string]map[string]string
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
			clusters, hashes := decode(resp.Resources, (*cluster.Cluster).GetName)
			p.keep(resp.TypeUrl, hashes, func(v *view) { v.clusters = clusters })
		case resource.ListenerType:
			listeners, hashes := decode(resp.Resources, (*listener.Listener).GetName)
			p.keep(resp.TypeUrl, hashes, func(v *view) { v.listeners = listeners })
			if want := routeNames(listeners); !slices.Equal(want, rds) {
				rds = want
				if err := request(resource.RouteType, rds, ""); err != nil {
					return err
				}
			}
		case resource.RouteType:
			routes, hashes := decode(resp.Resources, (*route.RouteConfiguration).GetName)
			p.keep(resp.TypeUrl, hashes, func(v *view) { v.routes = routes })
			names = rds
		}
		if err := request(resp.TypeUrl, names, resp.Nonce); err != nil {
			return err
		}
	}
}

// decode decodes a response's resources of one type by name, with the
// hash of each one's content (encoded deterministically: two pushers'
// equal resources hash alike whatever order their maps had).
func decode[T any, M interface {
	*T
	proto.Message
}](rs []*anypb.Any, name func(M) string) (map[string]M, map[string]string) {
	out, hashes := make(map[string]M, len(rs)), make(map[string]string, len(rs))
	opts := proto.MarshalOptions{Deterministic: true}
	for _, a := range rs {
		m := M(new(T))
		if a.UnmarshalTo(m) != nil {
			continue
		}
		b, _ := opts.Marshal(m)
		sum := sha256.Sum256(b)
		out[name(m)], hashes[name(m)] = m, hex.EncodeToString(sum[:8])
	}
	return out, hashes
}

// keep replaces what the probe holds of one type.
func (p *probe) keep(typ string, hashes map[string]string, set func(*view)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	set(&p.v)
	all := make(map[string]map[string]string, len(p.v.hashes)+1)
	for t, h := range p.v.hashes {
		all[t] = h
	}
	all[typ] = hashes
	p.v.hashes = all
}

// routeNames returns the route configurations the listeners' HTTP
// connection managers name, sorted.
func routeNames(listeners map[string]*listener.Listener) []string {
	var rds []string
	for _, l := range listeners {
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
	return slices.Compact(rds)
}

// view returns what the probe holds.
func (p *probe) view() view {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.v
}

// differ names a resource two views hold differently ("" when none does).
func differ(a, b view) string {
	for _, typ := range sortedKeys(a.hashes) {
		for _, name := range sortedKeys(a.hashes[typ]) {
			if a.hashes[typ][name] != b.hashes[typ][name] {
				return typ + " " + name
			}
		}
	}
	for _, typ := range sortedKeys(b.hashes) {
		for _, name := range sortedKeys(b.hashes[typ]) {
			if _, ok := a.hashes[typ][name]; !ok {
				return typ + " " + name
			}
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
