package pusher

import (
	"cmp"
	"encoding/binary"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	gcpcache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/classify"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// generate rebuilds the resources and hands them to the tables. Endpoint
// changes alone rebuild only the load assignments of the services whose
// endpoints changed (the EDS fast path); route rules that change virtual
// hosts alone, only those virtual hosts (rerouteClass). Per-service
// resources come from an LRU cache keyed by the versions of their inputs,
// so a generation costs what changed, not the mesh.
func (p *Pusher) generate(c change) {
	start := time.Now()
	p.m.debounce.Observe(start.Sub(c.since).Seconds())
	if c.full && c.endpoints > 0 && p.fullTook > endpointsAheadAfter && p.endpointsAhead(c, true) {
		// Full generations take long: the load assignments went out
		// first.
		c.n, c.endpoints, c.endpointsObserved = c.n-c.endpoints, 0, time.Time{}
		start = time.Now()
	}
	if c.full && p.fullTook > endpointsAheadAfter {
		// So do route changes that change virtual hosts alone.
		p.routesAhead(c)
	}
	p.conv.begin(c.earliestObserved())
	generatedBefore := p.generated.Load()
	p.delivered = p.cfg.Tables.Backlog() == 0
	p.gen++
	p.genAt = start
	p.lru.sweep(start)
	built, index, rev := p.state.mesh()
	mesh := built.Mesh
	previous := p.index.Swap(index)
	p.last = mesh
	p.noteSettings(built.Settings)
	if !c.full && (built.Changed == nil || p.serverPorts.changed(built.Changed)) {
		// The build joined everything again (endpoints of a DNS service
		// are part of its clusters), or endpoints changed the ports
		// proxyless servers serve or gateways listen on: generate the
		// classes again.
		c.full = true
	}
	if c.full {
		p.serverPorts.record(mesh)
	}
	p.generateEndpoints(built)
	kind := "eds"
	if c.full {
		classes := p.cfg.Tables.Classes()
		p.routes.generation()
		rerouted := p.reroutable(c, built)
		kind = "full"
		if rerouted != nil {
			kind = "routes"
		}
		ahead := start
		for _, class := range classes {
			if rerouted == nil || !p.rerouteClass(mesh, class, rerouted) {
				p.generateClass(mesh, class)
			}
			if time.Since(ahead) > endpointsAheadAfter {
				// Endpoint changes made meanwhile go out between the
				// classes of a long generation.
				p.endpointsMeanwhile()
				ahead = time.Now()
			}
		}
		p.routes.keep(classes)
		p.prints.keep(classes)
		if rerouted == nil {
			// What the classes rerouted since kept is asked for again.
			p.patchValues.Sweep()
			p.apiListeners.sweep()
			p.vhds.sweep()
			p.reroutes = 0
		}
		p.linger.keep(classes)
		p.armLinger(start, p.linger.next())
		if previous != nil && !previous.Same(index) {
			// Sidecars, exportTo or Gateways changed: a connected proxy may
			// belong to another class now.
			select {
			case p.classesChanged <- struct{}{}:
			default:
			}
		}
		p.sizes.flush(p.m)
	}
	if g := p.generated.Load(); g != generatedBefore && g > rev {
		// Endpoints went ahead between the classes, from a later revision.
		rev = g
	}
	p.generated.Store(rev)
	if kind == "full" {
		p.fullTook = time.Since(start)
	}
	p.m.generations.WithLabelValues(kind).Inc()
	p.m.genTime.Observe(time.Since(start).Seconds())
	p.cfg.Log.Debug("generated", "revision", rev, "changes", c.n, "kind", kind, "took", time.Since(start))
}

// noteSettings logs the mesh's settings when they change, and warns of
// those the pushers take from their own configuration instead.
func (p *Pusher) noteSettings(s *meshv1.MeshConfig) {
	if s == p.settings {
		return
	}
	p.settings = s
	if s == nil {
		p.cfg.Log.Info("mesh settings: istiod's defaults (no MeshConfig stored)")
		return
	}
	p.cfg.Log.Info("mesh settings applied", "from", s.GetOrigin().GetLocation(), "version", s.GetOrigin().GetSourceVersion())
	for _, d := range []struct{ field, mesh, own, flag string }{
		{"trustDomain", s.TrustDomain, cmp.Or(p.cfg.TrustDomain, "cluster.local"), "--trust-domain"},
		{"rootNamespace", s.RootNamespace, p.state.b.RootNamespace, "--root-namespace"},
	} {
		if d.mesh != "" && d.mesh != d.own {
			p.cfg.Log.Warn("the mesh's MeshConfig differs from the pushers' own setting, which applies", "field", d.field,
				"meshconfig", d.mesh, "pushers", d.own, "flag", d.flag)
		}
	}
}

// generateEndpoints hands the load assignments to the tables, and their
// variants to each locality's table: every service's after a join, only
// the changed services' after an endpoint change.
func (p *Pusher) generateEndpoints(built *meshbuild.Built) {
	mesh := built.Mesh
	if built.Changed == nil || p.eds == nil {
		p.eds = make(map[string][]string, len(mesh.Services))
		var eds []*endpoint.ClusterLoadAssignment
		for _, s := range mesh.Services {
			las := cached(p, "eds", "", mesh, s, generate.ServiceLoadAssignments)
			p.eds[s.Namespace+"/"+s.Name] = names(las)
			eds = append(eds, las...)
		}
		p.edsCount = len(eds)
		publish(p, "", resource.EndpointType, eds)
		p.generateLocalities(mesh, nil, nil)
		return
	}
	if len(built.Changed) == 0 {
		return
	}
	set := map[string]types.Resource{}
	var remove []string
	for _, s := range built.Changed {
		id := s.Namespace + "/" + s.Name
		remove = append(remove, p.eds[id]...)
		las := cached(p, "eds", "", mesh, s, generate.ServiceLoadAssignments)
		for _, la := range las {
			set[la.ClusterName] = la
		}
		p.edsCount += len(las) - len(p.eds[id])
		p.eds[id] = names(las)
	}
	_, _, size, err := p.cfg.Tables.Patch("", resource.EndpointType, set, remove)
	if err != nil {
		p.cfg.Log.Error("cache update failed", "class", "", "type", resource.EndpointType, "err", err)
		return
	}
	p.sizes.observe("ClusterLoadAssignment", p.edsCount, size)
	p.generateLocalities(mesh, built.Changed, remove)
}

func names(las []*endpoint.ClusterLoadAssignment) []string {
	out := make([]string, len(las))
	for i, la := range las {
		out[i] = la.ClusterName
	}
	return out
}

// maxReroutes is how many generations in a row may reroute classes (see
// rerouteClass) before a full change generates them whole again, letting
// go of what the memos kept for them meanwhile.
const maxReroutes = 64

// reroutable returns the change of route rules a full change is, when
// classes may be rerouted for it (see rerouteClass): route rules alone
// changed since the last generation, besides endpoints, and they change
// nothing but virtual hosts (meshbuild.Built.Rerouted). Else nil.
func (p *Pusher) reroutable(c change, built *meshbuild.Built) *generate.Rerouted {
	r := built.Rerouted
	if c.whole || r == nil || p.reroutes >= maxReroutes {
		return nil
	}
	p.reroutes++
	return r
}

// rerouteClass brings a class up to a change of route rules that changes
// nothing but virtual hosts (generate.Rerouted.Local): it generates the
// virtual hosts of the hosts the rules name, puts them in place of the
// class's last ones, and hands over the route configurations (and for
// VHDS, the virtual hosts) they are in. Its clusters and listeners, which
// such a change leaves as they are, are not generated: a route change
// costs what it changed, not the mesh the class sees (1.0-1.3 CPU-s for a
// full generation with 20,000 services). It reports false, having changed
// nothing, when the class must be generated whole: it has no route
// configurations yet, EnvoyFilters patch its routes, or the change reaches
// further in its view (generate.Mesh.ReroutedHosts). A gateway proxy's
// class has nothing to change: the rules bind no gateway.
func (p *Pusher) rerouteClass(mesh *generate.Mesh, class cache.Class, c *generate.Rerouted) bool {
	if _, ok := classify.Gateways(class); ok {
		return true
	}
	last, ok := p.routes.get(class)
	if !ok {
		return false
	}
	proxy, view, m := p.classView(mesh, class)
	if proxy != generate.Envoy && proxy != generate.Proxyless {
		return false
	}
	if proxy == generate.Envoy && slices.ContainsFunc(mesh.PoliciesFor(view.Namespace, view.Policies), func(pol *generate.Policy) bool {
		_, ok := pol.Spec.(*meshv1.EnvoyFilter)
		return ok
	}) {
		return false
	}
	hosts, ok := m.ReroutedHosts(proxy, c)
	if !ok {
		return false
	}
	vhost := p.virtualHost(proxy)
	next := map[string]*route.RouteConfiguration{}
	type placed struct {
		routes string // the route configuration's name
		vh     *route.VirtualHost
	}
	var changed []placed
	for _, h := range hosts {
		rc := next[h.Routes]
		if rc == nil {
			rc = last[h.Routes]
		}
		if rc == nil && !h.Portless {
			return false
		}
		name := generate.ListenerName(h.Host, h.Port)
		i := slices.IndexFunc(rc.GetVirtualHosts(), func(vh *route.VirtualHost) bool { return vh.GetName() == name })
		var vh *route.VirtualHost
		if h.Portless {
			// The rule's own virtual host on port 80: it may have none
			// before and after (no port 80 in the view, no route of it
			// that applies there), which changes nothing.
			vh = generate.PortlessVirtualHost(m, h.Host)
			if i < 0 && vh == nil {
				continue
			}
			if i < 0 || vh == nil {
				return false // it comes or goes
			}
		} else {
			if i < 0 {
				return false // it lost every domain to a host before it
			}
			vh = vhost(m, h.Host, h.Port)
		}
		if rc == last[h.Routes] {
			rc = withoutHosts(rc)
			rc.VirtualHosts = slices.Clone(last[h.Routes].VirtualHosts)
			next[h.Routes] = rc
		}
		if was := rc.VirtualHosts[i]; !slices.Equal(vh.Domains, was.Domains) {
			// It lost some domains to hosts before it, which a route
			// change does not change (see uniqueDomains).
			vh = proto.CloneOf(vh)
			vh.Domains = was.Domains
		}
		rc.VirtualHosts[i] = vh
		changed = append(changed, placed{h.Routes, vh})
	}
	vhds := p.VirtualHosts(class)
	routes := maps.Clone(last)
	set := make(map[string]types.Resource, len(next))
	for name, rc := range next {
		// Classes that shared the configuration before share it after.
		shared := p.routes.share(rc)
		routes[name], set[name] = shared, shared
		if vhds {
			p.vhds.carry(last[name], shared)
		}
	}
	p.routes.set(class, routes)
	// The print no longer says what the class holds: the next full
	// generation generates it whole.
	p.prints.forget(class)
	p.patch(class, resource.RouteType, set)
	if vhds {
		apart := make(map[string]types.Resource, len(changed))
		for _, c := range changed {
			vh := p.vhds.host(c.routes, c.vh)
			apart[vh.Name] = vh
		}
		p.patch(class, resource.VirtualHostType, apart)
	}
	p.m.classes.WithLabelValues("rerouted").Inc()
	return true
}

// patch hands the tables some resources of a class, leaving the others as
// they are.
func (p *Pusher) patch(class cache.Class, typeURL string, set map[string]types.Resource) {
	if len(set) == 0 {
		return
	}
	changed, _, _, err := p.cfg.Tables.Patch(class, typeURL, set, nil)
	if err != nil {
		p.cfg.Log.Error("cache update failed", "class", class, "type", typeURL, "err", err)
		return
	}
	if changed > 0 {
		p.cfg.Log.Debug("resources updated", "class", class, "type", typeURL, "changed", changed)
	}
}

// classView returns the kind of proxy of a (sidecar or proxyless) class,
// its view and the part of the mesh it sees.
func (p *Pusher) classView(mesh *generate.Mesh, class cache.Class) (generate.Proxy, generate.View, *generate.Mesh) {
	proxy, view := p.index.Load().View(class)
	view.RegistryOnly = view.Outbound == meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY ||
		view.Outbound == meshv1.OutboundPolicy_OUTBOUND_POLICY_UNSET && mesh.RegistryOnly
	return proxy, view, mesh.For(view)
}

// generateClass generates the clusters, routes and listeners of one class
// from the part of the mesh its view sees.
func (p *Pusher) generateClass(mesh *generate.Mesh, class cache.Class) {
	if gateways, ok := classify.Gateways(class); ok {
		p.generateRouter(mesh, class, gateways)
		return
	}
	proxy, view, m := p.classView(mesh, class)
	// Its inbound security (an Envoy's virtual inbound listener, a
	// proxyless class's servers' listeners) follows the policies that
	// apply; a proxyless class also follows the ports its namespace serves.
	security := mesh.PoliciesFor(view.Namespace, view.Policies)
	// One builder: a proxyless class's print names every service it
	// serves, and concatenating in turn was quadratic in them.
	var sb strings.Builder
	for _, pol := range security {
		sb.WriteString("|" + pol.Tag() + "@" + pol.Version)
	}
	if proxy == generate.Proxyless {
		for _, s := range mesh.Services {
			if view.Namespace == "" || s.Namespace == view.Namespace {
				sb.WriteString(s.Namespace + "/" + s.Name + ":" + p.serverPorts.of(s) + "|")
			}
		}
		for _, pol := range mesh.Policies {
			// The namespaces with policies have classes of their own.
			sb.WriteString("|" + pol.Namespace + "/" + pol.Tag() + "@" + pol.Version)
		}
	}
	if proxy == generate.Envoy {
		sb.WriteString(collectorsPrint(mesh))
	}
	servers := sb.String()
	// The print names the removed clusters the class still serves, after
	// those that may go now are let go: a generation that only drops
	// them is not skipped.
	p.linger.expire(class, p.gen, p.delivered, p.genAt)
	base := classPrint(m, proxy, view, servers)
	if !printChanged(&p.prints, class, withLingering(base, p.linger.key(class))) {
		// Nothing this class sees changed: its resources would be the same.
		p.m.classes.WithLabelValues("unchanged").Inc()
		return
	}
	p.m.classes.WithLabelValues("generated").Inc()
	var shape shaping
	if proxy == generate.Envoy {
		shape = p.shapingFor(mesh, envoyOnly(security), view.Namespace, view.ProxyVersions, false)
	}
	var clusters []*cluster.Cluster
	for _, s := range m.Services {
		clusters = append(clusters, cached(p, "cds", proxy.String(), m, s, func(m *generate.Mesh, s *generate.Service) []*cluster.Cluster {
			return generate.ServiceClusters(m, s, proxy)
		})...)
	}
	clusters = append(clusters, generate.AliasClusters(m, proxy)...)
	clusters = append(clusters, generate.InboundClusters(m, proxy)...)
	if proxy == generate.Envoy {
		clusters = append(clusters, generate.JWKSClusters(security)...)
	}
	clusters = append(clusters, generate.CatchAllClusters(m, proxy)...)
	p.publishClusters(class, shape.clusters(clusters))
	// The clusters it lost now linger: the print records them, so the
	// generation that lets them go regenerates the class.
	p.prints.set(class, withLingering(base, p.linger.key(class)))
	routes := p.routes.reuse(class, shape.routes(generate.RoutesFrom(m, proxy, p.virtualHost(proxy))))
	publish(p, class, resource.RouteType, routes)
	if p.VirtualHosts(class) {
		p.publishVirtualHosts(class, routes)
	}
	listeners := generate.ListenersFrom(m, proxy, security, p.apiListeners.get)
	if proxy == generate.Proxyless {
		listeners = append(listeners, generate.ServerListeners(mesh, view.Namespace, security)...)
	}
	publish(p, class, resource.ListenerType, shape.listeners(listeners))
	p.noteRefusals(class, shape)
}

// VirtualHosts says whether the Envoys of a class that speak Delta are sent
// their route configurations' virtual hosts apart (Config.VirtualHosts):
// the sidecars' and the gateways' classes, not the proxyless clients'.
func (p *Pusher) VirtualHosts(class cache.Class) bool {
	kind := classify.ParseClass(class).Kind
	return p.cfg.VirtualHosts && (kind == generate.Envoy.String() || kind == classify.Router)
}

// publishVirtualHosts hands the tables a class's route configurations as
// an Envoy that takes their virtual hosts apart is sent them (VHDS): each
// without its virtual hosts (cache.VHDSRoutesType), and each virtual host
// on its own, named <route configuration>/<its name>. A route change then
// changes one virtual host, not its port's whole configuration.
func (p *Pusher) publishVirtualHosts(class cache.Class, routes []*route.RouteConfiguration) {
	apart := make([]*route.RouteConfiguration, len(routes))
	var hosts []*route.VirtualHost
	for i, rc := range routes {
		if len(rc.VirtualHosts) == 0 {
			// Nothing to take apart: Envoy would wait for the virtual
			// hosts of a configuration the stream never sends one of.
			apart[i] = rc
			continue
		}
		apart[i] = p.vhds.routes(rc)
		for _, vh := range rc.VirtualHosts {
			hosts = append(hosts, p.vhds.host(rc.Name, vh))
		}
	}
	publish(p, class, cache.VHDSRoutesType, apart)
	publish(p, class, resource.VirtualHostType, hosts)
}

// virtualHost returns the virtual hosts for a kind of proxy from the LRU
// cache, keyed by the versions of their inputs: a VirtualService change
// regenerates only the virtual hosts of the hosts it names.
func (p *Pusher) virtualHost(proxy generate.Proxy) generate.VirtualHostFunc {
	return func(m *generate.Mesh, host string, port uint32) *route.VirtualHost {
		key := "vh|" + proxy.String() + "|" + host + ":" + strconv.FormatUint(uint64(port), 10) + "|" + generate.VirtualHostInputs(m, host, port)
		if v, ok := p.lru.get(key); ok {
			p.m.cache.WithLabelValues("vh", "hit").Inc()
			return v.(*route.VirtualHost)
		}
		p.m.cache.WithLabelValues("vh", "miss").Inc()
		vh := generate.VirtualHost(m, host, port)
		if proxy == generate.Envoy {
			vh = generate.SidecarVirtualHost(m, host, port)
		}
		p.lru.add(key, vh, int64(proto.Size(vh)))
		return vh
	}
}

// classPrint hashes what a class's clusters, routes and listeners are made
// of: the kind of proxy, its view, the mesh's settings, the services it
// sees (alias services too) with the versions of their configuration (not
// of their endpoints), every route rule (see withLingering for the removed
// clusters it still serves).
func classPrint(m *generate.Mesh, proxy generate.Proxy, view generate.View, servers string) uint64 {
	h := fnv.New64a()
	write := func(parts ...string) {
		for _, s := range parts {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
	}
	write(proxy.String(), view.Namespace, servers, strconv.FormatBool(view.RegistryOnly), m.ConfigVersion)
	write(view.Egress...)
	for _, il := range view.Ingress {
		write("i", strconv.FormatUint(uint64(il.Port), 10), il.Protocol.String(), il.DefaultEndpoint)
	}
	for _, port := range slices.Sorted(maps.Keys(view.EgressPorts)) {
		write(strconv.FormatUint(uint64(port), 10))
		write(view.EgressPorts[port]...)
	}
	for _, s := range m.Services {
		write("s", s.Namespace, s.Name, s.ConfigVersion)
	}
	// Alias services name other hosts: an Envoy's virtual hosts answer to
	// their names, a proxyless client dials them.
	for _, s := range m.Aliases() {
		write("a", s.Namespace, s.Name, s.ConfigVersion)
	}
	for _, r := range m.Routes {
		write("r", r.Namespace, r.Name, r.Version)
	}
	return h.Sum64()
}

// withLingering adds to a class's print the names of the removed clusters
// it still serves (linger.key).
func withLingering(print uint64, lingering string) uint64 {
	h := fnv.New64a()
	h.Write(binary.LittleEndian.AppendUint64(nil, print))
	h.Write([]byte(lingering))
	return h.Sum64()
}

// publishClusters hands over a class's clusters with those it lost less
// than ClusterLinger ago (make before break; linger.expire has let go
// those that may go). While some linger it asks for a generation, held
// (up to the maximum hold) until this one's pushes are written and
// answered, which lets them go; armLinger makes one at the latest.
func (p *Pusher) publishClusters(class cache.Class, clusters []*cluster.Cluster) {
	out, next := p.linger.apply(class, clusters, p.gen, p.genAt)
	publish(p, class, resource.ClusterType, out)
	if !next.IsZero() {
		p.debouncer.Add(fullChange(p.genAt), p.genAt)
	}
}

// armLinger has the owner ask for a generation at next, when the first
// lingering cluster of any class goes at the latest, unless it asks for
// then or sooner already. It runs after every full generation, from
// every class's lingering clusters: a class whose print did not change
// publishes nothing, and a timer armed by its own publication alone would
// leave its clusters lingering, with no generation to come (a removal
// that never reached its proxies).
func (p *Pusher) armLinger(now, next time.Time) {
	if next.IsZero() || p.lingerAt.After(now) && !p.lingerAt.After(next) {
		return
	}
	p.lingerAt = next
}

// tooLarge reports, and logs and counts, a set of resources a class's
// proxies could not receive whole: the clusters or listeners of proxyless
// clients above what grpc-go takes in one message. They are served all
// the same: grpc-go names the ones it needs, and each response holds
// those alone (the server refuses a response past the limit, see
// Pusher.ResponseLimit). It is logged when the class's set first passes the
// limit.
func tooLarge[R types.Resource](p *Pusher, class cache.Class, typeURL string, list []R) bool {
	if classify.ParseClass(class).Kind != generate.Proxyless.String() || (typeURL != resource.ClusterType && typeURL != resource.ListenerType) {
		return false
	}
	size := 0
	for _, r := range list {
		size += proto.Size(r)
	}
	key := string(class) + " " + typeURL
	if size <= p.cfg.MaxProxylessResponse {
		delete(p.oversize, key)
		return false
	}
	p.m.tooLarge.Inc()
	if !p.oversize[key] {
		p.oversize[key] = true
		p.cfg.Log.Warn("a proxyless class's resources are too large for one message; each client is sent those it names",
			"class", class, "type", typeURL, "resources", len(list), "bytes", size, "limit", p.cfg.MaxProxylessResponse,
			"hint", "limit what these clients see with a Sidecar (egress hosts)")
	}
	return true
}

// ResponseLimit is the largest response a proxy of a class takes: for a
// proxyless client, MaxProxylessResponse (the server's Hooks.OnResponseLimit).
func (p *Pusher) ResponseLimit(class cache.Class) int {
	if classify.ParseClass(class).Kind == generate.Proxyless.String() {
		return p.cfg.MaxProxylessResponse
	}
	return 0
}

// generateRouter generates the resources of a class of gateway proxies:
// every service's clusters, and the listeners and routes of its gateways.
func (p *Pusher) generateRouter(mesh *generate.Mesh, class cache.Class, selected []string) {
	if trusted, details, ok := classify.ParseClass(class).Topology(); ok {
		// The proxies' own gateway topology, as istiod reads it from them.
		mesh = mesh.WithTopology(trusted, details)
	}
	var gws []*generate.Gateway
	for _, g := range mesh.Gateways {
		if slices.Contains(selected, g.Key()) {
			gws = append(gws, g)
		}
	}
	// A gateway proxy of a namespace sees what that namespace sees: the
	// services exported to it.
	services := mesh.Services
	if ns := classify.ParseClass(class).Namespace; ns != "" {
		services = mesh.For(generate.View{Namespace: ns}).Services
	}
	var clusters []*cluster.Cluster
	auto := generate.AutoPassthrough(gws)
	for _, s := range services {
		cs := cached(p, "cds", generate.Envoy.String(), mesh, s, func(m *generate.Mesh, s *generate.Service) []*cluster.Cluster {
			return generate.ServiceClusters(m, s, generate.Envoy)
		})
		clusters = append(clusters, cs...)
		if auto {
			// Cached like the clusters they copy, so that a generation
			// hands the same objects over and nothing is encoded again.
			clusters = append(clusters, cached(p, "sni", generate.Envoy.String(), mesh, s, func(*generate.Mesh, *generate.Service) []*cluster.Cluster {
				return generate.SNIClusters(cs)
			})...)
		}
	}
	clusters = append(clusters, generate.GatewayCatchAllClusters(mesh)...)
	shape := p.routerShaping(mesh, class)
	p.linger.expire(class, p.gen, p.delivered, p.genAt)
	p.publishClusters(class, shape.clusters(clusters))
	listen := generate.ListenPorts(mesh, gws)
	if classify.ParseClass(class).Unprivileged() {
		listen = generate.Unprivileged(listen)
	}
	routes := shape.routes(generate.GatewayRoutes(mesh, gws, listen))
	publish(p, class, resource.RouteType, routes)
	if p.VirtualHosts(class) {
		p.publishVirtualHosts(class, routes)
	}
	publish(p, class, resource.ListenerType, shape.listeners(generate.GatewayListeners(mesh, gws, listen)))
	p.noteRefusals(class, shape)
}

// routerShaping is what the Telemetries and EnvoyFilters of a gateway
// proxy's class make of its resources.
func (p *Pusher) routerShaping(mesh *generate.Mesh, class cache.Class) shaping {
	c := classify.ParseClass(class)
	if c.Namespace == "" {
		return shaping{router: true}
	}
	_, view := p.index.Load().View(class)
	return p.shapingFor(mesh, envoyOnly(mesh.PoliciesFor(c.Namespace, view.Policies)), c.Namespace, view.ProxyVersions, true)
}

// cached returns a service's resources of one kind and variant (a proxy
// kind, a locality) from the LRU cache, or generates and caches them.
func cached[R any](p *Pusher, kind, variant string, m *generate.Mesh, s *generate.Service, gen func(*generate.Mesh, *generate.Service) []R) []R {
	// Load assignments follow endpoints; clusters only the service and its policy.
	version := s.ConfigVersion
	if kind == "eds" || kind == "eds@" {
		version = s.Version
	}
	key := kind + "|" + variant + "|" + s.Namespace + "/" + s.Name + "|" + version + "|" + m.ConfigVersion + "|" + strings.Join(m.Owned(s), ",")
	if v, ok := p.lru.get(key); ok {
		p.m.cache.WithLabelValues(kind, "hit").Inc()
		return v.([]R)
	}
	p.m.cache.WithLabelValues(kind, "miss").Inc()
	out := gen(m, s)
	p.lru.add(key, out, sizeOf(out))
	return out
}

// publish hands resources to the tables, which validates each new one: a
// proxy must never be sent what it would reject.
func publish[R types.Resource](p *Pusher, class cache.Class, typeURL string, list []R) {
	out := make(map[string]types.Resource, len(list))
	for _, r := range list {
		out[gcpcache.GetResourceName(r)] = r
	}
	tooLarge(p, class, typeURL, list)
	changed, removed, size, err := p.cfg.Tables.Update(class, typeURL, out)
	if err != nil {
		p.cfg.Log.Error("cache update failed", "class", class, "type", typeURL, "err", err)
		return
	}
	p.sizes.observe(typeURL[strings.LastIndex(typeURL, ".")+1:], len(out), size)
	if changed+removed > 0 {
		p.cfg.Log.Debug("resources updated", "class", class, "type", typeURL, "changed", changed, "removed", removed)
	}
}
