package patch

import (
	"slices"
	"strings"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
)

// Routes applies the ROUTE_CONFIGURATION, VIRTUAL_HOST and HTTP_ROUTE
// patches to a class's route configurations; those given are not
// modified.
func (s *Set) Routes(in []*route.RouteConfiguration, router bool) []*route.RouteConfiguration {
	patches := s.of(meshv1.EnvoyPatch_APPLY_TO_ROUTE_CONFIGURATION, meshv1.EnvoyPatch_APPLY_TO_VIRTUAL_HOST, meshv1.EnvoyPatch_APPLY_TO_HTTP_ROUTE)
	if len(patches) == 0 {
		return in
	}
	out := slices.Clone(in)
	for i, rc := range out {
		out[i] = s.routeConfig(patches, rc, router)
	}
	return out
}

// routeConfig applies route patches to one route configuration (RDS, or
// inline in a connection manager), returning it if none applies.
func (s *Set) routeConfig(patches []bound, rc *route.RouteConfiguration, router bool) *route.RouteConfiguration {
	inbound := strings.HasPrefix(rc.Name, "inbound|")
	for _, b := range patches {
		if !contextMatches(b.p.Context, router, inbound) || !routeConfigMatches(b.p.Match, rc) {
			continue
		}
		what := "route configuration " + rc.Name
		switch b.p.ApplyTo {
		case meshv1.EnvoyPatch_APPLY_TO_ROUTE_CONFIGURATION:
			rc = patched(s, b, what, rc, func(rc *route.RouteConfiguration) error { merge(rc, b.value); return nil })
		case meshv1.EnvoyPatch_APPLY_TO_VIRTUAL_HOST:
			rc = patched(s, b, what, rc, func(rc *route.RouteConfiguration) error { virtualHosts(b, rc); return nil })
		case meshv1.EnvoyPatch_APPLY_TO_HTTP_ROUTE:
			rc = patched(s, b, what, rc, func(rc *route.RouteConfiguration) error {
				for _, vh := range rc.VirtualHosts {
					routes(b, vh)
				}
				return nil
			})
		}
	}
	return rc
}

func routeConfigMatches(m *meshv1.PatchMatch, rc *route.RouteConfiguration) bool {
	if m.GetRouteConfigName() != "" && m.GetRouteConfigName() != rc.Name {
		return false
	}
	return m.GetPort() == 0 || portOf(rc.Name) == m.GetPort()
}

// virtualHosts applies a VIRTUAL_HOST patch to a route configuration.
func virtualHosts(b bound, rc *route.RouteConfiguration) {
	name := b.p.Match.GetVhostName()
	switch b.p.Operation {
	case meshv1.EnvoyPatch_OPERATION_ADD:
		rc.VirtualHosts = append(rc.VirtualHosts, proto.CloneOf(b.value.(*route.VirtualHost)))
	case meshv1.EnvoyPatch_OPERATION_REMOVE:
		rc.VirtualHosts = slices.DeleteFunc(rc.VirtualHosts, func(vh *route.VirtualHost) bool { return name == "" || vh.Name == name })
	case meshv1.EnvoyPatch_OPERATION_MERGE:
		for _, vh := range rc.VirtualHosts {
			if name == "" || vh.Name == name {
				merge(vh, b.value)
			}
		}
	}
}

// routes applies an HTTP_ROUTE patch to the routes of a virtual host the
// patch's match takes.
func routes(b bound, vh *route.VirtualHost) {
	m := b.p.Match
	if m.GetVhostName() != "" && m.GetVhostName() != vh.Name {
		return
	}
	matches := func(r *route.Route) bool {
		return (m.GetRouteName() == "" || r.Name == m.GetRouteName()) && actionMatches(m.GetRouteAction(), r)
	}
	selective := m.GetRouteName() != "" || m.GetRouteAction() != ""
	add := func() *route.Route { return proto.CloneOf(b.value.(*route.Route)) }
	switch b.p.Operation {
	case meshv1.EnvoyPatch_OPERATION_REMOVE:
		vh.Routes = slices.DeleteFunc(vh.Routes, matches)
	case meshv1.EnvoyPatch_OPERATION_MERGE:
		for _, r := range vh.Routes {
			if matches(r) {
				merge(r, b.value)
			}
		}
	case meshv1.EnvoyPatch_OPERATION_INSERT_FIRST:
		vh.Routes = slices.Insert(vh.Routes, 0, add())
	case meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, meshv1.EnvoyPatch_OPERATION_INSERT_AFTER:
		vh.Routes = inserted(vh.Routes, add(), slices.IndexFunc(vh.Routes, matches), selective, b.p.Operation == meshv1.EnvoyPatch_OPERATION_INSERT_AFTER)
	}
}

func actionMatches(action string, r *route.Route) bool {
	switch action {
	case "ROUTE":
		return r.GetRoute() != nil
	case "REDIRECT":
		return r.GetRedirect() != nil
	case "DIRECT_RESPONSE":
		return r.GetDirectResponse() != nil
	}
	return true
}
