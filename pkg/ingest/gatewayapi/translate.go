package gatewayapi

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1a2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
	gwv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// Group is the Gateway API's group.
const Group = "gateway.networking.k8s.io"

// The kinds this package reads.
const (
	KindGatewayClass   = "GatewayClass"
	KindGateway        = "Gateway"
	KindHTTPRoute      = "HTTPRoute"
	KindGRPCRoute      = "GRPCRoute"
	KindReferenceGrant = "ReferenceGrant"
	KindTLSRoute       = "TLSRoute"
	KindTCPRoute       = "TCPRoute"
)

// DefaultController is the controller name of the classes served by
// default: Istio's, whose class "istio" users already name.
const DefaultController = "istio.io/gateway-controller"

// GatewayNameLabel labels a Gateway's proxies (and its Service) with the
// Gateway's name, as Istio's gateway deployments are labelled.
const GatewayNameLabel = "gateway.networking.k8s.io/gateway-name"

// Inputs are one cluster's Gateway API resources and what they refer to.
type Inputs struct {
	Classes    []*gwv1.GatewayClass
	Gateways   []*gwv1.Gateway
	HTTPRoutes []*gwv1.HTTPRoute
	GRPCRoutes []*gwv1.GRPCRoute
	TLSRoutes  []*gwv1.TLSRoute
	TCPRoutes  []*gwv1a2.TCPRoute
	Grants     []*gwv1b1.ReferenceGrant
	// Service returns a Service, nil when there is none.
	Service func(namespace, name string) *corev1.Service
	// Namespace returns a namespace's labels, false when it does not exist.
	Namespace func(name string) (map[string]string, bool)
	// GatewayServices returns the Services of a namespace labelled
	// GatewayNameLabel=<gateway>: where the Gateway is reached.
	GatewayServices func(namespace, gateway string) []*corev1.Service
}

// Options configure the translation.
type Options struct {
	// Controllers are the controller names whose classes are served
	// (default DefaultController).
	Controllers []string
	// DomainSuffix completes Service names (default cluster.local).
	DomainSuffix string
	// ObservedAt stamps the objects' origins.
	ObservedAt time.Time
}

// Status is the status one resource should show.
type Status struct {
	Kind, Namespace, Name string
	// Class, Gateway or Parents is set, by Kind. Parents are the route's
	// parents this controller manages.
	Class   *gwv1.GatewayClassStatus
	Gateway *gwv1.GatewayStatus
	Parents []gwv1.RouteParentStatus
}

// Output is what Translate returns.
type Output struct {
	Objects  []ingest.Object
	Problems []ingest.Problem
	Statuses []Status
	// Controller is the controller name written in the routes' parent
	// statuses (the first of Options.Controllers).
	Controller string
}

// translator holds a translation's indexes.
type translator struct {
	in      Inputs
	opts    Options
	out     Output
	classes map[string]bool // served class names
	// listeners of the served Gateways, by "<namespace>/<gateway>".
	gateways map[string]*gateway
}

// Translate translates the inputs into model objects and statuses.
func Translate(in Inputs, opts Options) Output {
	if len(opts.Controllers) == 0 {
		opts.Controllers = []string{DefaultController}
	}
	opts.DomainSuffix = cmp.Or(opts.DomainSuffix, "cluster.local")
	if in.Service == nil {
		in.Service = func(string, string) *corev1.Service { return nil }
	}
	if in.Namespace == nil {
		in.Namespace = func(string) (map[string]string, bool) { return nil, true }
	}
	if in.GatewayServices == nil {
		in.GatewayServices = func(string, string) []*corev1.Service { return nil }
	}
	t := &translator{in: in, opts: opts, classes: map[string]bool{}, gateways: map[string]*gateway{}}
	t.out.Controller = opts.Controllers[0]
	for _, c := range sortedObjects(in.Classes) {
		t.class(c)
	}
	for _, g := range sortedObjects(in.Gateways) {
		if t.classes[string(g.Spec.GatewayClassName)] {
			t.gateways[g.Namespace+"/"+g.Name] = t.listeners(g)
		}
	}
	for _, r := range sortedObjects(in.HTTPRoutes) {
		t.httpRoute(r)
	}
	for _, r := range sortedObjects(in.GRPCRoutes) {
		t.grpcRoute(r)
	}
	for _, r := range sortedObjects(in.TLSRoutes) {
		t.tlsRoute(r)
	}
	for _, r := range sortedObjects(in.TCPRoutes) {
		t.tcpRoute(r)
	}
	for _, g := range sortedObjects(in.Gateways) {
		if gw := t.gateways[g.Namespace+"/"+g.Name]; gw != nil {
			t.emitGateway(gw)
		}
	}
	return t.out
}

