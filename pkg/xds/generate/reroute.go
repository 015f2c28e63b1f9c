package generate

import (
	"slices"
	"strconv"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// Rerouted is a change of route rules alone, from the mesh From: the
// versions of the rules that changed before it (none for a rule added)
// and after it (none for a rule removed).
type Rerouted struct {
	From          *Mesh
	Before, After []*Route
}

// hosts are the hosts the changed rules name, before and after.
func (c *Rerouted) hosts() []string {
	var out []string
	for _, r := range slices.Concat(c.Before, c.After) {
		out = append(out, r.Rule.Hosts...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Local reports whether the change, which made the mesh to, changes
// nothing at sidecars and proxyless clients but the virtual hosts of the
// hosts its rules name, for every view: neither its rules nor those that
// route their hosts before or after it route TCP or TLS (listeners),
// delegate, or match on their source (which proxies share a view); its
// rules bind no gateway (routers) and name hosts; and no host they name
// is an alias service's name or has one (other hosts' virtual hosts).
// Within a view, see ReroutedHosts.
func (c *Rerouted) Local(to *Mesh) bool {
	for _, r := range slices.Concat(c.Before, c.After) {
		if len(r.Rule.Hosts) == 0 || slices.ContainsFunc(r.Rule.Gateways, func(g string) bool { return g != "mesh" }) || !plainHTTP(r.Rule) {
			return false
		}
	}
	for _, h := range c.hosts() {
		for _, m := range []*Mesh{c.From, to} {
			if _, ok := m.aliasOf[h]; ok || len(m.aliasBy[h]) > 0 {
				return false
			}
			if r := m.routeByHost[h]; r != nil && !plainHTTP(r.Rule) {
				return false
			}
		}
	}
	return true
}

// plainHTTP reports whether a rule routes HTTP alone, by itself, whatever
// proxy sends the request.
func plainHTTP(r *meshv1.RouteRule) bool {
	if len(r.Tcp) > 0 || len(r.Tls) > 0 {
		return false
	}
	for _, h := range r.Http {
		if h.Delegate != nil {
			return false
		}
		for _, hm := range h.Match {
			if hm.SourceNamespace != "" || len(hm.SourceLabels) > 0 {
				return false
			}
		}
	}
	return true
}

// HostRoute is a virtual host of a route configuration: the host's on
// port, named ListenerName(Host, Port) in the configuration Routes.
type HostRoute struct {
	Routes string
	Host   string
	Port   uint32
	// Portless says that the virtual host is a rule's own on port 80 (see
	// PortlessVirtualHost), not a service's.
	Portless bool
}

// ReroutedHosts returns the virtual hosts of a view's route
// configurations (RoutesFrom's) that a local change of route rules
// changes (see Rerouted.Local): those of the hosts its rules name, on
// each HTTP port of the service that owns them in the view, and, in an
// Envoy's view, those its rules give port 80 by themselves (see
// portlessHosts). m is the view after the change, from the mesh Local was
// asked of. It reports false when the change reaches further in an
// Envoy's view: a rule routed on port 80 by its own hosts is added or
// removed, names other hosts, or shares a host with a service or another
// rule of the view (which of its virtual hosts there are depends on all
// of them).
func (m *Mesh) ReroutedHosts(proxy Proxy, c *Rerouted) ([]HostRoute, bool) {
	hosts := c.hosts()
	var out []HostRoute
	if proxy != Proxyless {
		portless, ok := m.reroutedPortless(c, hosts)
		if !ok {
			return nil, false
		}
		out = portless
	}
	for _, h := range hosts {
		s := m.byHost[h]
		if s == nil || !s.routable() {
			continue // no virtual host of a service in this view
		}
		for _, p := range s.Spec.Ports {
			if !isHTTP(p) {
				continue
			}
			name := strconv.FormatUint(uint64(p.Number), 10)
			if proxy == Proxyless {
				name = ListenerName(h, p.Number)
			}
			out = append(out, HostRoute{Routes: name, Host: h, Port: p.Number})
		}
	}
	return out, true
}

// reroutedPortless returns the port-80 virtual hosts of the rules routed
// there by their own hosts in an Envoy's view m (portlessHosts) that a
// local change changes: those of a rule changed in place, naming the same
// hosts before and after, none of them a service of the view, each routed
// by it before and after. Any other such rule among those the change
// touches, and it reports false.
func (m *Mesh) reroutedPortless(c *Rerouted, hosts []string) ([]HostRoute, bool) {
	rules := slices.Concat(c.Before, c.After)
	for _, h := range hosts {
		for _, from := range []*Mesh{c.From, m} {
			if r := from.routeByHost[h]; r != nil {
				rules = append(rules, r)
			}
		}
	}
	var out []HostRoute
	done := map[*Route]bool{}
	for _, r := range rules {
		if done[r] || !m.portless(r.Rule) {
			continue
		}
		before, after := versionOf(c.Before, r), versionOf(c.After, r)
		if before == nil || after == nil || !slices.Equal(before.Rule.Hosts, after.Rule.Hosts) || !m.portless(before.Rule) || !m.portless(after.Rule) {
			return nil, false
		}
		done[before], done[after] = true, true
		for _, h := range after.Rule.Hosts {
			if m.Service(h) != nil || c.From.routeByHost[h] != before || m.routeByHost[h] != after {
				return nil, false
			}
			out = append(out, HostRoute{Routes: "80", Host: h, Port: 80, Portless: true})
		}
	}
	return out, true
}

// versionOf returns the version among rs of the rule r is a version of
// (by namespace and name), nil when there is none.
func versionOf(rs []*Route, r *Route) *Route {
	for _, v := range rs {
		if v.Namespace == r.Namespace && v.Name == r.Name {
			return v
		}
	}
	return nil
}

// PortlessVirtualHost is the virtual host on port 80 that a rule routed
// there by its own hosts gives one of them (see portlessHosts); nil when
// it gives none (no route of the rule applies there, or another rule
// routes the host).
func PortlessVirtualHost(m *Mesh, host string) *route.VirtualHost {
	rr := m.routeByHost[host]
	if rr == nil || !m.portless(rr.Rule) {
		return nil
	}
	routes := httpRoutes(m, rr, nil, 80, true)
	if len(routes) == 0 {
		return nil
	}
	return portlessHost(host, routes)
}
