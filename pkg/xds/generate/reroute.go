package generate

import (
	"slices"
	"strconv"

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
}

// ReroutedHosts returns the virtual hosts of a view's route
// configurations (RoutesFrom's) that a local change of route rules
// changes (see Rerouted.Local): those of the hosts its rules name, on
// each HTTP port of the service that owns them in the view. m is the view
// after the change, from the mesh Local was asked of. It reports false
// when the change reaches further in an Envoy's view: a rule that routes
// one of those hosts, before or after, is routed on port 80 by its own
// hosts (portlessHosts, which proxyless clients are not given), which
// depends on which of them the view sees.
func (m *Mesh) ReroutedHosts(proxy Proxy, c *Rerouted) ([]HostRoute, bool) {
	hosts := c.hosts()
	if proxy != Proxyless {
		rules := slices.Concat(c.Before, c.After)
		for _, h := range hosts {
			for _, from := range []*Mesh{c.From, m} {
				if r := from.routeByHost[h]; r != nil {
					rules = append(rules, r)
				}
			}
		}
		for _, r := range rules {
			if m.portless(r.Rule) {
				return nil, false
			}
		}
	}
	var out []HostRoute
	for _, h := range hosts {
		s := m.byHost[h]
		if s == nil || !s.routable() {
			continue // no virtual host in this view
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
