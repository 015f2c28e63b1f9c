package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

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
	"secrets": "Secret", "secret": "Secret", "sds": "Secret",
}

// proxyConfig prints what one proxy is served of one type, from the
// config dump of the pusher it is connected to.
func proxyConfig(ctx context.Context, o *options, args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("want <proxy> clusters|routes|listeners|endpoints|secrets, got %q", args)
	}
	proxy, what := args[0], args[1]
	if _, ok := kinds[strings.ToLower(proxy)]; ok {
		// istioctl's order: the type first.
		proxy, what = what, proxy
	}
	kind, ok := kinds[strings.ToLower(what)]
	if !ok {
		return fmt.Errorf("%q: want clusters, routes, listeners, endpoints or secrets", what)
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
		Resources  map[string][]json.RawMessage `json:"resources"`
		Provenance provenance                   `json:"provenance"`
	}
	if err := o.get(ctx, pusherOf(at), "/debug/config_dump?proxy="+url.QueryEscape(at.Proxy), &dump); err != nil {
		return fmt.Errorf("pusher %s (%s): %w", at.Pusher, at.Admin, err)
	}
	raw, err := o.filter.keep(kind, dump.Resources[kind])
	if err != nil {
		return err
	}
	if o.output != "table" {
		if raw == nil {
			raw = []json.RawMessage{}
		}
		return writeOutput(o, raw)
	}
	switch kind {
	case "Cluster":
		return clusters(o, raw, dump.Provenance)
	case "Listener":
		return listeners(o, raw)
	case "RouteConfiguration":
		return routes(o, raw, dump.Provenance)
	case "Secret":
		return secrets(o, raw)
	}
	return endpoints(o, raw)
}

// resourceFilter keeps the resources of a type whose name matches a pattern,
// whose host is an FQDN, or whose port is a number (0 and "": any).
type resourceFilter struct {
	name, fqdn string
	port       uint
}

// keep returns the resources of raw (of kind) the filter keeps. Clusters
// and load assignments are named <direction>|<port>|<subset>|<fqdn>,
// listeners <address>_<port> (or by their address's port).
func (f resourceFilter) keep(kind string, raw []json.RawMessage) ([]json.RawMessage, error) {
	if f == (resourceFilter{}) {
		return raw, nil
	}
	if _, err := path.Match(f.name, ""); err != nil {
		return nil, fmt.Errorf("--name %q: %w", f.name, err)
	}
	if (f.fqdn != "" || f.port != 0) && kind != "Cluster" && kind != "ClusterLoadAssignment" && (kind != "Listener" || f.fqdn != "") {
		return nil, fmt.Errorf("--fqdn and --port filter clusters and endpoints (--port listeners too), not %s", kind)
	}
	var out []json.RawMessage
	for _, r := range raw {
		var res struct {
			Name        string `json:"name"`
			ClusterName string `json:"clusterName"`
			Address     struct {
				SocketAddress struct {
					PortValue uint `json:"portValue"`
				} `json:"socketAddress"`
			} `json:"address"`
		}
		if err := json.Unmarshal(r, &res); err != nil {
			return nil, err
		}
		name := cmp.Or(res.Name, res.ClusterName)
		if ok, _ := path.Match(f.name, name); f.name != "" && !ok {
			continue
		}
		parts := strings.Split(name, "|")
		if f.fqdn != "" && (len(parts) != 4 || parts[3] != f.fqdn) {
			continue
		}
		if f.port != 0 {
			port := ""
			switch {
			case len(parts) == 4:
				port = parts[1]
			case kind == "Listener" && res.Address.SocketAddress.PortValue != 0:
				port = strconv.FormatUint(uint64(res.Address.SocketAddress.PortValue), 10)
			case kind == "Listener":
				_, port, _ = strings.Cut(name, "_")
			}
			if port != strconv.FormatUint(uint64(f.port), 10) {
				continue
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// secret is a secret as the config dump summarizes it (app.SecretSummary).
type secret struct {
	Name         string `json:"name"`
	Kind         string `json:"kind"`
	Certificates []struct {
		Subject  string    `json:"subject"`
		URIs     []string  `json:"uris"`
		DNSNames []string  `json:"dns_names"`
		Serial   string    `json:"serial"`
		NotAfter time.Time `json:"not_after"`
		CA       bool      `json:"ca"`
	} `json:"certificates"`
}

// secrets prints the certificates a proxy is served over SDS, as
// istioctl proxy-config secret does: one row per certificate, with its
// identity, serial and validity (never a key: the dump holds none).
func secrets(o *options, raw []json.RawMessage) error {
	if len(raw) == 0 {
		fmt.Fprintln(o.stderr, "no secrets: the proxy is served none (no workload certificates from the pushers, or no identity)")
	}
	t := newTable(o.stdout, "RESOURCE NAME", "TYPE", "STATUS", "VALID CERT", "SERIAL NUMBER", "NOT AFTER", "IDENTITY")
	for i, b := range raw {
		var s secret
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("secret %d of the dump: %w", i, err)
		}
		typ := "Cert Chain"
		if s.Kind == "trust" {
			typ = "CA"
		}
		for _, c := range s.Certificates {
			valid := time.Now().Before(c.NotAfter)
			id := cmp.Or(strings.Join(c.URIs, ","), strings.Join(c.DNSNames, ","), c.Subject)
			t.row(s.Name, typ, "ACTIVE", strings.ToUpper(strconv.FormatBool(valid)), c.Serial, c.NotAfter.UTC().Format(time.RFC3339), id)
		}
	}
	return t.flush()
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

// provenance names the DestinationRule of each cluster and the
// VirtualService of each virtual host, as the config dump gives them
// (app.Provenance).
type provenance struct {
	Clusters     map[string]string `json:"clusters"`
	VirtualHosts map[string]string `json:"virtual_hosts"`
}

// istioName writes namespace/name as istioctl's columns do: name.namespace.
func istioName(nsName string) string {
	ns, name, ok := strings.Cut(nsName, "/")
	if !ok {
		return nsName
	}
	return name + "." + ns
}

func clusters(o *options, raw []json.RawMessage, from provenance) error {
	cs, err := decode(raw, func() *cluster.Cluster { return &cluster.Cluster{} })
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "SERVICE FQDN", "PORT", "SUBSET", "DIRECTION", "TYPE", "DESTINATION RULE")
	for _, c := range cs {
		typ := c.GetType().String()
		if c.GetClusterType() != nil {
			typ = c.GetClusterType().GetName()
		}
		dr := istioName(from.Clusters[c.GetName()])
		// Istio's names: direction|port|subset|host.
		if parts := strings.Split(c.GetName(), "|"); len(parts) == 4 {
			t.row(parts[3], parts[1], parts[2], parts[0], typ, dr)
		} else {
			t.row(c.GetName(), "", "", "", typ, dr)
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

func routes(o *options, raw []json.RawMessage, from provenance) error {
	rs, err := decode(raw, func() *route.RouteConfiguration { return &route.RouteConfiguration{} })
	if err != nil {
		return err
	}
	t := newTable(o.stdout, "NAME", "VIRTUAL HOST", "DOMAINS", "ROUTES", "VIRTUAL SERVICE")
	for _, rc := range rs {
		if len(rc.GetVirtualHosts()) == 0 {
			t.row(rc.GetName(), "", "", "0", "")
		}
		for _, vh := range rc.GetVirtualHosts() {
			t.row(rc.GetName(), vh.GetName(), shortList(vh.GetDomains(), 3), fmt.Sprint(len(vh.GetRoutes())), istioName(from.VirtualHosts[vh.GetName()]))
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
