package pusher

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/proto"
)

// FuzzApplyEvent: whatever arrives on the bus, applying it to a mesh and
// generating every kind of resource from the result never panics.
func FuzzApplyEvent(f *testing.F) {
	svc := &meshv1.Service{Hostnames: []string{"a.ns.svc.cluster.local"}, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}
	for _, o := range []struct {
		key model.Key
		obj model.Object
	}{
		{model.Key{Kind: model.KindService, Namespace: "ns", Name: "b"}, svc},
		{model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: "a/k8s"}, &meshv1.Endpoints{Service: "a", Shard: "k8s", Endpoints: []*meshv1.Endpoint{{Address: "10.0.0.1", Ports: map[string]uint32{"http": 8080}}}}},
		{model.Key{Kind: model.KindRouteRule, Namespace: "ns", Name: "a"}, &meshv1.RouteRule{Hosts: []string{"a.ns.svc.cluster.local"},
			Http: []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "a.ns.svc.cluster.local", Subset: "v1"}}}}}}},
		{model.Key{Kind: model.KindTrafficPolicy, Namespace: "ns", Name: "a"}, &meshv1.TrafficPolicy{Host: "a.ns.svc.cluster.local", Subsets: []*meshv1.Subset{{Name: "v1"}}}},
		{model.Key{Kind: model.KindScope, Namespace: "ns", Name: "default"}, &meshv1.Scope{Egress: []*meshv1.EgressListener{{Hosts: []string{"./*"}}}}},
		{model.Key{Kind: model.KindGateway, Namespace: "ns", Name: "gw"}, &meshv1.Gateway{Selector: map[string]string{"istio": "ingress"},
			Servers: []*meshv1.GatewayServer{{Port: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*/a.ns.svc.cluster.local"}}}}},
	} {
		v, err := model.Encode(o.obj)
		if err != nil {
			f.Fatal(err)
		}
		ev, err := proto.Marshal(&meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: o.key.String(), Revision: 5, Value: v})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(ev)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var ev meshv1.ChangeEvent
		if proto.Unmarshal(data, &ev) != nil {
			return
		}
		s := newState("", meshSettings{})
		s.reset([]model.Stored{{Key: model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}, Object: svc, ModRevision: 1}}, 1)
		k, err := model.ParseKey(ev.Key)
		if err != nil {
			return
		}
		var obj model.Object
		if ev.Type == meshv1.ChangeEvent_TYPE_PUT {
			if obj, err = model.Decode(k, ev.Value); err != nil {
				return // the follow goroutine refuses it
			}
		}
		s.apply(k, &ev, obj)
		built, _, _ := s.mesh()
		m := built.Mesh
		for _, proxy := range []generate.Proxy{generate.Envoy, generate.Proxyless} {
			generate.Clusters(m, proxy)
			generate.Listeners(m, proxy, nil)
			generate.Routes(m, proxy)
		}
		generate.LoadAssignments(m)
		generate.GatewayListeners(m, m.Gateways, generate.ListenPorts(m, m.Gateways))
		generate.GatewayRoutes(m, m.Gateways, generate.ListenPorts(m, m.Gateways))
	})
}
