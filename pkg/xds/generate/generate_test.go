package generate_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/types/known/durationpb"
)

func exact(s string) *meshv1.StringMatch {
	return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: s}}
}

// testMesh has an HTTP service with subsets, locality and weights, routed by
// a VirtualService; a gRPC service routed straight; and a passthrough
// service without endpoints.
func testMesh() *generate.Mesh {
	reviews := &generate.Service{
		Namespace: "bookinfo", Name: "reviews",
		Spec: &meshv1.Service{
			Hostnames:  []string{"reviews.bookinfo.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "http", Number: 9080, Protocol: meshv1.Protocol_PROTOCOL_HTTP, TargetPort: 8080}},
		},
		Endpoints: []*meshv1.Endpoint{
			{Address: "10.0.0.1", Labels: map[string]string{"version": "v1"}, Locality: &meshv1.Locality{Region: "us-east1", Zone: "b"}, Weight: 3, Health: meshv1.Health_HEALTH_HEALTHY},
			{Address: "10.0.0.2", Labels: map[string]string{"version": "v2"}, Locality: &meshv1.Locality{Region: "us-east1", Zone: "c"}, Ports: map[string]uint32{"http": 18080}},
			{Address: "10.0.0.3", Labels: map[string]string{"version": "v2"}, Locality: &meshv1.Locality{Region: "us-east1", Zone: "c"}, Health: meshv1.Health_HEALTH_DRAINING},
		},
		Policy: &meshv1.TrafficPolicy{
			Host:         "reviews.bookinfo.svc.cluster.local",
			LoadBalancer: meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST,
			Subsets: []*meshv1.Subset{
				{Name: "v1", Labels: map[string]string{"version": "v1"}},
				{Name: "v2", Labels: map[string]string{"version": "v2"}, LoadBalancer: meshv1.LoadBalancer_LOAD_BALANCER_RANDOM},
			},
		},
	}
	greeter := &generate.Service{
		Namespace: "demo", Name: "greeter",
		Spec: &meshv1.Service{
			Hostnames:  []string{"greeter.demo.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "grpc", Number: 50051, Protocol: meshv1.Protocol_PROTOCOL_GRPC}},
		},
		Endpoints: []*meshv1.Endpoint{{Address: "10.1.0.1"}},
	}
	external := &generate.Service{
		Namespace: "shop", Name: "payments",
		Spec: &meshv1.Service{
			Hostnames:  []string{"api.payments.example.com"},
			Resolution: meshv1.Resolution_RESOLUTION_NONE,
			Ports:      []*meshv1.Port{{Name: "tls", Number: 443, Protocol: meshv1.Protocol_PROTOCOL_TLS}},
		},
	}
	route := &generate.Route{Namespace: "bookinfo", Name: "reviews", Rule: &meshv1.RouteRule{
		Hosts: []string{"reviews.bookinfo.svc.cluster.local"},
		Http: []*meshv1.HTTPRoute{
			{
				Name: "jason",
				Match: []*meshv1.HTTPMatch{
					{Headers: map[string]*meshv1.StringMatch{"end-user": exact("jason")}, Method: exact("GET"),
						Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/reviews"}}},
					{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: "/v[0-9]+/reviews"}}},
					{Uri: exact("/elsewhere"), Port: 80}, // another port: not on this listener
				},
				Route:   []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "reviews.bookinfo.svc.cluster.local", Subset: "v2"}}},
				Timeout: durationpb.New(1500e6),
				Retries: &meshv1.RetryPolicy{Attempts: 3, PerTryTimeout: durationpb.New(250e6)},
			},
			{
				Name: "split",
				Route: []*meshv1.RouteDestination{
					{Destination: &meshv1.Destination{Host: "reviews.bookinfo.svc.cluster.local", Subset: "v1"}, Weight: 75},
					{Destination: &meshv1.Destination{Host: "reviews.bookinfo.svc.cluster.local", Subset: "v2"}, Weight: 25},
				},
			},
		},
	}}
	// Bound to an ingress gateway only: sidecars and proxyless clients
	// ignore it (it would otherwise win, sorting first).
	gatewayOnly := &generate.Route{Namespace: "a-ingress", Name: "greeter", Rule: &meshv1.RouteRule{
		Hosts:    []string{"greeter.demo.svc.cluster.local"},
		Gateways: []string{"istio-system/ingress"},
		Http:     []*meshv1.HTTPRoute{{Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "reviews.bookinfo.svc.cluster.local"}}}}},
	}}
	ratings, ratingsRoute := ratingsMesh()
	// A TCP service gets a TCP proxy listener on its port.
	mysql := &generate.Service{
		Namespace: "db", Name: "mysql",
		Spec: &meshv1.Service{
			Hostnames:  []string{"mysql.db.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "tcp-mysql", Number: 3306, Protocol: meshv1.Protocol_PROTOCOL_TCP}},
		},
		Endpoints: []*meshv1.Endpoint{{Address: "10.3.0.1"}},
	}
	// A VirtualService bound to the ingress gateway, for an external host.
	ingressRoute := &generate.Route{Namespace: "bookinfo", Name: "bookinfo", Rule: &meshv1.RouteRule{
		Hosts:    []string{"bookinfo.example.com"},
		Gateways: []string{"istio-system/ingress"},
		Http: []*meshv1.HTTPRoute{{
			Match: []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/reviews"}}}},
			Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "reviews.bookinfo.svc.cluster.local", Subset: "v1"}}},
		}},
	}}
	return generate.NewMesh([]*generate.Service{reviews, greeter, external, ratings, mysql}, []*generate.Route{route, gatewayOnly, ratingsRoute, ingressRoute})
}

