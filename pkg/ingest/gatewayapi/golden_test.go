package gatewayapi_test

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// meshOf builds the mesh the pushers would build from the objects and the
// Services (normalized as the Kubernetes source does).
func meshOf(t *testing.T, objs []ingest.Object, services []*corev1.Service) *generate.Mesh {
	t.Helper()
	var items []model.Stored
	for _, o := range objs {
		items = append(items, model.Stored{Key: o.Key, Object: o.Object, ModRevision: 1})
	}
	for _, s := range services {
		spec, err := kube.ConvertService(s, "cluster.local")
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, model.Stored{Key: model.Key{Kind: model.KindService, Namespace: s.Namespace, Name: s.Name}, Object: spec, ModRevision: 1})
	}
	return meshbuild.MeshOf(items)
}

// TestIngressGateway: the listeners and routes of the ingress Gateway's
// proxies: HTTP on 80, HTTPS on 443 with the listener's certificate, TLS
// passed through by SNI on 9443, TCP on 5432; the cross-namespace route a
// ReferenceGrant allows, with both its backends; the route whose backend
// no ReferenceGrant allows, answering 500; and not the route of a
// namespace no listener admits.
func TestIngressGateway(t *testing.T) {
	in, services := loadWithServices(t, "testdata/ingress.yaml")
	out := gatewayapi.Translate(in, gatewayapi.Options{})
	m := meshOf(t, out.Objects, services)
	var gws []*generate.Gateway
	for _, g := range m.Gateways {
		if g.Spec.Selector[gatewayapi.GatewayNameLabel] == "edge" {
			gws = append(gws, g)
		}
	}
	if len(gws) != 4 {
		t.Fatalf("the edge proxies have %d gateways, want its 4 valid listeners'", len(gws))
	}
	listen := generate.ListenPorts(m, gws)
	golden.CheckValid(t, "ingress-listeners.json", generate.GatewayListeners(m, gws, listen))
	golden.CheckValid(t, "ingress-routes.json", generate.GatewayRoutes(m, gws, listen))
}

// TestGAMMARoutesAsVirtualService: an HTTPRoute on a Service gives a
// sidecar and a proxyless client the routes the equivalent VirtualService
// gives them, but for the Gateway API's answer to a backend that does not
// resolve (500, where a VirtualService's route would be left out).
func TestGAMMARoutesAsVirtualService(t *testing.T) {
	in, services := loadWithServices(t, "testdata/gamma.yaml")
	out := gatewayapi.Translate(in, gatewayapi.Options{})
	if st := out.Statuses; len(st) != 1 || reason(st[0].Parents[0].Conditions, "Accepted") != "True/Accepted" {
		t.Fatalf("statuses %+v", st)
	}
	gamma := meshOf(t, out.Objects, services)
	vs := meshOf(t, virtualService(t, "testdata/gamma-virtualservice.yaml"), services)
	for _, proxy := range []generate.Proxy{generate.Envoy, generate.Proxyless} {
		got := generate.Routes(gamma, proxy)
		golden.CheckValid(t, "gamma-routes-"+proxy.String()+".json", got)
		want := generate.Routes(vs, proxy)
		// The differences: the 500, and the tracing operation, which names
		// the route rule (the HTTPRoute's is named after its parent).
		for _, rcs := range [][]*route.RouteConfiguration{got, want} {
			for _, rc := range rcs {
				for _, vh := range rc.VirtualHosts {
					for _, r := range vh.Routes {
						r.GetRoute().ClusterNotFoundResponseCode = route.RouteAction_SERVICE_UNAVAILABLE
						if op := r.GetDecorator().GetOperation(); strings.HasSuffix(op, ":9080/*") {
							r.Decorator.Operation = "<route rule>:9080/*"
						}
					}
				}
			}
		}
		if g, w := golden.JSON(t, protos(t, got)), golden.JSON(t, protos(t, want)); string(g) != string(w) {
			t.Errorf("%s: the HTTPRoute's routes differ from the VirtualService's:\n%s\nwant\n%s", proxy, g, w)
		}
	}
}

func protos[R proto.Message](t *testing.T, rs []R) []any {
	out := make([]any, len(rs))
	for i, r := range rs {
		out[i] = golden.Proto(t, r)
	}
	return out
}

// virtualService normalizes a file holding one Istio resource.
func virtualService(t *testing.T, file string) []ingest.Object {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var r istio.Resource
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(j, &r); err != nil {
		t.Fatal(err)
	}
	objs, problems := istio.Normalize([]istio.Input{{Resource: r, Location: file}}, istio.Options{})
	if len(problems) > 0 {
		t.Fatal(problems)
	}
	for _, o := range objs {
		o.Object.(*meshv1.RouteRule).Origin = nil
	}
	return objs
}
