package gatewayapi

import (
	"fmt"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// route is what routes of every kind have in common.
type route struct {
	kind      string
	obj       metav1.Object
	parents   []gwv1.ParentReference
	hostnames []gwv1.Hostname
	rules     *rules
	refs      *refs
}

func (t *translator) httpRoute(r *gwv1.HTTPRoute) {
	if r.Spec.UseDefaultGateways != "" {
		t.warn(KindHTTPRoute, r.Namespace, r.Name, "spec.useDefaultGateways", "default Gateways are not read")
	}
	refs := newRefs(r.Generation)
	t.route(&route{kind: KindHTTPRoute, obj: r, parents: r.Spec.ParentRefs, hostnames: r.Spec.Hostnames, rules: t.httpRules(r, refs), refs: refs})
}

func (t *translator) grpcRoute(r *gwv1.GRPCRoute) {
	if r.Spec.UseDefaultGateways != "" {
		t.warn(KindGRPCRoute, r.Namespace, r.Name, "spec.useDefaultGateways", "default Gateways are not read")
	}
	refs := newRefs(r.Generation)
	t.route(&route{kind: KindGRPCRoute, obj: r, parents: r.Spec.ParentRefs, hostnames: r.Spec.Hostnames, rules: t.grpcRules(r, refs), refs: refs})
}

// route attaches a route to its parents, emits its route rules and
// records its parents' status.
func (t *translator) route(r *route) {
	ns, gen := r.obj.GetNamespace(), r.obj.GetGeneration()
	var parents []gwv1.RouteParentStatus
	var bound []binding
	for i, p := range r.parents {
		field := fmt.Sprintf("spec.parentRefs[%d]", i)
		var accepted metav1.Condition
		switch group, kind := parentKind(p); {
		case group == Group && kind == KindGateway:
			gw, managed := t.gatewayParent(p, ns)
			if !managed {
				continue // another controller's Gateway: its status is not ours
			}
			var b []binding
			b, accepted = t.attach(r, gw, p)
			bound = append(bound, b...)
		case group == "" && kind == "Service":
			accepted = t.meshParent(r, p, i)
		default:
			continue // a parent of another implementation
		}
		if r.rules.unsupported != "" && accepted.Status == metav1.ConditionTrue {
			accepted = condition(gen, string(gwv1.RouteConditionAccepted), false, string(gwv1.RouteReasonUnsupportedValue), r.rules.unsupported)
		}
		if accepted.Status == metav1.ConditionFalse {
			t.warn(r.kind, ns, r.obj.GetName(), field, "%s", accepted.Message)
		}
		parents = append(parents, gwv1.RouteParentStatus{ParentRef: p, ControllerName: gwv1.GatewayController(t.out.Controller),
			Conditions: []metav1.Condition{accepted, r.refs.resolved}})
	}
	if r.refs.resolved.Status == metav1.ConditionFalse {
		t.warn(r.kind, ns, r.obj.GetName(), "", "%s", r.refs.resolved.Message)
	}
	if len(bound) > 0 && r.rules.unsupported == "" {
		t.emitRule(r, "gateway", gatewayRule(r, bound))
	}
	if parents != nil {
		t.out.Statuses = append(t.out.Statuses, Status{Kind: r.kind, Namespace: ns, Name: r.obj.GetName(), Parents: parents})
	}
}

// emitRule emits one of a route's route rules, named after the route, its
// kind and what it binds to ("gateway", or the Service of a GAMMA parent).
func (t *translator) emitRule(r *route, to string, rr *meshv1.RouteRule) {
	ns, name := r.obj.GetNamespace(), r.obj.GetName()
	rr.Origin = t.origin(r.kind, r.obj)
	rr.GatewayApi = true
	key := name + "~" + strings.ToLower(r.kind) + "~" + to
	t.emit(model.KindRouteRule, ns, key, location(r.kind, ns, name), rr)
}

func parentKind(p gwv1.ParentReference) (group, kind string) {
	group, kind = Group, KindGateway
	if p.Group != nil {
		group = string(*p.Group)
	}
	if p.Kind != nil {
		kind = string(*p.Kind)
	}
	return group, kind
}

// gatewayParent returns the served Gateway a parent reference names (nil
// when none exists) and whether its status is this controller's to write:
// a Gateway of another class is not.
func (t *translator) gatewayParent(p gwv1.ParentReference, routeNS string) (*gateway, bool) {
	ns := routeNS
	if p.Namespace != nil && *p.Namespace != "" {
		ns = string(*p.Namespace)
	}
	if gw := t.gateways[ns+"/"+string(p.Name)]; gw != nil {
		return gw, true
	}
	for _, g := range t.in.Gateways {
		if g.Namespace == ns && g.Name == string(p.Name) {
			return nil, false
		}
	}
	return nil, true
}

// binding is a route bound to a listener that serves it.
type binding struct {
	gateway string // the listener's model Gateway, "<ns>/<name>"
	port    uint32
	hosts   []string // the route's hosts on it
}

// gatewayRule is the route rule of a route's bindings to listeners: HTTP
// rules hold the hosts of them all, L4 rules a match per listener.
func gatewayRule(r *route, bound []binding) *meshv1.RouteRule {
	rr := &meshv1.RouteRule{Http: r.rules.http}
	for _, b := range bound {
		rr.Gateways = append(rr.Gateways, b.gateway)
		for _, h := range b.hosts {
			if !slices.Contains(rr.Hosts, h) {
				rr.Hosts = append(rr.Hosts, h)
			}
		}
	}
	for _, l4 := range r.rules.l4 {
		c := proto.CloneOf(l4)
		for _, b := range bound {
			m := &meshv1.L4Match{Port: b.port, Gateways: []string{b.gateway}}
			if r.kind == KindTLSRoute {
				m.SniHosts = b.hosts
			}
			c.Match = append(c.Match, m)
		}
		if r.kind == KindTLSRoute {
			rr.Tls = append(rr.Tls, c)
		} else {
			rr.Tcp = append(rr.Tcp, c)
		}
	}
	return rr
}

// attach attaches a route to the listeners of gw that its parent reference
// names and that admit it; it returns where it is bound and the parent's
// Accepted condition.
func (t *translator) attach(r *route, gw *gateway, p gwv1.ParentReference) ([]binding, metav1.Condition) {
	gen := r.obj.GetGeneration()
	refuse := func(reason gwv1.RouteConditionReason, format string, args ...any) ([]binding, metav1.Condition) {
		return nil, condition(gen, string(gwv1.RouteConditionAccepted), false, string(reason), fmt.Sprintf(format, args...))
	}
	if gw == nil {
		return refuse(gwv1.RouteReasonNoMatchingParent, "Gateway %s not found", parentName(p, r.obj.GetNamespace()))
	}
	var bound []binding
	named, allowed, attached := false, false, false
	for _, l := range gw.listeners {
		if (p.SectionName != nil && *p.SectionName != l.spec.Name) || (p.Port != nil && *p.Port != l.spec.Port) {
			continue
		}
		named = true
		if !l.accepted || !t.admits(l, gw.obj.Namespace, r) {
			continue
		}
		allowed = true
		on := hostsOn(r.hostnames, l.spec.Hostname)
		if len(on) == 0 {
			continue
		}
		// A listener counts the routes attached even while its references
		// do not resolve; it routes them once they do.
		l.attached++
		attached = true
		if l.served {
			bound = append(bound, binding{gateway: gw.obj.Namespace + "/" + l.name, port: uint32(l.spec.Port), hosts: on})
		}
	}
	switch {
	case !named:
		return refuse(gwv1.RouteReasonNoMatchingParent, "Gateway %s has no listener %s", parentName(p, r.obj.GetNamespace()), sectionOrPort(p))
	case !allowed:
		return refuse(gwv1.RouteReasonNotAllowedByListeners, "no listener of Gateway %s admits %ss of namespace %s", parentName(p, r.obj.GetNamespace()), r.kind, r.obj.GetNamespace())
	case !attached:
		return refuse(gwv1.RouteReasonNoMatchingListenerHostname, "no hostname of the route matches a listener's of Gateway %s", parentName(p, r.obj.GetNamespace()))
	}
	return bound, condition(gen, string(gwv1.RouteConditionAccepted), true, string(gwv1.RouteReasonAccepted), "Route was valid")
}

func parentName(p gwv1.ParentReference, routeNS string) string {
	ns := routeNS
	if p.Namespace != nil && *p.Namespace != "" {
		ns = string(*p.Namespace)
	}
	return ns + "/" + string(p.Name)
}

func sectionOrPort(p gwv1.ParentReference) string {
	var s []string
	if p.SectionName != nil {
		s = append(s, "named "+string(*p.SectionName))
	}
	if p.Port != nil {
		s = append(s, fmt.Sprintf("on port %d", *p.Port))
	}
	return strings.Join(s, " ")
}

// admits reports whether a listener admits the route's kind from its namespace.
func (t *translator) admits(l *listener, gatewayNS string, r *route) bool {
	if !slices.ContainsFunc(l.kinds, func(k gwv1.RouteGroupKind) bool { return string(k.Kind) == r.kind }) {
		return false
	}
	ns := r.obj.GetNamespace()
	switch allowedFrom(l.spec) {
	case gwv1.NamespacesFromAll:
		return true
	case gwv1.NamespacesFromSelector:
		sel, err := metav1.LabelSelectorAsSelector(l.spec.AllowedRoutes.Namespaces.Selector)
		if err != nil {
			return false
		}
		nsLabels, ok := t.in.Namespace(ns)
		return ok && sel.Matches(labels.Set(nsLabels))
	case gwv1.NamespacesFromNone:
		return false
	}
	return ns == gatewayNS
}

// hostsOn returns the hosts a route has on a listener: those of its
// hostnames (any, when it has none) that a listener's hostname (any, when
// nil) admits, the narrower of the two where a wildcard meets a host.
func hostsOn(route []gwv1.Hostname, listener *gwv1.Hostname) []string {
	l := "*"
	if listener != nil && *listener != "" {
		l = string(*listener)
	}
	if len(route) == 0 {
		return []string{l}
	}
	var out []string
	for _, h := range route {
		switch {
		case l == "*":
			out = append(out, string(h))
		case hostMatch(string(h), l):
			out = append(out, narrower(string(h), l))
		}
	}
	return out
}

// narrower returns the narrower of two matching host names.
func narrower(a, b string) string {
	if strings.HasPrefix(a, "*.") && (!strings.HasPrefix(b, "*.") || len(b) > len(a)) {
		return b
	}
	return a
}

// hostMatch reports whether two host names, either a wildcard "*.<domain>",
// have a host in common.
func hostMatch(a, b string) bool {
	switch {
	case a == b:
		return true
	case strings.HasPrefix(a, "*.") && strings.HasSuffix(b, a[1:]):
		return true
	case strings.HasPrefix(b, "*.") && strings.HasSuffix(a, b[1:]):
		return true
	}
	return false
}

// meshParent binds a route to a Service (GAMMA): the route is the
// Service's, for the sidecars and proxyless clients calling it; only the
// route's own namespace's when the route is in another namespace than the
// Service (a consumer route).
func (t *translator) meshParent(r *route, p gwv1.ParentReference, i int) metav1.Condition {
	ns, gen := r.obj.GetNamespace(), r.obj.GetGeneration()
	svcNS := ns
	if p.Namespace != nil && *p.Namespace != "" {
		svcNS = string(*p.Namespace)
	}
	svc := t.in.Service(svcNS, string(p.Name))
	if svc == nil {
		return condition(gen, string(gwv1.RouteConditionAccepted), false, string(gwv1.RouteReasonNoMatchingParent), fmt.Sprintf("Service %s/%s not found", svcNS, p.Name))
	}
	if r.rules.unsupported != "" {
		return condition(gen, string(gwv1.RouteConditionAccepted), true, string(gwv1.RouteReasonAccepted), "Route was valid")
	}
	rr := &meshv1.RouteRule{Hosts: []string{t.fqdn(svcNS, svc.Name)}, ExportTo: []string{"*"}}
	if svcNS != ns {
		rr.ExportTo = []string{"."}
	}
	rr.Http = r.rules.http
	if p.Port != nil {
		rr.Http = withPort(r.rules.http, uint32(*p.Port))
	}
	for _, l4 := range r.rules.l4 {
		c := proto.CloneOf(l4)
		if p.Port != nil {
			c.Match = []*meshv1.L4Match{{Port: uint32(*p.Port)}}
		}
		if r.kind == KindTLSRoute {
			for _, h := range r.hostnames {
				if len(c.Match) == 0 {
					c.Match = []*meshv1.L4Match{{}}
				}
				c.Match[0].SniHosts = append(c.Match[0].SniHosts, string(h))
			}
			rr.Tls = append(rr.Tls, c)
		} else {
			rr.Tcp = append(rr.Tcp, c)
		}
	}
	t.emitRule(r, fmt.Sprintf("%s.%s.%d", svc.Name, svcNS, i), rr)
	return condition(gen, string(gwv1.RouteConditionAccepted), true, string(gwv1.RouteReasonAccepted), "Route was valid")
}

// withPort limits rules to a port: each match (or a match of everything)
// gains it.
func withPort(in []*meshv1.HTTPRoute, port uint32) []*meshv1.HTTPRoute {
	out := make([]*meshv1.HTTPRoute, len(in))
	for i, h := range in {
		c := proto.CloneOf(h)
		for _, m := range c.Match {
			m.Port = port
		}
		if len(c.Match) == 0 {
			c.Match = []*meshv1.HTTPMatch{{Port: port}}
		}
		out[i] = c
	}
	return out
}
