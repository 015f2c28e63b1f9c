// Package classify groups proxies into classes, so that the resources of a
// class are generated once and shared by its proxies: a class is the kind
// of proxy and what it may see. It is named "<kind>" when what a proxy
// sees does not depend on where it runs, "<kind>/<namespace>/<sidecar>"
// when its namespace (exportTo), a Sidecar or the namespace's security
// policies shape its config ("<kind>/<namespace>/" without a Sidecar),
// followed by "/<tag>,<tag>..." when security policies with a selector
// select it (see generate.Policy.Tag), and
// "router/<gateway>,<gateway>..." for a gateway proxy, by the Gateways
// that select it.
package classify

import (
	"cmp"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/meshbuild"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/nodemeta"
)

// Router is the kind of gateway proxies ("router~..." node ids).
const Router = "router"

// Elsewhere stands for every namespace that has nothing of its own in the
// mesh (no service, no Sidecar, not named by any exportTo): they all see
// the same, so their proxies share one class, however many namespaces
// clients claim. It is no namespace's name.
const Elsewhere = "~"

// Index is what classifying a proxy reads: the Sidecars, whether any
// service limits who sees it, and the Gateways. It is built from a mesh
// build and never modified.
type Index struct {
	// scopes by namespace, those with a workload selector first.
	scopes map[string][]meshbuild.Scope
	// restricted says some service limits who may see it (exportTo).
	restricted bool
	// own are the namespaces with something of their own: a service, a
	// Sidecar, or a mention in an exportTo.
	own      map[string]bool
	gateways []*generate.Gateway
	// sharedGateways, when set, are the namespaces whose routers other
	// namespaces' Gateways may select (see SharedGatewayNamespaces).
	sharedGateways map[string]bool
	// policies are the security policies by namespace: a namespace with
	// any has classes of its own, and a workload's class lists the
	// policies that select it.
	policies map[string][]*generate.Policy
	// root are the root namespace's policies, which apply everywhere.
	root []*generate.Policy
	// rootScope is the root namespace's Sidecar without a selector, the
	// default of the namespaces without a Sidecar of their own.
	rootScope *meshbuild.Scope
	// sources are the source selectors of route matches (sourceLabels) by
	// tag, and sourceNamespaces the namespaces matches name: the routes of
	// a proxy they select differ from its namespace's others.
	sources          map[string]map[string]string
	sourceNamespaces map[string]bool
	// served are the namespaces with a service: an Envoy sidecar there
	// reaches those services by their short names, which no other
	// namespace's sidecars may (see generate.Domains).
	served map[string]bool
	// shaped are the namespaces with a Telemetry or EnvoyFilter without
	// selector ("" for the root namespace's, which shape every namespace):
	// their gateway proxies have classes of their own.
	shaped map[string]bool
	// versions are the proxy version patterns of the EnvoyFilters' patches
	// (sorted): an Envoy's class says which its version matches.
	versions   []string
	versionRes []*regexp.Regexp
}

// Option tunes an Index.
type Option func(*Index)

// SharedGatewayNamespaces binds gateway proxies to Gateways by namespace:
// a router of namespace N is selected only by the Gateways of N, unless N
// is one of these namespaces, whose routers any namespace's Gateways may
// select (a shared ingress, as Istio installs it). "*" among them, or no
// such option, lets any Gateway select any router, as istiod does by
// default. A router whose node names no namespace is not bound.
func SharedGatewayNamespaces(namespaces []string) Option {
	return func(ix *Index) {
		if slices.Contains(namespaces, "*") {
			return
		}
		ix.sharedGateways = map[string]bool{}
		for _, ns := range namespaces {
			ix.sharedGateways[ns] = true
		}
	}
}

