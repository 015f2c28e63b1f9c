package pusher

import (
	"hash/maphash"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The owner's memos (owner.go): what a generation keeps for the next.

// classMemo holds a value per class; a class the tables dropped is
// forgotten at the next full generation.
type classMemo[V any] struct{ by map[cache.Class]V }

func (m *classMemo[V]) get(class cache.Class) (V, bool) {
	v, ok := m.by[class]
	return v, ok
}

func (m *classMemo[V]) set(class cache.Class, v V) {
	if m.by == nil {
		m.by = map[cache.Class]V{}
	}
	m.by[class] = v
}

func (m *classMemo[V]) forget(class cache.Class) { delete(m.by, class) }

// keep forgets the classes not listed (dropped by the tables).
func (m *classMemo[V]) keep(classes []cache.Class) {
	for class := range m.by {
		if !slices.Contains(classes, class) {
			delete(m.by, class)
		}
	}
}

// sizes keeps, per type, the largest class's resource count and bytes of
// a generation.
type sizes struct {
	count, bytes map[string]int
}

func (s *sizes) observe(typ string, count, bytes int) {
	if s.count == nil {
		s.count, s.bytes = map[string]int{}, map[string]int{}
	}
	s.count[typ] = max(s.count[typ], count)
	s.bytes[typ] = max(s.bytes[typ], bytes)
}

// flush sets the gauges and starts over.
func (s *sizes) flush(m metrics) {
	for typ, n := range s.count {
		m.resources.WithLabelValues(typ).Set(float64(n))
		m.configBytes.WithLabelValues(typ).Set(float64(s.bytes[typ]))
	}
	s.count, s.bytes = nil, nil
}

// serverPorts remembers, from the last full generation, the ports each
// service's proxyless servers got listeners for and the target ports it
// gives the gateways' server ports; and the gateways' selectors, which
// change only with a full generation.
type serverPorts struct {
	print   map[string]string
	targets generate.GatewayTargets
}

func (s *serverPorts) record(mesh *generate.Mesh) {
	s.targets = generate.NewGatewayTargets(mesh.Gateways)
	s.print = make(map[string]string, len(mesh.Services))
	for _, svc := range mesh.Services {
		s.print[svc.Namespace+"/"+svc.Name] = s.printOf(svc)
	}
}

// printOf prints a service's ports and what its clusters read of its
// endpoints (its configuration version: their service accounts, which its
// clusters expect of a peer, whether a headless service's all have
// sidecars): an endpoint change that changes either generates the classes
// again.
func (s *serverPorts) printOf(svc *generate.Service) string {
	return generate.ServicePortsPrint(svc) + "|" + s.targets.Print(svc) + "|" + svc.ConfigVersion
}

// of returns a service's ports as recorded (computed when it is new).
func (s *serverPorts) of(svc *generate.Service) string {
	if print, ok := s.print[svc.Namespace+"/"+svc.Name]; ok {
		return print
	}
	return s.printOf(svc)
}

// changed reports whether endpoint changes gave a service another set of
// served ports, or moved a gateway's target port: the listeners of
// proxyless servers or routers must be generated again, not only the load
// assignments.
func (s *serverPorts) changed(services []*generate.Service) bool {
	for _, svc := range services {
		if s.print[svc.Namespace+"/"+svc.Name] != s.printOf(svc) {
			return true
		}
	}
	return false
}

// routeMemo keeps each class's last route configurations by name, so that
// one made of the same virtual hosts is handed to the cache as the same
// object and neither encoded nor sent again: only the route configurations
// a change touched are new. It also keeps those the classes were handed
// since the full generation began (shared), so that a class that makes
// the same configuration as another is handed the other's object, which
// the cache checked and encoded once: classes that see the same services
// alike (the Envoys of namespaces without services of their own) each
// made a port's configuration of 20,000 virtual hosts, 8.5 MB, and the
// cache encoded it once per class.
type routeMemo struct {
	classMemo[map[string]*route.RouteConfiguration]
	// shared holds this full generation's configurations by the hash of
	// their name and virtual hosts.
	shared map[uint64][]*route.RouteConfiguration
}

// generation starts a full generation: the last one's configurations
// are shared no more (they are still each class's last).
func (r *routeMemo) generation() { r.shared = nil }

// reuse returns a class's route configurations: the class's last ones
// where they are made of the same virtual hosts, else another class's
// equal one of this generation.
func (r *routeMemo) reuse(class cache.Class, rcs []*route.RouteConfiguration) []*route.RouteConfiguration {
	prev, _ := r.get(class)
	next := make(map[string]*route.RouteConfiguration, len(rcs))
	for i, rc := range rcs {
		if old, ok := prev[rc.Name]; ok && slices.Equal(old.VirtualHosts, rc.VirtualHosts) {
			rcs[i] = old
		} else {
			rcs[i] = r.share(rc)
		}
		next[rc.Name] = rcs[i]
	}
	r.set(class, next)
	return rcs
}

// share returns this generation's configuration equal to rc (by its
// virtual hosts' identity and its other fields' content), or rc, which it
// keeps for the classes after.
func (r *routeMemo) share(rc *route.RouteConfiguration) *route.RouteConfiguration {
	h := hashRoutes(rc)
	for _, other := range r.shared[h] {
		if other.Name == rc.Name && slices.Equal(other.VirtualHosts, rc.VirtualHosts) && proto.Equal(withoutHosts(other), withoutHosts(rc)) {
			return other
		}
	}
	if r.shared == nil {
		r.shared = map[uint64][]*route.RouteConfiguration{}
	}
	r.shared[h] = append(r.shared[h], rc)
	return rc
}

var routeSeed = maphash.MakeSeed()

// hashRoutes hashes a route configuration's name and its virtual hosts'
// identities.
func hashRoutes(rc *route.RouteConfiguration) uint64 {
	var h maphash.Hash
	h.SetSeed(routeSeed)
	h.WriteString(rc.Name)
	for _, vh := range rc.VirtualHosts {
		maphash.WriteComparable(&h, vh)
	}
	return h.Sum64()
}

// withoutHosts returns a route configuration with rc's fields but its
// virtual hosts, sharing what it holds (rc is not changed).
func withoutHosts(rc *route.RouteConfiguration) *route.RouteConfiguration {
	out := &route.RouteConfiguration{}
	m := out.ProtoReflect()
	rc.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != "virtual_hosts" {
			m.Set(fd, v)
		}
		return true
	})
	return out
}

