package server

import (
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
)

// handler is what the service descriptions below call; a Server is one.
type handler interface {
	serveSotW(ss grpc.ServerStream, typeURL string) error
	serveDelta(ss grpc.ServerStream, typeURL string) error
}

var _ handler = (*Server)(nil)

// services are Envoy's discovery services the server answers: the
// aggregated one (every type on one stream) and one per type. Their
// streams are served by the server's own handlers, with requests decoded
// by its codec, rather than through the generated service interfaces.
var services = []struct {
	name, sotw, delta, typeURL, file string
}{
	{"envoy.service.discovery.v3.AggregatedDiscoveryService", "StreamAggregatedResources", "DeltaAggregatedResources", "", "envoy/service/discovery/v3/ads.proto"},
	{"envoy.service.cluster.v3.ClusterDiscoveryService", "StreamClusters", "DeltaClusters", resource.ClusterType, "envoy/service/cluster/v3/cds.proto"},
	{"envoy.service.endpoint.v3.EndpointDiscoveryService", "StreamEndpoints", "DeltaEndpoints", resource.EndpointType, "envoy/service/endpoint/v3/eds.proto"},
	{"envoy.service.listener.v3.ListenerDiscoveryService", "StreamListeners", "DeltaListeners", resource.ListenerType, "envoy/service/listener/v3/lds.proto"},
	{"envoy.service.route.v3.RouteDiscoveryService", "StreamRoutes", "DeltaRoutes", resource.RouteType, "envoy/service/route/v3/rds.proto"},
}

func (s *Server) register(gs *grpc.Server) {
	for _, svc := range services {
		typeURL := svc.typeURL
		gs.RegisterService(&grpc.ServiceDesc{
			ServiceName: svc.name,
			HandlerType: (*handler)(nil),
			Streams: []grpc.StreamDesc{
				{StreamName: svc.sotw, ServerStreams: true, ClientStreams: true,
					Handler: func(srv any, ss grpc.ServerStream) error { return srv.(handler).serveSotW(ss, typeURL) }},
				{StreamName: svc.delta, ServerStreams: true, ClientStreams: true,
					Handler: func(srv any, ss grpc.ServerStream) error { return srv.(handler).serveDelta(ss, typeURL) }},
			},
			Metadata: svc.file,
		}, s)
	}
}

func (s *Server) serveSotW(ss grpc.ServerStream, typeURL string) error {
	r := &sotwRequest{}
	return s.serve(ss, false, func(st *stream) error { return st.recv(r) }, func(st *stream) error {
		defer r.release()
		return st.applySotW(r, typeURL)
	})
}

func (s *Server) serveDelta(ss grpc.ServerStream, typeURL string) error {
	r := &deltaRequest{maxInitial: s.cfg.MaxNames}
	return s.serve(ss, true, func(st *stream) error { return st.recv(r) }, func(st *stream) error { return st.applyDelta(r, typeURL) })
}
