package generate

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
)

// Proxy is the kind of client a resource is generated for.
type Proxy int

// The kinds of proxy.
const (
	// Envoy is an Envoy sidecar.
	Envoy Proxy = iota
	// Proxyless is a gRPC client with a built-in xDS client (grpc-go).
	Proxyless
)

func (p Proxy) String() string {
	if p == Proxyless {
		return "proxyless"
	}
	return "envoy"
}

// Service is one service as the generators see it.
type Service struct {
	Namespace, Name string
	Spec            *meshv1.Service
	// Endpoints are the endpoints of every shard, merged; one address appears once.
	Endpoints []*meshv1.Endpoint
	// Policy is the DestinationRule for the service's host, if any, and
	// PolicyName its namespace/name (shardctl's provenance).
	Policy     *meshv1.TrafficPolicy
	PolicyName string
	// Version changes whenever anything above changes (the store revisions
	// of its inputs); generated resources are cached under it.
	Version string
	// ConfigVersion changes whenever the service or its policy changes,
	// or the service accounts of its endpoints, but not with its other
	// endpoint changes: clusters and routes are cached under it.
	ConfigVersion string
	// ServiceAccounts are its endpoints' service accounts (see
	// ServiceAccounts): the identities its clients expect.
	ServiceAccounts []string
	// PlaintextPeers says its workloads take plaintext alone (their
	// namespace's or the mesh's PeerAuthentication is DISABLE): clients
	// get no automatic mutual TLS to them.
	PlaintextPeers bool
	// PeerPolicies are the PeerAuthentications with a selector that
	// select some of its workloads, first first: the first that selects
	// a workload and sets a mode (on its port, or for all) decides whether
	// its clients' automatic mutual TLS reaches it; for the others,
	// PlaintextDefault (the namespace's or the mesh's is DISABLE) does.
	PeerPolicies     []*meshv1.PeerAuthentication
	PlaintextDefault bool
}

// routable reports whether the service gets clusters and routes: a
// service without resolution (NONE) is passed through to the address the
// client dialled, and its endpoints, if any, are not balanced over.
// ResolvesNames reports whether a service's endpoints are names its
// clusters resolve (DNS, DNS_ROUND_ROBIN): its clusters, not load
// assignments, hold its endpoints.
func ResolvesNames(spec *meshv1.Service) bool {
	r := spec.GetResolution()
	return r == meshv1.Resolution_RESOLUTION_DNS || r == meshv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN
}

func (s *Service) routable() bool {
	return s.Spec.Resolution != meshv1.Resolution_RESOLUTION_NONE
}

// Owned returns the hostnames a service owns in the mesh (where two
// services claim one host, the first owns it).
func (m *Mesh) Owned(s *Service) []string {
	owned := func(h string) bool { return m.Service(h) == s }
	if !slices.ContainsFunc(s.Spec.Hostnames, func(h string) bool { return !owned(h) }) {
		return s.Spec.Hostnames // all of them, as nearly always: shared, not copied
	}
	var out []string
	for _, h := range s.Spec.Hostnames {
		if owned(h) {
			out = append(out, h)
		}
	}
	return out
}

// Route is one VirtualService as the generators see it.
type Route struct {
	Namespace, Name string
	Rule            *meshv1.RouteRule
	// Version changes whenever the rule changes (its store revision).
	Version string
}

// Settings are the mesh-wide settings every view of a mesh shares.
type Settings struct {
	// NoAutoMTLS turns off automatic mutual TLS (MeshConfig
	// enableAutoMtls: false): clusters use TLS only as policies ask.
	NoAutoMTLS bool
	// NoCertificates says Envoys get no workload certificates (the
	// pushers serve none and they have no agent): their inbound ports
	// take plaintext alone where no PeerAuthentication says otherwise,
	// where istiod's default, PERMISSIVE, would have them wait for a
	// certificate that never comes.
	NoCertificates bool
	// TrustDomain is the mesh's SPIFFE trust domain ("": cluster.local).
	TrustDomain string
	// AgentCertificates says Envoys get their workload certificate and
	// the mesh's root from Istio's agent beside them (its sds-grpc
	// cluster), as istiod configures them, instead of from the pushers
	// over ADS.
	AgentCertificates bool
	// Config holds the rest of the mesh's settings (Istio's MeshConfig,
	// what the generators act on); nil, or a field unset, is istiod's
	// default.
	Config *meshv1.MeshConfig
	// ConfigVersion changes whenever Config does: every generated
	// resource may depend on it.
	ConfigVersion string
}