// NewIndex indexes what decides the classes of a mesh build.
func NewIndex(b *meshbuild.Built, opts ...Option) *Index {
	ix := &Index{scopes: map[string][]meshbuild.Scope{}, restricted: b.Restricted, own: map[string]bool{}, gateways: b.Mesh.Gateways,
		policies: map[string][]*generate.Policy{}, served: map[string]bool{}}
	for _, o := range opts {
		o(ix)
	}
	ix.shaped = map[string]bool{}
	for _, p := range b.Mesh.Policies {
		ix.policies[p.Namespace] = append(ix.policies[p.Namespace], p)
		ix.own[p.Namespace] = true
		if p.Root {
			ix.root = append(ix.root, p)
		}
		if p.EnvoyOnly() && len(p.Spec.GetSelector()) == 0 {
			ix.shaped[p.Namespace] = true
			if p.Root {
				ix.shaped[""] = true
			}
		}
		if ef, ok := p.Spec.(*meshv1.EnvoyFilter); ok {
			for _, patch := range ef.Patches {
				if patch.ProxyVersion != "" && !slices.Contains(ix.versions, patch.ProxyVersion) {
					ix.versions = append(ix.versions, patch.ProxyVersion)
				}
			}
		}
	}
	slices.Sort(ix.versions)
	for _, v := range ix.versions {
		re, err := regexp.Compile(v)
		if err != nil {
			re = nil // validated at ingest; never matches
		}
		ix.versionRes = append(ix.versionRes, re)
	}
	for _, s := range b.Scopes {
		ix.scopes[s.Namespace] = append(ix.scopes[s.Namespace], s)
		ix.own[s.Namespace] = true
	}
	ix.sources, ix.sourceNamespaces = b.Mesh.SourceSelectors(), b.Mesh.SourceNamespaces()
	for ns := range ix.sourceNamespaces {
		ix.own[ns] = true
	}
	for _, s := range b.Mesh.Services {
		ix.own[s.Namespace] = true
		ix.served[s.Namespace] = true
		for _, ns := range s.Spec.ExportTo {
			ix.own[ns] = true
		}
	}
	for _, list := range ix.scopes {
		// Sidecars with more selector labels first (the namespace default,
		// with none, last), then by name.
		slices.SortFunc(list, func(a, b meshbuild.Scope) int {
			return cmp.Or(cmp.Compare(len(b.Spec.WorkloadSelector), len(a.Spec.WorkloadSelector)), cmp.Compare(a.Name, b.Name))
		})
	}
	for i, s := range ix.scopes[b.RootNamespace] {
		if b.RootNamespace != "" && len(s.Spec.WorkloadSelector) == 0 {
			ix.rootScope = &ix.scopes[b.RootNamespace][i]
			break
		}
	}
	return ix
}

// scope returns the Sidecar that applies to a workload: the first whose
// selector matches its labels, else the namespace's default (no selector).
func (ix *Index) scope(namespace string, labels map[string]string) *meshbuild.Scope {
	for i, s := range ix.scopes[namespace] {
		if len(s.Spec.WorkloadSelector) == 0 || model.Selects(s.Spec.WorkloadSelector, labels) {
			return &ix.scopes[namespace][i]
		}
	}
	return ix.rootScope // the mesh's default Sidecar, if any
}

// scopeName names a workload's Sidecar in its class: "~<name>" for the
// root namespace's default.
func (ix *Index) scopeName(namespace string, s *meshbuild.Scope) string {
	if s.Namespace != namespace {
		return "~" + s.Name
	}
	return s.Name
}

func (ix *Index) find(namespace, name string) *meshbuild.Scope {
	if root, ok := strings.CutPrefix(name, "~"); ok {
		if ix.rootScope != nil && ix.rootScope.Name == root {
			return ix.rootScope
		}
		return nil
	}
	for i, s := range ix.scopes[namespace] {
		if s.Name == name {
			return &ix.scopes[namespace][i]
		}
	}
	return nil
}

// Same reports whether every proxy keeps its class from ix to next: the
// same Sidecars (by name and selector), the same exportTo restriction and
// the same Gateway selectors.
func (ix *Index) Same(next *Index) bool {
	if ix.restricted != next.restricted || len(ix.scopes) != len(next.scopes) || len(ix.gateways) != len(next.gateways) ||
		(ix.restricted && !maps.Equal(ix.own, next.own)) {
		return false
	}
	for ns, list := range ix.scopes {
		other := next.scopes[ns]
		if len(other) != len(list) {
			return false
		}
		for i := range list {
			if list[i].Name != other[i].Name || !maps.Equal(list[i].Spec.WorkloadSelector, other[i].Spec.WorkloadSelector) {
				return false
			}
		}
	}
	for i, g := range ix.gateways {
		if g.Key() != next.gateways[i].Key() || !maps.Equal(g.Spec.Selector, next.gateways[i].Spec.Selector) {
			return false
		}
	}
	if len(ix.policies) != len(next.policies) || !maps.Equal(ix.sourceNamespaces, next.sourceNamespaces) || !maps.Equal(ix.served, next.served) ||
		!maps.Equal(ix.shaped, next.shaped) || !slices.Equal(ix.versions, next.versions) ||
		!slices.Equal(slices.Sorted(maps.Keys(ix.sources)), slices.Sorted(maps.Keys(next.sources))) {
		return false
	}
	for ns, list := range ix.policies {
		other := next.policies[ns]
		if len(other) != len(list) {
			return false
		}
		for i := range list {
			if list[i].Tag() != other[i].Tag() || !maps.Equal(list[i].Spec.GetSelector(), other[i].Spec.GetSelector()) {
				return false
			}
		}
	}
	return true
}