// ratingsMesh is the ratings service and its routes: every route and
// policy feature reviews does not use.
func ratingsMesh() (*generate.Service, *generate.Route) {
	ratings := &generate.Service{
		Namespace: "bookinfo", Name: "ratings",
		Spec: &meshv1.Service{
			Hostnames:  []string{"ratings.bookinfo.svc.cluster.local"},
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "grpc", Number: 9090, Protocol: meshv1.Protocol_PROTOCOL_GRPC}},
		},
		Endpoints: []*meshv1.Endpoint{{Address: "10.2.0.1", Labels: map[string]string{"version": "canary"}}},
		Policy: &meshv1.TrafficPolicy{
			Host:           "ratings.bookinfo.svc.cluster.local",
			ConsistentHash: &meshv1.ConsistentHash{Key: &meshv1.ConsistentHash_HttpHeaderName{HttpHeaderName: "x-user"}, MinimumRingSize: 1024},
			ConnectionPool: &meshv1.ConnectionPool{MaxConnections: 50, ConnectTimeout: durationpb.New(250e6), MaxPendingRequests: 10,
				MaxRequests: 200, MaxRequestsPerConnection: 5, MaxRetries: 3},
			OutlierDetection: &meshv1.OutlierDetection{Consecutive_5XxErrors: 7, Interval: durationpb.New(5e9),
				BaseEjectionTime: durationpb.New(30e9), MaxEjectionPercent: 50},
			Tls:     &meshv1.ClientTLS{Mode: meshv1.ClientTLS_MODE_ISTIO_MUTUAL, Sni: "ratings.bookinfo.svc.cluster.local"},
			Subsets: []*meshv1.Subset{{Name: "canary", Labels: map[string]string{"version": "canary"}}},
		},
	}
	ratingsHost := "ratings.bookinfo.svc.cluster.local"
	ratingsRoute := &generate.Route{Namespace: "bookinfo", Name: "ratings", Rule: &meshv1.RouteRule{
		Hosts: []string{ratingsHost},
		Http: []*meshv1.HTTPRoute{
			{
				Name:  "faulty",
				Match: []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/slow"}}}},
				Route: []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: ratingsHost}}},
				Fault: &meshv1.Fault{
					Delay: &meshv1.Fault_Delay{FixedDelay: durationpb.New(2e9), Percentage: 10},
					Abort: &meshv1.Fault_Abort{GrpcStatus: "UNAVAILABLE", Percentage: 5.5},
				},
			},
			{
				Name:     "moved",
				Match:    []*meshv1.HTTPMatch{{Uri: exact("/old")}},
				Redirect: &meshv1.Redirect{Uri: "/new", Authority: "ratings.example.com", RedirectCode: 308},
			},
			{
				Name:    "rewritten",
				Match:   []*meshv1.HTTPMatch{{Uri: &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: "/api/v1"}}}},
				Route:   []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: ratingsHost}}},
				Rewrite: &meshv1.Rewrite{Uri: "/v1", Authority: "ratings-internal"},
				Mirror:  &meshv1.Mirror{Destination: &meshv1.Destination{Host: ratingsHost, Subset: "canary"}, Percentage: 25},
				Headers: &meshv1.Headers{
					Request:  &meshv1.HeaderOperations{Set: map[string]string{"x-version": "1"}, Remove: []string{"x-debug"}},
					Response: &meshv1.HeaderOperations{Add: map[string]string{"x-served-by": "ratings"}},
				},
			},
		},
	}}
	return ratings, ratingsRoute
}