// Mesh is everything a generation reads, indexed for lookups. Build it with
// NewMesh; it is read-only afterwards.
type Mesh struct {
	Services []*Service
	Routes   []*Route
	// Gateways are the mesh's gateways, for router proxies.
	Gateways []*Gateway
	// Policies are the mesh's security policies, by namespace and name.
	Policies []*Policy
	// RegistryOnly refuses an Envoy's traffic to destinations no service
	// names (a view's, see View.RegistryOnly).
	RegistryOnly bool
	Settings
	// Namespace is the namespace of the view's proxies ("" for a view of
	// the whole mesh): its services are also reached by their short names.
	Namespace string
	// sources holds the tags of the source selectors (see SelectorTag)
	// that select the view's proxies.
	sources map[string]bool
	// ingress are the view's Sidecar ingress listeners (see View.Ingress).
	ingress []*meshv1.IngressListener
	byHost  map[string]*Service
	// routeByHost maps a host to the first route rule (by namespace/name)
	// that names it and applies to the mesh.
	routeByHost map[string]*Route
	// aliases are the names of the mesh's ExternalName Services (see
	// meshv1.Service.AliasOf): the host each is a name of, and for a host,
	// the services that name it.
	aliases
}

// aliases index the mesh's alias services.
type aliases struct {
	aliasOf map[string]string
	aliasBy map[string][]*Service
	// list holds the alias services a view sees, in service order.
	list []*Service
}

