//lint:file-ignore SA1019 the tests read the deprecated fields the generators set, as istiod sets them

package generate_test

import (
	"strings"
	"testing"
	"time"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/types/known/durationpb"
)

// meshSettings are settings of a MeshConfig other than istiod's defaults.
func meshSettings() *meshv1.MeshConfig {
	return &meshv1.MeshConfig{
		ConnectTimeout:           durationpb.New(3 * time.Second),
		ProtocolDetectionTimeout: durationpb.New(100 * time.Millisecond),
		DnsRefreshRate:           durationpb.New(30 * time.Second),
		H2Upgrade:                true,
		PathNormalization:        meshv1.PathNormalization_PATH_NORMALIZATION_DECODE_AND_MERGE_SLASHES,
		DefaultHttpRetry:         &meshv1.RetryPolicy{Attempts: 4, RetryOn: "5xx,503"},
		GatewayTrustedProxies:    2,
		GatewayClientCert:        meshv1.ClientCertDetails_CLIENT_CERT_DETAILS_FORWARD_ONLY,
	}
}

func managers(t *testing.T, ls []*listener.Listener) []*hcm.HttpConnectionManager {
	t.Helper()
	var out []*hcm.HttpConnectionManager
	for _, l := range ls {
		if err := l.Validate(); err != nil {
			t.Fatalf("listener %s: %v", l.Name, err)
		}
		for _, fc := range append(l.FilterChains, l.DefaultFilterChain) {
			for _, f := range fc.GetFilters() {
				var m hcm.HttpConnectionManager
				if f.GetTypedConfig().UnmarshalTo(&m) == nil {
					out = append(out, &m)
				}
			}
		}
	}
	return out
}

// TestMeshConfig: the mesh's settings change what istiod's defaults would
// be, for every resource that has them, as istiod applies them.
func TestMeshConfig(t *testing.T) {
	m := cartMesh(nil, &meshv1.RouteRule{Http: []*meshv1.HTTPRoute{
		{Name: "own", Match: []*meshv1.HTTPMatch{{Uri: exact("/own")}}, Retries: &meshv1.RetryPolicy{Attempts: 1},
			Route: to(&meshv1.Destination{Host: "cart.shop.svc.cluster.local"})},
		{Name: "mesh", Route: to(&meshv1.Destination{Host: "cart.shop.svc.cluster.local"})},
	}})
	m.Config = meshSettings()

	c := cartCluster(t, m, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy)
	var opts upstreamhttp.HttpProtocolOptions
	if err := c.TypedExtensionProtocolOptions["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].UnmarshalTo(&opts); err != nil {
		t.Fatal(err)
	}
	if c.ConnectTimeout.AsDuration() != 3*time.Second || opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("cluster: connect timeout %v, protocol %v; want 3s and HTTP/2 (h2UpgradePolicy UPGRADE)", c.ConnectTimeout.AsDuration(), &opts)
	}
	for _, cc := range generate.CatchAllClusters(m, generate.Envoy) {
		if cc.ConnectTimeout.AsDuration() != 3*time.Second {
			t.Errorf("%s: connect timeout %v", cc.Name, cc.ConnectTimeout.AsDuration())
		}
	}
	// A DestinationRule that says DO_NOT_UPGRADE keeps HTTP/1.1.
	kept := cartMesh(&meshv1.TrafficPolicy{ConnectionPool: &meshv1.ConnectionPool{H2UpgradePolicy: meshv1.ConnectionPool_H2_UPGRADE_DO_NOT_UPGRADE}}, nil)
	kept.Config = m.Config
	if c := cartCluster(t, kept, "outbound|80||cart.shop.svc.cluster.local", generate.Envoy); c.TypedExtensionProtocolOptions != nil {
		t.Errorf("DO_NOT_UPGRADE: protocol options %v", c.TypedExtensionProtocolOptions)
	}

	routes := cartRoutes(t, m, generate.Envoy)
	if got := routes[0].GetRoute().GetRetryPolicy().GetNumRetries().GetValue(); got != 1 {
		t.Errorf("a route's own retries: %d attempts, want 1", got)
	}
	rp := routes[1].GetRoute().GetRetryPolicy()
	if rp.GetNumRetries().GetValue() != 4 || rp.RetryOn != "5xx,retriable-status-codes" || len(rp.RetriableStatusCodes) != 1 {
		t.Errorf("a route without retries: %v; want the mesh's (4 attempts on 5xx and 503)", rp)
	}
	def := cartMesh(nil, nil)
	def.Config = &meshv1.MeshConfig{DefaultHttpRetry: &meshv1.RetryPolicy{}}
	if rp := cartRoutes(t, def, generate.Envoy)[0].GetRoute().GetRetryPolicy(); rp != nil {
		t.Errorf("attempts 0 in the mesh's retry policy: default route retries %v, want none", rp)
	}

	ls := generate.Listeners(m, generate.Envoy, nil)
	for _, l := range ls {
		if l.Name == "0.0.0.0_80" && l.ListenerFiltersTimeout.AsDuration() != 100*time.Millisecond {
			t.Errorf("sniffing listener: filters timeout %v, want protocolDetectionTimeout", l.ListenerFiltersTimeout.AsDuration())
		}
	}
	for _, mgr := range managers(t, ls) {
		if !mgr.GetNormalizePath().GetValue() || !mgr.MergeSlashes || mgr.PathWithEscapedSlashesAction != hcm.HttpConnectionManager_UNESCAPE_AND_FORWARD {
			t.Errorf("%s: path normalization %v, merge %v, escaped %v", mgr.StatPrefix, mgr.NormalizePath, mgr.MergeSlashes, mgr.PathWithEscapedSlashesAction)
		}
	}

	gm := testMesh()
	gm.Config = m.Config
	dm := generate.NewMesh([]*generate.Service{{Namespace: "shop", Name: "maps", Spec: &meshv1.Service{
		Hostnames: []string{"maps.example.com"}, Resolution: meshv1.Resolution_RESOLUTION_DNS,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}}}, nil)
	dm.Config = m.Config
	dns := 0
	for _, c := range generate.Clusters(dm, generate.Envoy) {
		if c.DnsRefreshRate != nil { //nolint:staticcheck // the field istiod sets
			dns++
			if c.DnsRefreshRate.AsDuration() != 30*time.Second { //nolint:staticcheck // the field istiod sets
				t.Errorf("%s: DNS refresh rate %v, want dnsRefreshRate", c.Name, c.DnsRefreshRate.AsDuration()) //nolint:staticcheck // the field istiod sets
			}
		}
	}
	if dns == 0 {
		t.Error("no DNS cluster")
	}
	gws := managers(t, generate.GatewayListeners(gm, testGateways(), generate.ListenPorts(gm, testGateways())))
	if len(gws) == 0 {
		t.Fatal("no gateway connection manager")
	}
	for _, mgr := range gws {
		if mgr.XffNumTrustedHops != 2 || mgr.ForwardClientCertDetails != hcm.HttpConnectionManager_FORWARD_ONLY || mgr.SetCurrentClientCertDetails != nil {
			t.Errorf("gateway %s: trusted hops %d, client cert %v (%v)", mgr.StatPrefix, mgr.XffNumTrustedHops, mgr.ForwardClientCertDetails, mgr.SetCurrentClientCertDetails)
		}
	}
}

