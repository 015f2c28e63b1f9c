package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// envoyExtensions turn on access logs and tracing in namespace demo and
// patch every proxy there, in any context: a Lua filter before the router,
// the greeter cluster's connect timeout.
const envoyExtensions = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: collector, namespace: demo}
spec:
  hosts: [collector.demo.svc.cluster.local]
  ports: [{number: 4317, name: grpc-otlp, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.9}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: istio, namespace: istio-system}
data:
  mesh: |
    extensionProviders:
    - name: otel
      opentelemetry: {service: collector.demo.svc.cluster.local, port: 4317}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: observe, namespace: demo}
spec:
  accessLogging: [{providers: [{name: envoy}]}]
  tracing: [{providers: [{name: otel}], randomSamplingPercentage: 100}]
---
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: everywhere, namespace: demo}
spec:
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code: {inline_string: "function envoy_on_request(h) end"}
  - applyTo: CLUSTER
    match: {cluster: {service: greeter.demo.svc.cluster.local}}
    patch:
      operation: MERGE
      value: {connect_timeout: 0.25s}
`

// brokenFilter is an EnvoyFilter whose patch would make the greeter
// cluster invalid: refused by the pushers, the rest served.
const brokenFilter = `
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: broken, namespace: demo}
spec:
  configPatches:
  - applyTo: CLUSTER
    match: {cluster: {service: greeter.demo.svc.cluster.local}}
    patch:
      operation: MERGE
      value: {connect_timeout: -1s, lb_policy: MAGLEV}
`

// TestEnvoyExtensionsLeaveProxylessAlone: with Telemetries and EnvoyFilters
// that select every proxy of demo, an Envoy there is sent the Lua filter,
// access logs, tracing and the patched cluster, while a grpc-go client of
// demo is sent none of it and keeps routing RPCs; through a combined
// change (the Telemetry's file removed, a broken EnvoyFilter added, the
// endpoint moved, in one burst) the client keeps working and moves.
func TestEnvoyExtensionsLeaveProxylessAlone(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	writeMesh(t, dir, "extensions.yaml", envoyExtensions)
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")

	envoy := func(typeURL string) string {
		c, err := grpc.NewClient(cp.ads, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := discovery.NewAggregatedDiscoveryServiceClient(c).StreamAggregatedResources(ctx)
		if err != nil {
			return err.Error()
		}
		node := &core.Node{Id: "sidecar~10.0.0.5~app-1.demo~demo.svc.cluster.local"}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL}); err != nil {
			return err.Error()
		}
		resp, err := s.Recv()
		if err != nil {
			return err.Error()
		}
		var out strings.Builder
		for _, r := range resp.Resources {
			m, _ := r.UnmarshalNew()
			js, _ := protojson.Marshal(m)
			out.Write(js)
		}
		return out.String()
	}
	testutil.Eventually(t, 30*time.Second, "an Envoy of demo is sent the Lua filter, access logs, tracing and the patched cluster", func() (bool, string) {
		l, c := envoy(resource.ListenerType), envoy(resource.ClusterType)
		for _, want := range []string{"envoy.filters.http.lua", "envoy.access_loggers.file", "envoy.tracers.opentelemetry"} {
			if !strings.Contains(l, want) {
				return false, "listeners lack " + want
			}
		}
		return strings.Contains(c, `"connectTimeout":"0.250s"`), "clusters lack the patched timeout: " + c
	})
	allOn(t, conn, a.addr, "the grpc-go client of demo routes RPCs, untouched by the Envoy extensions")

	// One burst: the Telemetry's file goes, a broken EnvoyFilter comes,
	// the endpoint moves.
	if err := os.Remove(filepath.Join(dir, "extensions.yaml")); err != nil {
		t.Fatal(err)
	}
	writeMesh(t, dir, "broken.yaml", docs(envoyExtensionsWithout(t, "Telemetry"), brokenFilter))
	writeMesh(t, dir, "mesh.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b)))
	allOn(t, conn, b.addr, "after the burst the client follows the endpoint to b")
	testutil.Eventually(t, 30*time.Second, "the Envoy's cluster keeps the valid patch, the broken one refused; no access log any more", func() (bool, string) {
		l, c := envoy(resource.ListenerType), envoy(resource.ClusterType)
		return strings.Contains(c, `"connectTimeout":"0.250s"`) && !strings.Contains(c, "MAGLEV") && !strings.Contains(l, "access_loggers"),
			fmt.Sprintf("clusters patched: %v, MAGLEV: %v, access logs: %v", strings.Contains(c, "0.250s"), strings.Contains(c, "MAGLEV"), strings.Contains(l, "access_loggers"))
	})
}

// envoyExtensionsWithout is envoyExtensions without the documents of a kind.
func envoyExtensionsWithout(t *testing.T, kind string) string {
	t.Helper()
	var keep []string
	for _, d := range strings.Split(envoyExtensions, "\n---\n") {
		if !strings.Contains(d, "\nkind: "+kind+"\n") {
			keep = append(keep, d)
		}
	}
	return strings.Join(keep, "\n---\n")
}