// testGateways: an ingress gateway admitting bookinfo's hosts on 80 (with
// an HTTPS redirect) and 8080, and a TLS server that is not generated yet.
func testGateways() []*generate.Gateway {
	return []*generate.Gateway{{Namespace: "istio-system", Name: "ingress", Spec: &meshv1.Gateway{
		Selector: map[string]string{"istio": "ingressgateway"},
		Servers: []*meshv1.GatewayServer{
			{Port: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"bookinfo/*"}, Tls: &meshv1.GatewayTLS{HttpsRedirect: true}},
			{Port: 8080, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*"}},
			{Port: 443, Protocol: meshv1.Protocol_PROTOCOL_HTTPS, Hosts: []string{"bookinfo/*"}, Tls: &meshv1.GatewayTLS{Mode: "SIMPLE", CredentialName: "cert"}},
			{Name: "partners", Port: 443, Protocol: meshv1.Protocol_PROTOCOL_HTTPS, Hosts: []string{"*/api.partners.example.com"}, Tls: &meshv1.GatewayTLS{Mode: "MUTUAL", CredentialName: "partners"}},
			{Name: "mesh", Port: 15443, Protocol: meshv1.Protocol_PROTOCOL_HTTPS, Hosts: []string{"*"}, Tls: &meshv1.GatewayTLS{Mode: "ISTIO_MUTUAL"}},
			{Name: "passthrough", Port: 8443, Protocol: meshv1.Protocol_PROTOCOL_TLS, Hosts: []string{"*"}, Tls: &meshv1.GatewayTLS{Mode: "PASSTHROUGH"}},
		},
	}}}
}

func TestGenerate(t *testing.T) {
	m := testMesh()
	golden.CheckValid(t, "gateway-listeners.json", generate.GatewayListeners(m, testGateways(), generate.ListenPorts(m, testGateways())))
	golden.CheckValid(t, "gateway-routes.json", generate.GatewayRoutes(m, testGateways(), generate.ListenPorts(m, testGateways())))
	golden.CheckValid(t, "endpoints.json", generate.LoadAssignments(m))
	for _, proxy := range []generate.Proxy{generate.Envoy, generate.Proxyless} {
		golden.CheckValid(t, "clusters-"+proxy.String()+".json", generate.Clusters(m, proxy))
		golden.CheckValid(t, "listeners-"+proxy.String()+".json", generate.Listeners(m, proxy, nil))
		golden.CheckValid(t, "routes-"+proxy.String()+".json", generate.Routes(m, proxy))
	}
}