// apiListeners keeps proxyless clients' listeners by name, from one full
// generation to the next (generate.APIListener: a name's listener is
// always the same), so that the tables are handed the same object and
// skip it: a class of proxyless clients has one per service port, and
// 20,000 were made, checked and encoded anew at every generation.
type apiListeners struct{ cur, next map[string]*listener.Listener }

// get returns the listener of a name.
func (a *apiListeners) get(name string) *listener.Listener {
	l := a.next[name]
	if l == nil {
		if l = a.cur[name]; l == nil {
			l = generate.APIListener(name)
		}
		if a.next == nil {
			a.next = map[string]*listener.Listener{}
		}
		a.next[name] = l
	}
	return l
}

// sweep forgets the listeners not asked for since the sweep before last.
func (a *apiListeners) sweep() { a.cur, a.next = a.next, nil }

// prints holds, per class, a hash of everything its last generation read,
// so that a change the class does not see costs it nothing.
type prints = classMemo[uint64]

// printChanged records a class's print and reports whether it differs from
// the last one.
func printChanged(pr *prints, class cache.Class, print uint64) bool {
	old, ok := pr.get(class)
	pr.set(class, print)
	return !ok || old != print
}

// virtualHosts keeps, from one full generation to the next, the route
// configurations as an Envoy that takes their virtual hosts apart (VHDS)
// is sent them: each configuration without its virtual hosts, and each
// virtual host named as VHDS names it (<route configuration>/<host>). One
// is made per object the generators hand over, so that the tables are
// handed the same objects again and skip them.
type virtualHosts struct {
	cur, next struct {
		routes map[*route.RouteConfiguration]*route.RouteConfiguration
		hosts  map[hostOf]*route.VirtualHost
	}
}

// hostOf is a virtual host of a route configuration, by name.
type hostOf struct {
	routes string
	host   *route.VirtualHost
}

// adsSource names the ADS stream a resource came on as its
// virtual hosts' source.
var adsSource = &core.ConfigSource{ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	ResourceApiVersion: core.ApiVersion_V3}

// routes returns rc without its virtual hosts, which it names the ADS
// stream the source of.
func (v *virtualHosts) routes(rc *route.RouteConfiguration) *route.RouteConfiguration {
	out := v.next.routes[rc]
	if out == nil {
		if out = v.cur.routes[rc]; out == nil {
			out = withoutHosts(rc)
			out.Vhds = &route.Vhds{ConfigSource: adsSource}
		}
		if v.next.routes == nil {
			v.next.routes = map[*route.RouteConfiguration]*route.RouteConfiguration{}
		}
		v.next.routes[rc] = out
	}
	return out
}

// host returns vh named as a virtual host of the route configuration
// routes: <routes>/<its name>.
func (v *virtualHosts) host(routes string, vh *route.VirtualHost) *route.VirtualHost {
	key := hostOf{routes, vh}
	out := v.next.hosts[key]
	if out == nil {
		if out = v.cur.hosts[key]; out == nil {
			out = renamed(vh, routes+"/"+vh.GetName())
		}
		if v.next.hosts == nil {
			v.next.hosts = map[hostOf]*route.VirtualHost{}
		}
		v.next.hosts[key] = out
	}
	return out
}

// carry makes next, a configuration made of old with other virtual hosts,
// share old's configuration without them, which is the same.
func (v *virtualHosts) carry(old, next *route.RouteConfiguration) {
	if v.next.routes == nil {
		v.next.routes = map[*route.RouteConfiguration]*route.RouteConfiguration{}
	}
	v.next.routes[next] = v.routes(old)
}

// sweep forgets what was not asked for since the sweep before last.
func (v *virtualHosts) sweep() {
	v.cur, v.next = v.next, v.cur
	clear(v.next.routes)
	clear(v.next.hosts)
}

// renamed returns vh under another name, sharing what it holds (vh is not
// changed).
func renamed(vh *route.VirtualHost, name string) *route.VirtualHost {
	out := &route.VirtualHost{}
	m := out.ProtoReflect()
	vh.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		m.Set(fd, v)
		return true
	})
	out.Name = name
	return out
}
