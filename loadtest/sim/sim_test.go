package sim

import (
	"slices"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/protobuf/proto"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
)

func TestReadingWithoutDecoding(t *testing.T) {
	eds, _ := proto.Marshal(&cluster.Cluster{Name: "outbound|80||svc-3.ns-3.svc.cluster.local", ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS}})
	orig, _ := proto.Marshal(&cluster.Cluster{Name: "PassthroughCluster", ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_ORIGINAL_DST}})
	if name, isEDS := clusterNameAndType(eds); name != "outbound|80||svc-3.ns-3.svc.cluster.local" || !isEDS {
		t.Errorf("EDS cluster read as %q, %v", name, isEDS)
	}
	if name, isEDS := clusterNameAndType(orig); name != "PassthroughCluster" || isEDS {
		t.Errorf("original-destination cluster read as %q, %v", name, isEDS)
	}
	rc, _ := proto.Marshal(&route.RouteConfiguration{Name: "80", VirtualHosts: []*route.VirtualHost{
		{Name: "a", Routes: []*route.Route{{Name: "chg-3-17"}}},
		{Name: "b", Routes: []*route.Route{{Name: "chg-12-0"}, {Name: "default"}}},
	}})
	var got [][2]int
	forEachRouteMarker(rc, func(svc, n int) { got = append(got, [2]int{svc, n}) })
	if !slices.Equal(got, [][2]int{{3, 17}, {12, 0}}) {
		t.Errorf("route markers %v", got)
	}
	cla, _ := proto.Marshal(&endpoint.ClusterLoadAssignment{ClusterName: "outbound|80||svc-5.ns-5.svc.cluster.local",
		Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{
			lbEndpoint("10.0.0.1"), lbEndpoint(meshgen.MarkerAddress(77)),
		}}}})
	var eps [][2]int
	forEachEndpointMarker(cla, func(svc, n int) { eps = append(eps, [2]int{svc, n}) })
	if !slices.Equal(eps, [][2]int{{5, 77}}) {
		t.Errorf("endpoint markers %v", eps)
	}
	if n, ok := staticService("outbound|80||svc-42.ns-2.svc.cluster.local"); !ok || n != 42 {
		t.Errorf("static service %d %v", n, ok)
	}
	if n, ok := dynamicService("outbound|80||dyn-9.dyn.svc.cluster.local"); !ok || n != 9 {
		t.Errorf("dynamic service %d %v", n, ok)
	}
}

func lbEndpoint(addr string) *endpoint.LbEndpoint {
	return &endpoint.LbEndpoint{HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{
		Address: &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
			Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: 80}}}}}}}
}

func TestDiff(t *testing.T) {
	add, remove := diff([]string{"a", "b", "c"}, []string{"b", "c", "d"})
	if !slices.Equal(add, []string{"d"}) || !slices.Equal(remove, []string{"a"}) {
		t.Errorf("diff: +%v -%v", add, remove)
	}
}

func TestDirtyPoolSizes(t *testing.T) {
	var p dirtyPool
	for _, n := range []int{0, 1, 2, 3, 1000, 4096, 4097, 90_000} {
		b := p.Get(n)
		if len(*b) != n || cap(*b) < n || (n > 1 && cap(*b) >= 2*n) {
			t.Errorf("Get(%d): len %d cap %d", n, len(*b), cap(*b))
		}
		p.Put(b)
	}
}

// TestResumedWithWhatItApplied: a proxy back on a new stream holding what
// it applied on the last one, its ACK lost with that stream, is full (a
// control plane that finds it current sends nothing); one that holds no
// endpoints yet is not.
func TestResumedWithWhatItApplied(t *testing.T) {
	for _, holds := range []bool{true, false} {
		p := &proxy{fleet: &Fleet{}, acked: map[string]bool{resource.ClusterType: true, resource.ListenerType: true},
			deltaVersions: map[string]map[string]string{resource.ClusterType: {"outbound|80||a": "1"}}, edsRequested: true}
		p.state.eds = []string{"outbound|80||a"}
		if holds {
			p.deltaVersions[resource.EndpointType] = map[string]string{"outbound|80||a": "7"}
		}
		p.resumed()
		if p.full != holds {
			t.Errorf("holding endpoints %v: full %v", holds, p.full)
		}
	}
}
