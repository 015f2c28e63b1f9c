package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"

	// The types the pushers generate, so that the typed configurations
	// inside listeners and clusters decode.
	_ "github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// kinds maps what proxy-config accepts to the dump's message names.
var kinds = map[string]string{
	"clusters": "Cluster", "cluster": "Cluster", "cds": "Cluster",
	"listeners": "Listener", "listener": "Listener", "lds": "Listener",
	"routes": "RouteConfiguration", "route": "RouteConfiguration", "rds": "RouteConfiguration",
	"endpoints": "ClusterLoadAssignment", "endpoint": "ClusterLoadAssignment", "eds": "ClusterLoadAssignment",
}

// proxyConfig prints what one proxy is served of one type, from the
// config dump of the pusher it is connected to.
func proxyConfig(ctx context.Context, o *options, args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("want <proxy> clusters|routes|listeners|endpoints, got %q", args)
	}
	proxy, what := args[0], args[1]
	if _, ok := kinds[strings.ToLower(proxy)]; ok {
		// istioctl's order: the type first.
		proxy, what = what, proxy
	}
	kind, ok := kinds[strings.ToLower(what)]
	if !ok {
		return fmt.Errorf("%q: want clusters, routes, listeners or endpoints", what)
	}
	rows, askErr := resolve(ctx, o, proxy)
	if len(rows) == 0 {
		if askErr != nil {
			return askErr
		}
		return fmt.Errorf("proxy %q is connected to no pusher", proxy)
	}
	at := rows[0]
	var dump struct {
		Resources map[string][]json.RawMessage `json:"resources"`
	}
	if err := o.get(ctx, pusherOf(at), "/debug/config_dump?proxy="+url.QueryEscape(at.Proxy), &dump); err != nil {
		return fmt.Errorf("pusher %s (%s): %w", at.Pusher, at.Admin, err)
	}
	raw := dump.Resources[kind]
	if o.output != "table" {
		if raw == nil {
			raw = []json.RawMessage{}
		}
		return writeOutput(o, raw)
	}
	switch kind {
	case "Cluster":
		return clusters(o, raw)
	case "Listener":
		return listeners(o, raw)
	case "RouteConfiguration":
		return routes(o, raw)
	}
	return endpoints(o, raw)
}

// decode reads each resource of a dump into a new T.
func decode[T proto.Message](raw []json.RawMessage, fresh func() T) ([]T, error) {
	out := make([]T, 0, len(raw))
	for i, b := range raw {
		m := fresh()
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, m); err != nil {
			return nil, fmt.Errorf("resource %d of the dump: %w", i, err)
		}
		out = append(out, m)
	}
	return out, nil
}

func clusters(o *options, raw []json.RawMessage) error {
	cs, err := decode(raw, func() *cluster.Cluster { return &cluster.Cluster{} })
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "EDS SERVICE")
	for _, c := range cs {
		typ := c.GetType().String()
		if c.GetClusterType() != nil {
			typ = c.GetClusterType().GetName()
		}
		// Istio's names: direction|port|subset|host.
		if parts := strings.Split(c.GetName(), "|"); len(parts) == 4 {
			t.row(parts[3], parts[1], parts[2], parts[0], typ, c.GetEdsClusterConfig().GetServiceName())
		} else {
			t.row(c.GetName(), "", "", "", typ, c.GetEdsClusterConfig().GetServiceName())
		}
	}
	return t.flush()
}

func listeners(o *options, raw []json.RawMessage) error {
	ls, err := decode(raw, func() *listener.Listener { return &listener.Listener{} })
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "NAME", "ADDRESS", "PORT", "CHAINS", "DESTINATION")
	for _, l := range ls {
		addr, port := "", ""
		if sa := l.GetAddress().GetSocketAddress(); sa != nil {
			addr, port = sa.GetAddress(), fmt.Sprint(sa.GetPortValue())
		}
		var dests []string
		if api := l.GetApiListener().GetApiListener(); api != nil {
			addr = "(API listener)"
			var m hcm.HttpConnectionManager
			if api.UnmarshalTo(&m) == nil {
				dests = append(dests, "Route: "+routeName(&m))
			}
		}
		for _, fc := range l.GetFilterChains() {
			dests = append(dests, chainDestinations(fc)...)
		}
		t.row(l.GetName(), addr, port, fmt.Sprint(len(l.GetFilterChains())), shortList(dests, 3))
	}
	return t.flush()
}

// chainDestinations names where a filter chain sends traffic: the route
// configuration of its HTTP connection manager or its TCP proxy's cluster.
func chainDestinations(fc *listener.FilterChain) []string {
	var out []string
	for _, f := range fc.GetFilters() {
		tc := f.GetTypedConfig()
		if tc == nil {
			continue
		}
		var m hcm.HttpConnectionManager
		var tp tcpproxy.TcpProxy
		switch {
		case tc.MessageIs(&m) && tc.UnmarshalTo(&m) == nil:
			out = append(out, "Route: "+routeName(&m))
		case tc.MessageIs(&tp) && tc.UnmarshalTo(&tp) == nil:
			out = append(out, "Cluster: "+tp.GetCluster())
		}
	}
	return out
}

func routeName(m *hcm.HttpConnectionManager) string {
	if rds := m.GetRds(); rds != nil {
		return rds.GetRouteConfigName()
	}
	if rc := m.GetRouteConfig(); rc != nil {
		return rc.GetName() + " (inline)"
	}
	return "(none)"
}

func routes(o *options, raw []json.RawMessage) error {
	rs, err := decode(raw, func() *route.RouteConfiguration { return &route.RouteConfiguration{} })
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "NAME", "VIRTUAL HOST", "DOMAINS", "ROUTES")
	for _, rc := range rs {
		if len(rc.GetVirtualHosts()) == 0 {
			t.row(rc.GetName(), "", "", "0")
		}
		for _, vh := range rc.GetVirtualHosts() {
			t.row(rc.GetName(), vh.GetName(), shortList(vh.GetDomains(), 3), fmt.Sprint(len(vh.GetRoutes())))
		}
	}
	return t.flush()
}

func endpoints(o *options, raw []json.RawMessage) error {
	cs, err := decode(raw, func() *endpoint.ClusterLoadAssignment { return &endpoint.ClusterLoadAssignment{} })
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "ENDPOINT", "STATUS", "WEIGHT", "LOCALITY", "CLUSTER")
	for _, cla := range cs {
		for _, le := range cla.GetEndpoints() {
			loc := le.GetLocality()
			locality := strings.Trim(strings.Join([]string{loc.GetRegion(), loc.GetZone(), loc.GetSubZone()}, "/"), "/")
			for _, lb := range le.GetLbEndpoints() {
				addr := "?"
				if sa := lb.GetEndpoint().GetAddress().GetSocketAddress(); sa != nil {
					addr = fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue())
				}
				weight := ""
				if w := lb.GetLoadBalancingWeight(); w != nil {
					weight = fmt.Sprint(w.GetValue())
				}
				t.row(addr, lb.GetHealthStatus().String(), weight, locality, cla.GetClusterName())
			}
		}
	}
	return t.flush()
}

// shortList joins up to n items, saying how many more there are.
func shortList(items []string, n int) string {
	if len(items) <= n {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s + %d more", strings.Join(items[:n], ", "), len(items)-n)
}