// Classify returns the class of a proxy. A nil index (before the first
// build) gives every proxy its kind's class.
func (ix *Index) Classify(node *core.Node) cache.Class {
	if strings.HasPrefix(node.GetId(), Router+"~") {
		var keys []string
		if ix != nil {
			labels := nodeLabels(node)
			ns := nodemeta.Namespace(node)
			bound := ix.sharedGateways != nil && ns != "" && !ix.sharedGateways[ns]
			for _, g := range ix.gateways {
				if bound && g.Namespace != ns {
					// Labels are the node's word: they do not take a router
					// into another namespace's Gateways.
					continue
				}
				if len(g.Spec.Selector) > 0 && model.Selects(g.Spec.Selector, labels) {
					keys = append(keys, g.Key())
				}
			}
		}
		c := ix.shapeRouter(Class{Kind: Router, Gateways: keys}, node)
		if unprivileged(node) {
			c.Tags = append(c.Tags, UnprivilegedTag)
		}
		if tag, ok := gatewayTopology(node); ok {
			c.Tags = append(c.Tags, tag)
		}
		return c.Key()
	}
	c := Class{Kind: Kind(node).String()}
	ns := nodemeta.Namespace(node)
	if ix == nil || ns == "" {
		return c.Key()
	}
	labels := nodeLabels(node)
	c.Tags = ix.selected(ns, labels)
	if c.Kind == generate.Proxyless.String() {
		// Telemetries and EnvoyFilters shape Envoys alone.
		c.Tags = slices.DeleteFunc(c.Tags, envoyOnlyTag)
	} else if v := ix.versionTag(node); v != "" {
		c.Tags = append(c.Tags, v)
	}
	if s := ix.scope(ns, labels); s != nil {
		c.Namespace, c.Sidecar = ns, ix.scopeName(ns, s)
		if s.Namespace != ns && !ix.own[ns] {
			// The mesh's default Sidecar in a namespace with nothing of
			// its own: one class for all of them, however many clients
			// claim.
			c.Namespace = Elsewhere
		}
		return c.Key()
	}
	if ix.restricted || len(ix.policies[ns]) > 0 || len(ix.root) > 0 || len(c.Tags) > 0 || len(ix.sourceNamespaces) > 0 {
		c.Namespace = ns
		if !ix.own[ns] {
			c.Namespace = Elsewhere
		}
		return c.Key()
	}
	if ix.served[ns] && c.Kind == generate.Envoy.String() {
		// Its own namespace's services by their short names.
		c.Namespace = ns
	}
	return c.Key()
}

// shapeRouter adds to a gateway proxy's class its namespace, whose view of
// the mesh it is served (the services exported to it, as istiod serves a
// gateway), and the tags of the Telemetries and EnvoyFilters that select
// it.
func (ix *Index) shapeRouter(c Class, node *core.Node) Class {
	ns := nodemeta.Namespace(node)
	if ix == nil || ns == "" {
		return c
	}
	c.Namespace = ns
	c.Tags = slices.DeleteFunc(ix.selected(ns, nodeLabels(node)), func(tag string) bool { return !envoyOnlyTag(tag) })
	if v := ix.versionTag(node); v != "" {
		c.Tags = append(c.Tags, v)
	}
	return c
}

// gatewayTopology returns the tag of the gateway topology a gateway
// proxy's agent says (PROXY_CONFIG gatewayTopology), when it says one.
func gatewayTopology(node *core.Node) (string, bool) {
	topo := node.GetMetadata().GetFields()["PROXY_CONFIG"].GetStructValue().GetFields()["gatewayTopology"].GetStructValue()
	if topo == nil {
		return "", false
	}
	trusted := topo.GetFields()["numTrustedProxies"].GetNumberValue()
	if trusted < 0 || trusted > math.MaxUint32 {
		trusted = 0
	}
	details := meshv1.ClientCertDetails(meshv1.ClientCertDetails_value["CLIENT_CERT_DETAILS_"+topo.GetFields()["forwardClientCertDetails"].GetStringValue()])
	return TopologyTag(uint32(trusted), details), true
}

// unprivileged reports whether a node says, as Istio's agent does in an
// unprivileged pod (UNPRIVILEGED_POD "true"), that it cannot bind the
// ports below 1024.
func unprivileged(node *core.Node) bool {
	v, _ := strconv.ParseBool(node.GetMetadata().GetFields()["UNPRIVILEGED_POD"].GetStringValue())
	return v
}

