package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

const ingress = `
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: ingress, namespace: istio-system}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 80, name: http, protocol: HTTP}
    hosts: ["demo/*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: greeter-ingress, namespace: demo}
spec:
  hosts: [greeter.example.com]
  gateways: [istio-system/ingress]
  http:
  - route: [{destination: {host: greeter}}]
`

// ingressRouter is an ADS client of the pushers at addr and the node of a
// router proxy of istio-system labelled istio: ingressgateway.
func ingressRouter(t *testing.T, addr string) (discovery.AggregatedDiscoveryServiceClient, *core.Node) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	meta, _ := structpb.NewStruct(map[string]any{"LABELS": map[string]any{"istio": "ingressgateway"}, "NAMESPACE": "istio-system"})
	return discovery.NewAggregatedDiscoveryServiceClient(conn), &core.Node{Id: "router~10.0.0.3~ingress-1.istio-system~istio-system.svc.cluster.local", Metadata: meta}
}

// TestGatewayRouterGetsItsGateway: a router proxy whose labels a Gateway
// selects gets that gateway's listener and the routes of the
// VirtualServices bound to it.
func TestGatewayRouterGetsItsGateway(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), ingress))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads, node := ingressRouter(t, cp.ads)

	fetch := func(typeURL string, names ...string) []*discovery.DiscoveryResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, ResourceNames: names}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			return nil
		}
		return []*discovery.DiscoveryResponse{resp}
	}
	testutil.Eventually(t, 20*time.Second, "the router gets the gateway's listener", func() (bool, string) {
		var names []string
		for _, r := range fetch(resource.ListenerType) {
			for _, res := range r.Resources {
				m, _ := res.UnmarshalNew()
				names = append(names, m.(interface{ GetName() string }).GetName())
			}
		}
		return slices.Equal(names, []string{"0.0.0.0_80"}), ""
	})
	// The route rule may be written after the Gateway: wait for it too.
	testutil.Eventually(t, 20*time.Second, "the router's route configuration routes the gateway's host", func() (bool, string) {
		resp := fetch(resource.RouteType, "http.80")
		if len(resp) == 0 || len(resp[0].Resources) != 1 {
			return false, fmt.Sprint("no route configuration http.80: ", resp)
		}
		rc := &route.RouteConfiguration{}
		if err := resp[0].Resources[0].UnmarshalTo(rc); err != nil {
			return false, err.Error()
		}
		ok := len(rc.VirtualHosts) == 1 && rc.VirtualHosts[0].Domains[0] == "greeter.example.com" &&
			rc.VirtualHosts[0].Routes[0].GetRoute().GetCluster() == "outbound|50051||greeter.demo.svc.cluster.local"
		return ok, fmt.Sprint("http.80 = ", rc)
	})
	// Its catch-all clusters: the black hole alone, as istiod sends a
	// gateway (it passes nothing through).
	var clusters []string
	for _, r := range fetch(resource.ClusterType) {
		for _, res := range r.Resources {
			m, _ := res.UnmarshalNew()
			clusters = append(clusters, m.(interface{ GetName() string }).GetName())
		}
	}
	if !slices.Contains(clusters, "BlackHoleCluster") || slices.Contains(clusters, "PassthroughCluster") || slices.Contains(clusters, "InboundPassthroughCluster") {
		t.Errorf("the router's clusters %v: want the black hole, no passthrough", clusters)
	}
}

// gatewayService is the gateway Deployment's Service: port 80 to the
// unprivileged 8080 of the workloads labelled istio: ingressgateway.
const gatewayService = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ingressgateway, namespace: istio-system}
spec:
  hosts: [ingressgateway.istio-system.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 80, name: http2, protocol: HTTP2, targetPort: 8080}]
  workloadSelector: {labels: {istio: ingressgateway}}
`

const gatewayPod = `
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: ingressgateway-1, namespace: istio-system}
spec: {address: 10.0.0.3, labels: {istio: ingressgateway}}
`

// TestGatewayListensOnTargetPort: a router listens where its Service
// sends the Gateway's port, as istiod has it, and moves there when the
// gateway's workloads appear (an endpoint change alone).
func TestGatewayListensOnTargetPort(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), ingress, gatewayService))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads, node := ingressRouter(t, cp.ads)
	unprivileged := proto.CloneOf(node)
	unprivileged.Id = "router~10.0.0.4~ingress-2.istio-system~istio-system.svc.cluster.local"
	unprivileged.Metadata.Fields["UNPRIVILEGED_POD"] = structpb.NewStringValue("true")
	listenersOf := func(node *core.Node) (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return false, err.Error()
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ListenerType}); err != nil {
			return false, err.Error()
		}
		resp, err := s.Recv()
		if err != nil {
			return false, err.Error()
		}
		var names []string
		for _, res := range resp.Resources {
			m, _ := res.UnmarshalNew()
			names = append(names, m.(interface{ GetName() string }).GetName())
		}
		return false, fmt.Sprint(names)
	}
	want := func(what string, node *core.Node, names string) {
		t.Helper()
		testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
			_, got := listenersOf(node)
			return got == names, got
		})
	}
	want("no workload yet: the server's port", node, "[0.0.0.0_80]")
	// An unprivileged pod cannot bind port 80: istiod skips the server.
	want("no workload yet, an unprivileged pod: nothing", unprivileged, "[]")
	writeMesh(t, dir, "pod.yaml", gatewayPod)
	want("the gateway's workload came: its target port", node, "[0.0.0.0_8080]")
	want("the gateway's workload came, an unprivileged pod: its target port", unprivileged, "[0.0.0.0_8080]")
}
