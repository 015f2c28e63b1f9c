package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/google/go-cmp/cmp"
	"github.com/shardpilot/shardpilot/internal/testutil"
)

// catalogService is a second service on the greeter's port, so that the
// port's route configuration holds two virtual hosts.
const catalogService = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: catalog, namespace: demo}
spec:
  hosts: [catalog.demo.svc.cluster.local]
  ports: [{number: 50051, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.9}]
`

// greeterRetries is greeterByHeader with another number of retries.
func greeterRetries(n int) string {
	return strings.Replace(greeterByHeader, "attempts: 3", fmt.Sprintf("attempts: %d", n), 1)
}

// TestDeltaEnvoyTakesVirtualHostsApart: a sidecar (and a gateway) Envoy
// that speaks Delta is sent its route configurations without their virtual hosts, naming
// ADS their source (VHDS), and the virtual hosts apart, each named
// <route configuration>/<host>; what it assembles is, at every step, what
// a SotW Envoy of its class is sent whole (the configuration the
// differential against istiod checks). A route change sends it the one
// virtual host it changed; a service removed, that host's removal. A
// grpc-go client routes throughout.
func TestDeltaEnvoyTakesVirtualHostsApart(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b),
		greeterSubsets, greeterRetries(3)))
	writeMesh(t, dir, "catalog.yaml", catalogService)
	writeMesh(t, dir, "ingress.yaml", ingress)
	cp := NewCluster(t, Options{}, yamlSource(dir))
	client := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, client, a.addr, "the grpc-go client, before")

	conn, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	whole := newSotWRoutes(t, ctx, ads, &core.Node{Id: "sidecar~10.0.0.21~whole.demo~demo.svc.cluster.local"})
	apart := newDeltaRoutes(t, ctx, ads, &core.Node{Id: "sidecar~10.0.0.22~apart.demo~demo.svc.cluster.local"})
	_, router := ingressRouter(t, cp.ads)
	gatewayWhole := newSotWRoutes(t, ctx, ads, router)
	router = proto.Clone(router).(*core.Node)
	router.Id = "router~10.0.0.4~ingress-2.istio-system~istio-system.svc.cluster.local"
	gatewayApart := newDeltaRoutes(t, ctx, ads, router)

	same := func(what string) {
		t.Helper()
		for _, pair := range []struct {
			proxy string
			whole *sotwRoutes
			apart *deltaRoutes
		}{{"sidecar", whole, apart}, {"gateway", gatewayWhole, gatewayApart}} {
			testutil.Eventually(t, 20*time.Second, what+": "+pair.proxy, func() (bool, string) {
				pair.whole.read(t)
				pair.apart.read(t)
				want, got := pair.whole.routes, pair.apart.assembled()
				if len(want) == 0 {
					return false, "no route configuration yet"
				}
				if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
					return false, "assembled from VHDS against whole (-whole +assembled):\n" + d
				}
				return true, ""
			})
		}
	}
	same("the Delta Envoys' assembled routes equal the SotW Envoys'")
	for _, d := range []*deltaRoutes{apart, gatewayApart} {
		for name, rc := range d.routes {
			if len(rc.VirtualHosts) > 0 || rc.GetVhds().GetConfigSource().GetAds() == nil {
				t.Fatalf("route configuration %s sent over Delta with %d virtual hosts and vhds %v; want none, and ADS their source", name, len(rc.VirtualHosts), rc.GetVhds())
			}
		}
	}

	// A route change: the one virtual host it changed.
	apart.changes = nil
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b),
		greeterSubsets, greeterRetries(5)))
	same("the route change assembled")
	if got := apart.changedHosts(); len(got) != 1 || !strings.HasSuffix(got[0], "/greeter.demo.svc.cluster.local:50051") {
		t.Errorf("the route change sent the Delta Envoy virtual hosts %v; want the greeter's alone", got)
	}

	// A service removed: its virtual host's removal.
	apart.changes = nil
	writeMesh(t, dir, "catalog.yaml", "")
	same("the service removal assembled")
	if !slices.ContainsFunc(apart.changes, func(c string) bool {
		return strings.HasPrefix(c, "-") && strings.Contains(c, "/catalog.demo.svc.cluster.local")
	}) {
		t.Errorf("the removal sent the Delta Envoy %v; want the catalog's virtual host removed", apart.changes)
	}

	// A route configuration's virtual hosts subscribed anew, as Envoy
	// does when it makes their subscription again: it dropped them, and
	// is sent them again.
	apart.read(t)
	for name := range apart.hosts {
		delete(apart.hosts, name)
	}
	if err := apart.s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.VirtualHostType, ResourceNamesUnsubscribe: apart.names}); err != nil {
		t.Fatal(err)
	}
	if err := apart.s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.VirtualHostType, ResourceNamesSubscribe: apart.names}); err != nil {
		t.Fatal(err)
	}
	same("the virtual hosts subscribed anew")
	allOn(t, client, a.addr, "the grpc-go client, after")
}

// sotwRoutes is a SotW sidecar's route configurations.
type sotwRoutes struct {
	s      grpc.BidiStreamingClient[discovery.DiscoveryRequest, discovery.DiscoveryResponse]
	rx     *receiver[*discovery.DiscoveryResponse]
	names  []string
	routes map[string]*route.RouteConfiguration
}

func newSotWRoutes(t *testing.T, ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, node *core.Node) *sotwRoutes {
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &sotwRoutes{s: s, rx: receive(s), routes: map[string]*route.RouteConfiguration{}}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
		t.Fatal(err)
	}
	return w
}

// read applies and ACKs what arrived.
func (w *sotwRoutes) read(t *testing.T) {
	for {
		resp, err := w.rx.next(50 * time.Millisecond)
		if err != nil {
			return
		}
		switch resp.TypeUrl {
		case resource.ListenerType:
			if names := listenerRoutes(t, resp.Resources); !slices.Equal(names, w.names) {
				w.names = names
				if err := w.s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.RouteType, ResourceNames: names}); err != nil {
					t.Fatal(err)
				}
			}
		case resource.RouteType:
			for _, r := range resp.Resources {
				rc := &route.RouteConfiguration{}
				if err := r.UnmarshalTo(rc); err != nil {
					t.Fatal(err)
				}
				slices.SortFunc(rc.VirtualHosts, func(a, b *route.VirtualHost) int { return strings.Compare(a.Name, b.Name) })
				w.routes[rc.Name] = rc
			}
		}
		if err := w.s.Send(&discovery.DiscoveryRequest{TypeUrl: resp.TypeUrl, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce,
			ResourceNames: map[string][]string{resource.RouteType: w.names}[resp.TypeUrl]}); err != nil {
			t.Fatal(err)
		}
	}
}

// deltaRoutes is a Delta sidecar's route configurations and virtual
// hosts, asked for as Envoy does: the virtual hosts by their route
// configurations' names.
type deltaRoutes struct {
	s      grpc.BidiStreamingClient[discovery.DeltaDiscoveryRequest, discovery.DeltaDiscoveryResponse]
	rx     *receiver[*discovery.DeltaDiscoveryResponse]
	names  []string
	routes map[string]*route.RouteConfiguration
	hosts  map[string]*route.VirtualHost
	vhds   bool
	// changes are the virtual hosts sent ("+name") and removed ("-name").
	changes []string
}

func newDeltaRoutes(t *testing.T, ctx context.Context, ads discovery.AggregatedDiscoveryServiceClient, node *core.Node) *deltaRoutes {
	s, err := ads.DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w := &deltaRoutes{s: s, rx: receive(s), routes: map[string]*route.RouteConfiguration{}, hosts: map[string]*route.VirtualHost{}}
	if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ListenerType, ResourceNamesSubscribe: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	return w
}

// read applies and ACKs what arrived.
func (w *deltaRoutes) read(t *testing.T) {
	for {
		resp, err := w.rx.next(50 * time.Millisecond)
		if err != nil {
			return
		}
		var follow *discovery.DeltaDiscoveryRequest
		switch resp.TypeUrl {
		case resource.ListenerType:
			var all []*anypb.Any
			for _, r := range resp.Resources {
				all = append(all, r.Resource)
			}
			if names := listenerRoutes(t, all); len(all) > 0 && !slices.Equal(names, w.names) {
				w.names = names
				follow = &discovery.DeltaDiscoveryRequest{TypeUrl: resource.RouteType, ResourceNamesSubscribe: names}
			}
		case resource.RouteType:
			for _, r := range resp.Resources {
				rc := &route.RouteConfiguration{}
				if err := r.Resource.UnmarshalTo(rc); err != nil {
					t.Fatal(err)
				}
				w.routes[rc.Name] = rc
				if rc.Vhds != nil && !w.vhds {
					w.vhds = true
					follow = &discovery.DeltaDiscoveryRequest{TypeUrl: resource.VirtualHostType, ResourceNamesSubscribe: w.names}
				}
			}
		case resource.VirtualHostType:
			for _, name := range resp.RemovedResources {
				delete(w.hosts, name)
				w.changes = append(w.changes, "-"+name)
			}
			for _, r := range resp.Resources {
				vh := &route.VirtualHost{}
				if err := r.Resource.UnmarshalTo(vh); err != nil {
					t.Fatal(err)
				}
				if vh.Name != r.Name {
					t.Fatalf("virtual host %q sent as resource %q: Envoy removes virtual hosts by their resource names", vh.Name, r.Name)
				}
				w.hosts[r.Name] = vh
				w.changes = append(w.changes, "+"+r.Name)
			}
		}
		if err := w.s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.TypeUrl, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
		if follow != nil {
			if err := w.s.Send(follow); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// assembled is the route configurations as Envoy assembles them from
// VHDS: each with the virtual hosts under its name, named as they were
// (for comparison with the whole ones: the name is the one difference).
func (w *deltaRoutes) assembled() map[string]*route.RouteConfiguration {
	out := map[string]*route.RouteConfiguration{}
	for name, rc := range w.routes {
		rc = proto.Clone(rc).(*route.RouteConfiguration)
		rc.Vhds = nil
		for _, hn := range slices.Sorted(maps.Keys(w.hosts)) {
			if host, ok := strings.CutPrefix(hn, name+"/"); ok {
				vh := proto.Clone(w.hosts[hn]).(*route.VirtualHost)
				vh.Name = host
				rc.VirtualHosts = append(rc.VirtualHosts, vh)
			}
		}
		slices.SortFunc(rc.VirtualHosts, func(a, b *route.VirtualHost) int { return strings.Compare(a.Name, b.Name) })
		out[name] = rc
	}
	return out
}

// changedHosts returns the virtual hosts sent since changes was reset.
func (w *deltaRoutes) changedHosts() []string {
	var out []string
	for _, c := range w.changes {
		if name, ok := strings.CutPrefix(c, "+"); ok {
			out = append(out, name)
		}
	}
	return out
}

// listenerRoutes returns the route configurations listeners' connection
// managers fetch over RDS, sorted.
func listenerRoutes(t *testing.T, listeners []*anypb.Any) []string {
	t.Helper()
	var out []string
	for _, a := range listeners {
		l := &listener.Listener{}
		if err := a.UnmarshalTo(l); err != nil {
			t.Fatal(err)
		}
		for _, fc := range l.FilterChains {
			for _, f := range fc.Filters {
				m := &hcm.HttpConnectionManager{}
				if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(m) != nil {
					continue
				}
				if name := m.GetRds().GetRouteConfigName(); name != "" {
					out = append(out, name)
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