// TestGatewayTargetPorts: a gateway listens on the target port of the
// Service of its workloads that has the server's port (8080 for 80, as
// Istio's ingress gateway runs unprivileged), its plain HTTP routes named
// by that port, its TLS server's by Istio's per-server name; without such
// a Service, on the server's port. The print that tells endpoint changes
// apart follows the gateway's workloads.
func TestGatewayTargetPorts(t *testing.T) {
	gw := &generate.Gateway{Namespace: "edge", Name: "public", Spec: &meshv1.Gateway{Selector: map[string]string{"istio": "ingress"},
		Servers: []*meshv1.GatewayServer{
			{Port: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*"}},
			{Port: 443, PortName: "https", Protocol: meshv1.Protocol_PROTOCOL_HTTPS, Hosts: []string{"*"}, Tls: &meshv1.GatewayTLS{Mode: "SIMPLE", CredentialName: "cert"}},
			{Port: 9000, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*"}},
		}}}
	svc := &generate.Service{Namespace: "edge", Name: "ingress", Spec: &meshv1.Service{Hostnames: []string{"ingress.edge.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC,
		Ports: []*meshv1.Port{{Name: "http2", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP2, TargetPort: 8080},
			{Name: "https", Number: 443, Protocol: meshv1.Protocol_PROTOCOL_HTTPS}}}}
	gws := []*generate.Gateway{gw}
	targets := generate.NewGatewayTargets(gws)
	before := targets.Print(svc)
	svc.Endpoints = []*meshv1.Endpoint{{Address: "10.0.0.5", Labels: map[string]string{"istio": "ingress", "app": "gw"},
		Ports: map[string]uint32{"http2": 8080, "https": 8443}}}
	if targets.Print(svc) == before {
		t.Error("the gateway's workloads arrived and the print did not change")
	}
	m := generate.NewMesh([]*generate.Service{svc}, nil)
	names := func(ls []*listener.Listener) []string {
		var out []string
		for _, l := range ls {
			if err := l.Validate(); err != nil {
				t.Fatalf("%s: %v", l.Name, err)
			}
			out = append(out, l.Name)
		}
		return out
	}
	listen := generate.ListenPorts(m, gws)
	got := names(generate.GatewayListeners(m, gws, listen))
	if strings.Join(got, " ") != "0.0.0.0_8080 0.0.0.0_8443 0.0.0.0_9000" {
		t.Errorf("listeners %v, want 8080 and 8443 (the Service's target ports) and 9000 (no Service has it)", got)
	}
	var routes []string
	for _, rc := range generate.GatewayRoutes(m, gws, listen) {
		routes = append(routes, rc.Name)
	}
	if strings.Join(routes, " ") != "http.8080 https.443.https.public.edge http.9000" {
		t.Errorf("route configurations %v", routes)
	}

	// An unprivileged pod cannot bind below 1024: the server of port 443,
	// which no Service maps above, goes with its routes, as istiod skips
	// it; 80 (on 8080) and 9000 stay.
	svc.Spec.Ports[1].TargetPort = 443
	svc.Endpoints[0].Ports["https"] = 443
	m = generate.NewMesh([]*generate.Service{svc}, nil)
	unprivileged := generate.Unprivileged(generate.ListenPorts(m, gws))
	if got := names(generate.GatewayListeners(m, gws, unprivileged)); strings.Join(got, " ") != "0.0.0.0_8080 0.0.0.0_9000" {
		t.Errorf("an unprivileged pod's listeners %v, want 8080 and 9000", got)
	}
	routes = nil
	for _, rc := range generate.GatewayRoutes(m, gws, unprivileged) {
		routes = append(routes, rc.Name)
	}
	if strings.Join(routes, " ") != "http.8080 http.9000" {
		t.Errorf("an unprivileged pod's route configurations %v, want http.8080 and http.9000", routes)
	}
}