// NewMesh indexes services and routes. Services and routes are ordered by
// namespace and name, and where two claim one host, the first wins.
func NewMesh(services []*Service, routes []*Route) *Mesh {
	m := &Mesh{
		Services: slices.Clone(services),
		Routes:   slices.Clone(routes),
		byHost:   map[string]*Service{},
	}
	slices.SortFunc(m.Services, func(a, b *Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	// An alias service is a name of another host, not a service of its
	// own: it leaves the services, and its names resolve to the host.
	m.Services = slices.DeleteFunc(m.Services, func(s *Service) bool {
		target := s.Spec.GetAliasOf()
		if target == "" {
			return false
		}
		if m.aliasOf == nil {
			m.aliasOf, m.aliasBy = map[string]string{}, map[string][]*Service{}
		}
		for _, h := range s.Spec.Hostnames {
			if _, taken := m.aliasOf[h]; !taken {
				m.aliasOf[h] = target
			}
		}
		m.aliasBy[target] = append(m.aliasBy[target], s)
		m.list = append(m.list, s)
		return true
	})
	for _, s := range m.Services {
		for _, h := range s.Spec.Hostnames {
			if _, taken := m.byHost[h]; !taken {
				m.byHost[h] = s
			}
		}
	}
	m.indexRoutes()
	return m
}

// indexRoutes orders the mesh's route rules by namespace and name, and
// maps each host to the first that names it and applies to the mesh.
func (m *Mesh) indexRoutes() {
	slices.SortFunc(m.Routes, func(a, b *Route) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	m.routeByHost = map[string]*Route{}
	for _, r := range m.Routes {
		if !appliesToMesh(r.Rule) {
			continue
		}
		for _, h := range r.Rule.Hosts {
			if _, taken := m.routeByHost[h]; !taken {
				m.routeByHost[h] = r
			}
		}
	}
}

// WithRoutes returns a copy of the mesh with these route rules in place of
// its own. Everything else is shared.
func (m *Mesh) WithRoutes(routes []*Route) *Mesh {
	out := *m
	out.Routes = slices.Clone(routes)
	out.indexRoutes()
	return &out
}

// WithServices returns a copy of the mesh in which the services of the
// same namespace and name as the given ones are replaced by them; their
// host names must be the same. Everything else is shared.
func (m *Mesh) WithServices(changed []*Service) *Mesh {
	type id struct{ namespace, name string }
	by := make(map[id]*Service, len(changed))
	for _, s := range changed {
		by[id{s.Namespace, s.Name}] = s
	}
	out := &Mesh{Services: slices.Clone(m.Services), Routes: m.Routes, Gateways: m.Gateways, Policies: m.Policies, RegistryOnly: m.RegistryOnly,
		Settings: m.Settings, Namespace: m.Namespace, sources: m.sources, ingress: m.ingress, byHost: maps.Clone(m.byHost), routeByHost: m.routeByHost,
		aliases: m.aliases}
	for i, s := range out.Services {
		if n, ok := by[id{s.Namespace, s.Name}]; ok {
			out.Services[i] = n
		}
	}
	for h, s := range out.byHost {
		if n, ok := by[id{s.Namespace, s.Name}]; ok {
			out.byHost[h] = n
		}
	}
	return out
}

// WithTopology returns a copy of the mesh whose gateways trust that many
// proxies in front of them and handle a client's certificate details so:
// a gateway proxy's own topology (its agent's PROXY_CONFIG), which takes
// the mesh's place. Everything else is shared.
func (m *Mesh) WithTopology(trusted uint32, details meshv1.ClientCertDetails) *Mesh {
	out := *m
	cfg := &meshv1.MeshConfig{}
	if m.Config != nil {
		cfg = proto.CloneOf(m.Config)
	}
	cfg.GatewayTrustedProxies, cfg.GatewayClientCert = trusted, details
	out.Config = cfg
	return &out
}

// appliesToMesh reports whether a route rule applies to sidecars and
// proxyless clients: it names no gateways, or names the reserved "mesh".
func appliesToMesh(r *meshv1.RouteRule) bool {
	return len(r.Gateways) == 0 || slices.Contains(r.Gateways, "mesh")
}

// Service returns the service that owns a host.
func (m *Mesh) Service(host string) *Service { return m.byHost[m.Resolve(host)] }

// Resolve returns the host a name stands for: the host an alias service
// names, else the name itself.
func (m *Mesh) Resolve(host string) string {
	if target, ok := m.aliasOf[host]; ok {
		return target
	}
	return host
}

// Aliases returns the alias services the mesh's view sees, in service
// order.
func (m *Mesh) Aliases() []*Service { return m.list }

// aliasTarget returns the host a name of an alias service stands for when
// that host is a service of the mesh routing HTTP on port, else "": a
// proxyless client dialling the name is routed as the host's.
func (m *Mesh) aliasTarget(name string, port uint32) string {
	target, ok := m.aliasOf[name]
	if !ok {
		return ""
	}
	s := m.byHost[target]
	if s == nil || !s.routable() {
		return ""
	}
	if p := s.port(port); p == nil || !isHTTP(p) {
		return ""
	}
	return target
}

// RouteFor returns the route rule that routes a host for sidecars and
// proxyless clients, nil for none.
func (m *Mesh) RouteFor(host string) *Route { return m.routeByHost[host] }

// ClusterName returns Istio's name for an outbound cluster.
func ClusterName(port uint32, subset, host string) string {
	return "outbound|" + strconv.FormatUint(uint64(port), 10) + "|" + subset + "|" + host
}

// ParseClusterName reads an outbound cluster's name (see ClusterName); ok
// is false for any other name.
func ParseClusterName(name string) (host string, port uint32, subset string, ok bool) {
	parts := strings.SplitN(name, "|", 4)
	if len(parts) != 4 || parts[0] != "outbound" {
		return "", 0, "", false
	}
	n, err := strconv.ParseUint(parts[1], 10, 32)
	if err != nil {
		return "", 0, "", false
	}
	return parts[3], uint32(n), parts[2], true
}

// ListenerName returns the name of the API listener a proxyless client asks
// for when it dials xds:///<host>:<port>.
func ListenerName(host string, port uint32) string {
	return host + ":" + strconv.FormatUint(uint64(port), 10)
}

// isHTTP reports whether a port carries HTTP (including HTTP/2 and gRPC).
func isHTTP(p *meshv1.Port) bool {
	switch p.Protocol {
	case meshv1.Protocol_PROTOCOL_HTTP, meshv1.Protocol_PROTOCOL_HTTP2, meshv1.Protocol_PROTOCOL_GRPC:
		return true
	}
	return false
}

// port returns the service port with the number, or nil.
func (s *Service) port(n uint32) *meshv1.Port {
	for _, p := range s.Spec.Ports {
		if p.Number == n {
			return p
		}
	}
	return nil
}

// subset returns the named subset of the service's policy, or nil.
func (s *Service) subset(name string) *meshv1.Subset {
	for _, sub := range s.Policy.GetSubsets() {
		if sub.Name == name {
			return sub
		}
	}
	return nil
}

// View is what one class of proxies may see: the namespace they run in
// and, from the Sidecar that applies to them, the hosts they may reach.
type View struct {
	Namespace string
	// Egress lists "<namespace>/<host>" patterns as in Istio's Sidecar
	// ("./*", "*/api.example.com", "shop/*"); nil sees everything exported
	// to the namespace.
	Egress []string
	// Policies are the tags of the security policies with a selector that
	// select the class's workloads (those without apply to the namespace).
	Policies []string
	// Outbound is the class's Sidecar's outbound traffic policy (unset:
	// the mesh's default); RegistryOnly is the policy in effect, refusing
	// traffic to destinations no service names (Istio's REGISTRY_ONLY)
	// rather than passing it through (ALLOW_ANY).
	Outbound     meshv1.OutboundPolicy
	RegistryOnly bool
	// Sources are the tags of the source selectors (VirtualService
	// sourceLabels, see SelectorTag) that select the view's proxies.
	Sources []string
	// EgressPorts are the egress hosts of the Sidecar's listeners for one
	// port: on that port, the proxy sees those instead of Egress.
	EgressPorts map[uint32][]string
	// Ingress are the Sidecar's ingress listeners: the proxy's inbound
	// ports, instead of the target ports of the services it sees.
	Ingress []*meshv1.IngressListener
	// ProxyVersions says which of the EnvoyFilters' proxy version
	// patterns the class's Envoys match.
	ProxyVersions map[string]bool
}

// For returns the part of the mesh a view sees: the services exported to
// its namespace that its egress hosts name. A view without a namespace
// sees the whole mesh.
func (m *Mesh) For(v View) *Mesh {
	if v.Namespace == "" {
		if v.RegistryOnly == m.RegistryOnly {
			return m
		}
		out := *m
		out.RegistryOnly = v.RegistryOnly
		return &out
	}
	var svcs []*Service
	for _, s := range m.Services {
		if v.sees(s) {
			svcs = append(svcs, v.portsSeen(s))
		}
	}
	out := NewMesh(svcs, m.Routes)
	out.Policies, out.RegistryOnly, out.Namespace, out.ingress = m.Policies, v.RegistryOnly, v.Namespace, v.Ingress
	out.aliasOf, out.aliasBy = m.aliasOf, m.aliasBy
	for _, a := range m.list {
		if v.sees(a) {
			out.list = append(out.list, a)
		}
	}
	out.Settings = m.Settings
	if len(v.Sources) > 0 {
		out.sources = map[string]bool{}
		for _, tag := range v.Sources {
			out.sources[tag] = true
		}
	}
	return out
}

// SelectorTag names a source selector (a match's sourceLabels) in class
// names: "l:" and a hash of its labels.
func SelectorTag(labels map[string]string) string {
	h := fnv.New32a()
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		h.Write([]byte(k))
		h.Write([]byte{0})
		h.Write([]byte(labels[k]))
		h.Write([]byte{0})
	}
	return fmt.Sprintf("l:%08x", h.Sum32())
}

// SourceSelectors returns the distinct source selectors (sourceLabels) of
// the matches that apply at sidecars, by tag: those of the rules with
// hosts, a delegating route's merged with its delegate's as they are
// routed.
func (m *Mesh) SourceSelectors() map[string]map[string]string {
	out := map[string]map[string]string{}
	m.eachSource(func(labels map[string]string, _ string) {
		if len(labels) > 0 {
			out[SelectorTag(labels)] = labels
		}
	})
	return out
}

// SourceNamespaces returns the namespaces the matches that apply at
// sidecars name as their source (sourceNamespace).
func (m *Mesh) SourceNamespaces() map[string]bool {
	out := map[string]bool{}
	m.eachSource(func(_ map[string]string, ns string) {
		if ns != "" {
			out[ns] = true
		}
	})
	return out
}

// eachSource calls fn with the source conditions of every match of the
// rules with hosts that apply at sidecars, delegated routes merged.
func (m *Mesh) eachSource(fn func(labels map[string]string, namespace string)) {
	for _, r := range m.Routes {
		if len(r.Rule.Hosts) == 0 || !appliesToMesh(r.Rule) {
			continue // a delegate's matches count merged into its root's
		}
		for _, h := range m.expand(r.Rule) {
			for _, hm := range h.Match {
				fn(hm.SourceLabels, hm.SourceNamespace)
			}
		}
		for _, l4 := range append(slices.Clone(r.Rule.Tcp), r.Rule.Tls...) {
			for _, lm := range l4.Match {
				fn(lm.SourceLabels, lm.SourceNamespace)
			}
		}
	}
}

// fromSource reports whether a match's source conditions (labels,
// namespace) hold for the view's proxies at a gateway (nil: at a sidecar).
// A gateway's labels and namespace are not known: a match naming them
// never applies there.
func (m *Mesh) fromSource(gw *Gateway, labels map[string]string, namespace string) bool {
	if len(labels) == 0 && namespace == "" {
		return true
	}
	if gw != nil {
		return false
	}
	return (len(labels) == 0 || m.sources[SelectorTag(labels)]) && (namespace == "" || namespace == m.Namespace)
}

func (v View) sees(s *Service) bool {
	if !exported(s.Spec.ExportTo, s.Namespace, v.Namespace) {
		return false
	}
	if v.Egress == nil && len(v.EgressPorts) == 0 {
		return true
	}
	return slices.ContainsFunc(s.Spec.Ports, func(p *meshv1.Port) bool { return v.seesOn(s, p.Number) })
}

// seesOn reports whether the view's egress hosts for a port (its egress
// listener for the port, else the one without a port) name the service.
func (v View) seesOn(s *Service, port uint32) bool {
	patterns, ok := v.EgressPorts[port]
	if !ok {
		if v.Egress == nil && len(v.EgressPorts) == 0 {
			return true
		}
		patterns = v.Egress
	}
	return namedBy(patterns, s, v.Namespace)
}

// portsSeen returns the service as the view sees it: itself, or, when
// its egress listeners for some ports do not name it, a copy with the
// ports they do (its versions marked, so that what is generated from the
// copy is cached apart).
func (v View) portsSeen(s *Service) *Service {
	if len(v.EgressPorts) == 0 {
		return s
	}
	var ports []*meshv1.Port
	var mark strings.Builder
	for _, p := range s.Spec.Ports {
		if v.seesOn(s, p.Number) {
			ports = append(ports, p)
			fmt.Fprintf(&mark, ",%d", p.Number)
		}
	}
	if len(ports) == len(s.Spec.Ports) {
		return s
	}
	cp := *s
	cp.Spec = proto.CloneOf(s.Spec)
	cp.Spec.Ports = ports
	cp.Version += "|ports" + mark.String()
	cp.ConfigVersion += "|ports" + mark.String()
	return &cp
}

// namedBy reports whether egress host patterns ("<namespace>/<host>") of a
// proxy in namespace proxyNS name the service.
func namedBy(patterns []string, s *Service, proxyNS string) bool {
	for _, pattern := range patterns {
		ns, host, ok := strings.Cut(pattern, "/")
		if !ok {
			continue
		}
		switch ns {
		case "*":
		case ".":
			if s.Namespace != proxyNS {
				continue
			}
		case "~":
			continue
		default:
			if s.Namespace != ns {
				continue
			}
		}
		for _, h := range s.Spec.Hostnames {
			if hostMatches(host, h) {
				return true
			}
		}
	}
	return false
}

// exported reports whether a service of namespace own, exported to the
// given namespaces, is visible from namespace from.
func exported(to []string, own, from string) bool {
	if len(to) == 0 {
		return true
	}
	for _, ns := range to {
		if ns == "*" || ns == from || (ns == "." && own == from) {
			return true
		}
	}
	return false
}

// hostMatches matches a host against "*", "*.suffix" or an exact name.
func hostMatches(pattern, host string) bool {
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		return strings.HasSuffix(host, pattern[1:])
	}
	return pattern == host
}
