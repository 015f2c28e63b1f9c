package gatewayapi

import (
	"fmt"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// invalidHost is the host of a destination that does not resolve: no
// service has it (".invalid" is reserved), so a proxy answers 500.
const invalidHost = "backend-not-found.invalid"

// refs collects what a route's references resolve to: the first
// failure is the route's ResolvedRefs condition.
type refs struct {
	gen      int64
	resolved metav1.Condition
}

func newRefs(gen int64) *refs {
	return &refs{gen: gen, resolved: condition(gen, string(gwv1.RouteConditionResolvedRefs), true, string(gwv1.RouteReasonResolvedRefs), "All references resolved")}
}

func (r *refs) fail(reason gwv1.RouteConditionReason, format string, args ...any) {
	if r.resolved.Status == metav1.ConditionFalse {
		return // the first failure is reported
	}
	r.resolved = condition(r.gen, string(gwv1.RouteConditionResolvedRefs), false, string(reason), fmt.Sprintf(format, args...))
}

// backend resolves a backend reference of a route of kind in namespace
// ns to a destination; one that does not resolve is invalidHost's, and
// recorded in r.
func (t *translator) backend(r *refs, kind, ns, field string, ref gwv1.BackendObjectReference) *meshv1.Destination {
	group, k := "", "Service"
	if ref.Group != nil {
		group = string(*ref.Group)
	}
	if ref.Kind != nil {
		k = string(*ref.Kind)
	}
	invalid := &meshv1.Destination{Host: invalidHost}
	if group != "" || k != "Service" {
		r.fail(gwv1.RouteReasonInvalidKind, "%s: %s is not a Service", field, groupKindName(group, k, string(ref.Name)))
		return invalid
	}
	to := ns
	if ref.Namespace != nil && *ref.Namespace != "" {
		to = string(*ref.Namespace)
	}
	if to != ns && !t.granted(kind, ns, "", "Service", to, string(ref.Name)) {
		r.fail(gwv1.RouteReasonRefNotPermitted, "%s: no ReferenceGrant in %s allows %ss of %s to use Service %s", field, to, kind, ns, ref.Name)
		return invalid
	}
	svc := t.in.Service(to, string(ref.Name))
	if svc == nil {
		r.fail(gwv1.RouteReasonBackendNotFound, "%s: Service %s/%s not found", field, to, ref.Name)
		return invalid
	}
	if ref.Port == nil {
		r.fail(gwv1.RouteReasonBackendNotFound, "%s: a port is required for Service %s/%s", field, to, ref.Name)
		return invalid
	}
	found := false
	for _, p := range svc.Spec.Ports {
		found = found || p.Port == int32(*ref.Port)
	}
	if !found {
		r.fail(gwv1.RouteReasonBackendNotFound, "%s: Service %s/%s has no port %d", field, to, ref.Name, *ref.Port)
		return invalid
	}
	return &meshv1.Destination{Host: t.fqdn(to, string(ref.Name)), Port: uint32(*ref.Port)}
}

func groupKindName(group, kind, name string) string {
	if group == "" {
		group = "core"
	}
	return group + "/" + kind + " " + name
}

// granted reports whether a ReferenceGrant in toNS lets a fromKind of
// fromNS refer to the object toGroup/toKind toName there.
func (t *translator) granted(fromKind, fromNS, toGroup, toKind, toNS, toName string) bool {
	for _, g := range t.in.Grants {
		if g.Namespace != toNS {
			continue
		}
		from := false
		for _, f := range g.Spec.From {
			from = from || (string(f.Group) == Group && string(f.Kind) == fromKind && string(f.Namespace) == fromNS)
		}
		if !from {
			continue
		}
		for _, to := range g.Spec.To {
			if string(to.Group) == toGroup && string(to.Kind) == toKind && (to.Name == nil || *to.Name == "" || string(*to.Name) == toName) {
				return true
			}
		}
	}
	return false
}