// sortedObjects orders objects by creation, then namespace and name:
// the oldest wins a conflict, as the API asks.
func sortedObjects[T metav1.Object](objs []T) []T {
	out := slices.Clone(objs)
	slices.SortStableFunc(out, func(a, b T) int {
		if c := a.GetCreationTimestamp().Compare(b.GetCreationTimestamp().Time); c != 0 {
			return c
		}
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// class accepts a class of a served controller.
func (t *translator) class(c *gwv1.GatewayClass) {
	if !slices.Contains(t.opts.Controllers, string(c.Spec.ControllerName)) {
		return
	}
	t.classes[c.Name] = true
	st := &gwv1.GatewayClassStatus{}
	cond := condition(c.Generation, string(gwv1.GatewayClassConditionStatusAccepted), true, string(gwv1.GatewayClassReasonAccepted), "Handled by shardpilot")
	if c.Spec.ParametersRef != nil {
		cond = condition(c.Generation, string(gwv1.GatewayClassConditionStatusAccepted), false, string(gwv1.GatewayClassReasonInvalidParameters),
			"spec.parametersRef: parameters are not supported; remove the reference")
		t.warn(KindGatewayClass, "", c.Name, "spec.parametersRef", "parameters are not supported")
	}
	st.Conditions = []metav1.Condition{cond}
	t.out.Statuses = append(t.out.Statuses, Status{Kind: KindGatewayClass, Name: c.Name, Class: st})
}

// condition is a condition of a resource's generation.
func condition(generation int64, typ string, ok bool, reason, message string) metav1.Condition {
	status := metav1.ConditionTrue
	if !ok {
		status = metav1.ConditionFalse
	}
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message, ObservedGeneration: generation}
}

// warn reports a problem that the resource's status also shows: the rest
// of the resource applies.
func (t *translator) warn(kind, ns, name, field, format string, args ...any) {
	loc := location(kind, ns, name)
	t.out.Problems = append(t.out.Problems, ingest.Problem{Location: loc, Resource: loc, Field: field,
		Reason: fmt.Sprintf(format, args...), Warning: true})
}

// Location names a resource in problems and origins: "<kind>.<group>
// <ns>/<name>", or "<kind>.<group> <name>" for a cluster-wide one. The
// group tells a Gateway of this API from an Istio Gateway.
func Location(kind, ns, name string) string { return location(kind, ns, name) }

// KindLocation is the part of a location naming the kind, which names
// every resource of the kind (see ingest.Covers).
func KindLocation(kind string) string { return kind + "." + Group }

func location(kind, ns, name string) string {
	if ns == "" {
		return KindLocation(kind) + " " + name
	}
	return KindLocation(kind) + " " + ns + "/" + name
}

func (t *translator) origin(kind string, o metav1.Object) *meshv1.Origin {
	out := &meshv1.Origin{SourceVersion: o.GetResourceVersion(), Location: location(kind, o.GetNamespace(), o.GetName())}
	if !t.opts.ObservedAt.IsZero() {
		out.ObservedAt = timestamppb.New(t.opts.ObservedAt)
	}
	return out
}

func (t *translator) emit(kind model.Kind, ns, name, resource string, o model.Object) {
	t.out.Objects = append(t.out.Objects, ingest.Object{Key: model.Key{Kind: kind, Namespace: ns, Name: name}, Object: o, Resource: resource})
}

// fqdn is a Service's host name.
func (t *translator) fqdn(ns, name string) string {
	return name + "." + ns + ".svc." + t.opts.DomainSuffix
}
