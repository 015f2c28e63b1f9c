package gatewayapi

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1a2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
	gwv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// Resources are the Gateway API kinds read, by kind, with the resource
// (plural) name they are served under and the version read.
var Resources = []struct{ Kind, Resource, Version string }{
	{KindGatewayClass, "gatewayclasses", "v1"},
	{KindGateway, "gateways", "v1"},
	{KindHTTPRoute, "httproutes", "v1"},
	{KindGRPCRoute, "grpcroutes", "v1"},
	{KindReferenceGrant, "referencegrants", "v1beta1"},
	{KindTLSRoute, "tlsroutes", "v1"},
	{KindTCPRoute, "tcproutes", "v1alpha2"},
}

// Add adds a resource read as unstructured (from a dynamic informer or a
// YAML document) to the inputs, typed by its kind.
func (in *Inputs) Add(u *unstructured.Unstructured) error {
	into := func(obj any) error {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
			return fmt.Errorf("%s: %w", location(u.GetKind(), u.GetNamespace(), u.GetName()), err)
		}
		return nil
	}
	switch u.GetKind() {
	case KindGatewayClass:
		var o gwv1.GatewayClass
		if err := into(&o); err != nil {
			return err
		}
		in.Classes = append(in.Classes, &o)
	case KindGateway:
		var o gwv1.Gateway
		if err := into(&o); err != nil {
			return err
		}
		in.Gateways = append(in.Gateways, &o)
	case KindHTTPRoute:
		var o gwv1.HTTPRoute
		if err := into(&o); err != nil {
			return err
		}
		in.HTTPRoutes = append(in.HTTPRoutes, &o)
	case KindGRPCRoute:
		var o gwv1.GRPCRoute
		if err := into(&o); err != nil {
			return err
		}
		in.GRPCRoutes = append(in.GRPCRoutes, &o)
	case KindTLSRoute:
		var o gwv1.TLSRoute
		if err := into(&o); err != nil {
			return err
		}
		in.TLSRoutes = append(in.TLSRoutes, &o)
	case KindTCPRoute:
		var o gwv1a2.TCPRoute
		if err := into(&o); err != nil {
			return err
		}
		in.TCPRoutes = append(in.TCPRoutes, &o)
	case KindReferenceGrant:
		var o gwv1b1.ReferenceGrant
		if err := into(&o); err != nil {
			return err
		}
		in.Grants = append(in.Grants, &o)
	default:
		return fmt.Errorf("%s: kind %q is not a Gateway API kind read here", location(u.GetKind(), u.GetNamespace(), u.GetName()), u.GetKind())
	}
	return nil
}