func TestViews(t *testing.T) {
	svc := func(ns, name string, exportTo ...string) *generate.Service {
		return &generate.Service{Namespace: ns, Name: name, Spec: &meshv1.Service{
			Hostnames: []string{name + "." + ns + ".svc.cluster.local"}, ExportTo: exportTo,
			Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports:      []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
		}}
	}
	m := generate.NewMesh([]*generate.Service{
		svc("shop", "cart"), svc("shop", "secret", "."), svc("books", "reviews"), svc("books", "ratings", "shop"),
		svc("ext", "api"),
	}, nil)
	tests := map[string]struct {
		view generate.View
		want []string
	}{
		"no namespace sees everything":      {generate.View{}, []string{"ratings", "reviews", "api", "cart", "secret"}},
		"exportTo . hides from others":      {generate.View{Namespace: "books"}, []string{"reviews", "api", "cart"}},
		"exportTo a namespace shows to it":  {generate.View{Namespace: "shop"}, []string{"ratings", "reviews", "api", "cart", "secret"}},
		"sidecar: own namespace only":       {generate.View{Namespace: "shop", Egress: []string{"./*"}}, []string{"cart", "secret"}},
		"sidecar: a namespace and one host": {generate.View{Namespace: "shop", Egress: []string{"books/*", "*/api.ext.svc.cluster.local"}}, []string{"ratings", "reviews", "api"}},
		"sidecar: wildcard host suffix":     {generate.View{Namespace: "books", Egress: []string{"*/*.shop.svc.cluster.local"}}, []string{"cart"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, s := range m.For(tc.view).Services {
				got = append(got, s.Name)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("sees %v, want %v", got, tc.want)
			}
		})
	}
}

// TestGatewayAPIListenerTakesItsRoutesAlone: a Kubernetes Gateway's
// listener (its allowedRoutes admit routes of a selected namespace, hosts
// "*/...") serves the Gateway API routes bound to it, not a VirtualService
// of another namespace naming it, which bypassed allowedRoutes; an Istio
// Gateway takes no Gateway API rule that names it.
func TestGatewayAPIListenerTakesItsRoutesAlone(t *testing.T) {
	dest := []*meshv1.RouteDestination{{Destination: &meshv1.Destination{Host: "reviews.bookinfo.svc.cluster.local"}}}
	listener := "web-istio-autogenerated-k8s-gateway-http"
	allowed := &generate.Route{Namespace: "shop", Name: "shop-route", Rule: &meshv1.RouteRule{GatewayApi: true,
		Hosts: []string{"shop.example.com"}, Gateways: []string{"infra/" + listener}, Http: []*meshv1.HTTPRoute{{Route: dest}}}}
	bypass := &generate.Route{Namespace: "intruder", Name: "vs", Rule: &meshv1.RouteRule{
		Hosts: []string{"intruder.example.com"}, Gateways: []string{"infra/" + listener}, Http: []*meshv1.HTTPRoute{{Route: dest}}}}
	stray := &generate.Route{Namespace: "shop", Name: "stray-route", Rule: &meshv1.RouteRule{GatewayApi: true,
		Hosts: []string{"stray.example.com"}, Gateways: []string{"infra/istio-ingress"}, Http: []*meshv1.HTTPRoute{{Route: dest}}}}
	m := generate.NewMesh(nil, []*generate.Route{allowed, bypass, stray})
	gws := []*generate.Gateway{
		{Namespace: "infra", Name: listener, Spec: &meshv1.Gateway{GatewayApi: true, Selector: map[string]string{"gateway.networking.k8s.io/gateway-name": "web"},
			Servers: []*meshv1.GatewayServer{{Name: "http", Port: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*/*"}}}}},
		{Namespace: "infra", Name: "istio-ingress", Spec: &meshv1.Gateway{Selector: map[string]string{"istio": "ingress"},
			Servers: []*meshv1.GatewayServer{{Port: 8080, Protocol: meshv1.Protocol_PROTOCOL_HTTP, Hosts: []string{"*/*"}}}}},
	}
	var hosts []string
	for _, rc := range generate.GatewayRoutes(m, gws, generate.ListenPorts(m, gws)) {
		for _, vh := range rc.VirtualHosts {
			hosts = append(hosts, vh.Domains...)
		}
	}
	if !slices.Contains(hosts, "shop.example.com") {
		t.Errorf("the Gateway API route is not served at its listener: %v", hosts)
	}
	for _, h := range []string{"intruder.example.com", "stray.example.com"} {
		if slices.Contains(hosts, h) {
			t.Errorf("%s is served: a rule bound a gateway of the other API by name (%v)", h, hosts)
		}
	}
}
