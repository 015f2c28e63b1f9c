package pusher

import (
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/patch"
)

// maxRefusals bounds the EnvoyFilter refusals remembered (each is logged
// once).
const maxRefusals = 1024

// shaping is what a class of Envoys' Telemetries and EnvoyFilters make of
// its generated resources: access logs and tracing on its listeners, then
// the patches, in Istio's order.
type shaping struct {
	observe *generate.Observability
	patches *patch.Set
	router  bool
}

// shapingFor returns the shaping of a class of Envoys from the policies
// that apply to it (only Telemetries and EnvoyFilters count); mesh is the
// whole mesh, where telemetry collectors are found. The patches' values
// are decoded once while unchanged (p.patchValues).
func (p *Pusher) shapingFor(mesh *generate.Mesh, sec generate.Security, namespace string, versions map[string]bool, router bool) shaping {
	var filters []*patch.Filter
	for _, pol := range sec {
		if ef, ok := pol.Spec.(*meshv1.EnvoyFilter); ok {
			filters = append(filters, &patch.Filter{Namespace: pol.Namespace, Name: pol.Name, Spec: ef, Root: pol.Root})
		}
	}
	return shaping{observe: generate.ObservabilityFor(mesh, sec, namespace), patches: p.patchValues.NewSet(filters, versions), router: router}
}

func (s shaping) clusters(in []*cluster.Cluster) []*cluster.Cluster {
	return s.patches.Clusters(in, s.router)
}

func (s shaping) routes(in []*route.RouteConfiguration) []*route.RouteConfiguration {
	return s.patches.Routes(in, s.router)
}

func (s shaping) listeners(in []*listener.Listener) []*listener.Listener {
	return s.patches.Listeners(s.observe.Listeners(in, s.router), s.router)
}

// envoyOnly returns the Telemetries and EnvoyFilters among policies.
func envoyOnly(sec generate.Security) generate.Security {
	var out generate.Security
	for _, p := range sec {
		if p.EnvoyOnly() {
			out = append(out, p)
		}
	}
	return out
}

// collectorsPrint names the telemetry collectors of the mesh's providers
// that are services of the mesh: a class's tracing and logs change when
// one comes or goes.
func collectorsPrint(mesh *generate.Mesh) string {
	var b strings.Builder
	for _, p := range mesh.Config.GetTelemetryProviders() {
		var c *meshv1.Collector
		switch k := p.Kind.(type) {
		case *meshv1.TelemetryProvider_OtelAccessLog:
			c = k.OtelAccessLog.Collector
		case *meshv1.TelemetryProvider_OtelTracing:
			c = k.OtelTracing.Collector
		case *meshv1.TelemetryProvider_Zipkin:
			c = k.Zipkin.Collector
		}
		if c != nil && mesh.Service(c.Host) != nil {
			b.WriteString("|c:" + c.Host)
		}
	}
	return b.String()
}

// noteRefusals logs, once each, the patches a class's generation did not
// apply, and counts them.
func (p *Pusher) noteRefusals(class cache.Class, s shaping) {
	for _, r := range s.patches.Refusals() {
		key := r.String()
		if p.refused[key] {
			continue
		}
		if len(p.refused) >= maxRefusals {
			clear(p.refused)
		}
		p.refused[key] = true
		p.m.refusals.Inc()
		p.cfg.Log.Warn("an EnvoyFilter patch is not applied: the resource is served without it", "envoyfilter", r.Filter,
			"patch", r.Patch, "resource", r.Resource, "reason", r.Reason, "class", class)
	}
}