func envoyOnlyTag(tag string) bool {
	return strings.HasPrefix(tag, "t:") || strings.HasPrefix(tag, "e:")
}

// versionTag says which of the EnvoyFilters' version patterns an Envoy's
// Istio version (ISTIO_VERSION) matches: "v:" and a 1 or 0 for each, so
// that however many versions proxies claim, they make at most one class
// per combination of patterns.
func (ix *Index) versionTag(node *core.Node) string {
	if len(ix.versions) == 0 {
		return ""
	}
	version := node.GetMetadata().GetFields()["ISTIO_VERSION"].GetStringValue()
	b := []byte("v:")
	for _, re := range ix.versionRes {
		if re != nil && re.MatchString(version) {
			b = append(b, '1')
		} else {
			b = append(b, '0')
		}
	}
	return string(b)
}

// selected returns the tags of the security policies with a selector that
// select a workload, then of the source selectors of route matches that do
// (see generate.SelectorTag).
func (ix *Index) selected(namespace string, labels map[string]string) []string {
	var tags []string
	for _, list := range [][]*generate.Policy{ix.policies[namespace], ix.root} {
		for _, p := range list {
			if sel := p.Spec.GetSelector(); len(sel) > 0 && p.AppliesTo(namespace) && model.Selects(sel, labels) && !slices.Contains(tags, p.Tag()) {
				tags = append(tags, p.Tag())
			}
		}
	}
	for _, tag := range slices.Sorted(maps.Keys(ix.sources)) {
		if model.Selects(ix.sources[tag], labels) {
			tags = append(tags, tag)
		}
	}
	return tags
}

// Gateways returns the keys of the Gateways of a router class, and whether
// the class is one.
func Gateways(class cache.Class) ([]string, bool) {
	c := ParseClass(class)
	return c.Gateways, c.Kind == Router
}

// View returns the proxy kind and view of a (non-router) class.
func (ix *Index) View(class cache.Class) (generate.Proxy, generate.View) {
	c := ParseClass(class)
	kind := c.Proxy()
	if c.Namespace == "" {
		return kind, generate.View{}
	}
	v := generate.View{Namespace: c.Namespace}
	for _, tag := range c.Tags {
		switch {
		case strings.HasPrefix(tag, "l:"):
			v.Sources = append(v.Sources, tag)
		case strings.HasPrefix(tag, "v:"):
			v.ProxyVersions = ix.matchedVersions(tag)
		case tag == UnprivilegedTag, strings.HasPrefix(tag, topologyPrefix):
			// what a gateway proxy may bind or trusts, not a policy
		default:
			v.Policies = append(v.Policies, tag)
		}
	}
	if ix != nil && c.Sidecar != "" {
		if s := ix.find(c.Namespace, c.Sidecar); s != nil {
			for _, e := range s.Spec.Egress {
				if e.Port != 0 {
					if v.EgressPorts == nil {
						v.EgressPorts = map[uint32][]string{}
					}
					v.EgressPorts[e.Port] = append(v.EgressPorts[e.Port], e.Hosts...)
					continue
				}
				v.Egress = append(v.Egress, e.Hosts...)
			}
			v.Outbound = s.Spec.OutboundPolicy
			v.Ingress = s.Spec.Ingress
		}
	}
	return kind, v
}

// matchedVersions reads a version tag back: the patterns it matched.
func (ix *Index) matchedVersions(tag string) map[string]bool {
	out := map[string]bool{}
	bits := strings.TrimPrefix(tag, "v:")
	if ix == nil || len(bits) != len(ix.versions) {
		return out
	}
	for i, pattern := range ix.versions {
		out[pattern] = bits[i] == '1'
	}
	return out
}

// Kind tells proxyless gRPC clients (Istio's GENERATOR=grpc metadata, or
// grpc-go's user agent) from Envoy.
func Kind(node *core.Node) generate.Proxy {
	if node.GetMetadata().GetFields()["GENERATOR"].GetStringValue() == "grpc" ||
		strings.HasPrefix(node.GetUserAgentName(), "gRPC") {
		return generate.Proxyless
	}
	return generate.Envoy
}

// nodeLabels reads Istio's LABELS metadata.
func nodeLabels(node *core.Node) map[string]string {
	out := map[string]string{}
	for k, v := range node.GetMetadata().GetFields()["LABELS"].GetStructValue().GetFields() {
		out[k] = v.GetStringValue()
	}
	return out
}
