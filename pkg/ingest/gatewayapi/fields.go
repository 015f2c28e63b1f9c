package gatewayapi

import (
	"reflect"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwv1a2 "sigs.k8s.io/gateway-api/apis/v1alpha2"
	gwv1b1 "sigs.k8s.io/gateway-api/apis/v1beta1"
)

// FieldRow says what becomes of one field of a Gateway API resource.
type FieldRow = ingest.FieldRow

// kinds are the kinds read and the types their specs decode into.
var kinds = []struct {
	kind string
	spec reflect.Type
}{
	{KindGatewayClass, reflect.TypeFor[gwv1.GatewayClassSpec]()},
	{KindGateway, reflect.TypeFor[gwv1.GatewaySpec]()},
	{KindHTTPRoute, reflect.TypeFor[gwv1.HTTPRouteSpec]()},
	{KindGRPCRoute, reflect.TypeFor[gwv1.GRPCRouteSpec]()},
	{KindTLSRoute, reflect.TypeFor[gwv1.TLSRouteSpec]()},
	{KindTCPRoute, reflect.TypeFor[gwv1a2.TCPRouteSpec]()},
	{KindReferenceGrant, reflect.TypeFor[gwv1b1.ReferenceGrantSpec]()},
}

// fieldNotes are the fields that are not simply supported, and what the
// supported ones with a limit do; a field listed is one row, its fields
// not listed apart. Every other field is supported.
var fieldNotes = map[string]string{
	"GatewayClass spec.parametersRef":                "rejected: the class is not accepted (InvalidParameters)",
	"GatewayClass spec.description":                  "supported: informational",
	"Gateway spec.addresses":                         "supported: a Hostname naming a Service whose selector picks the gateway's proxies (a gateway deployed by hand); other types are not accepted (UnsupportedAddress)",
	"Gateway spec.infrastructure":                    "warned: the gateway's proxies and Service are deployed by the operator",
	"Gateway spec.allowedListeners":                  "warned: ListenerSets are not read",
	"Gateway spec.tls":                               "warned: gateway-wide TLS settings have no effect yet",
	"Gateway spec.defaultScope":                      "warned: default Gateways are not read",
	"Gateway spec.listeners[].protocol":              "supported: HTTP, HTTPS, TLS, TCP; another protocol's listener is not accepted (UnsupportedProtocol)",
	"Gateway spec.listeners[].tls.mode":              "supported: Terminate on HTTPS, Passthrough on TLS; a TLS listener that terminates is not served (InvalidCertificateRef)",
	"Gateway spec.listeners[].tls.certificateRefs":   "supported: the first, a Secret of the Gateway's namespace served through SDS as an Istio Gateway's credentialName; another namespace's is refused (RefNotPermitted without a ReferenceGrant, InvalidCertificateRef with one)",
	"Gateway spec.listeners[].tls.options":           "warned: no option is read",
	"Gateway spec.listeners[].allowedRoutes.kinds":   "supported: HTTPRoute and GRPCRoute on HTTP and HTTPS, TLSRoute on TLS, TCPRoute on TCP; another kind is refused (InvalidRouteKinds)",
	"HTTPRoute spec.rules[].matches":                 "supported: ranked by the API's precedence, with the rules of the other HTTPRoutes of the host at a Gateway; nothing after the first rule that matches every request is sent",
	"HTTPRoute spec.useDefaultGateways":              "warned: default Gateways are not read",
	"HTTPRoute spec.parentRefs":                      "supported: a Gateway of a served class, or a Service (GAMMA: the route applies to the Service's callers, only those of the route's namespace when it is another)",
	"HTTPRoute spec.rules[].filters":                 "supported: RequestHeaderModifier, ResponseHeaderModifier, RequestRedirect, URLRewrite, RequestMirror (one per rule), CORS; ExtensionRef and ExternalAuth make the route not accepted (UnsupportedValue)",
	"HTTPRoute spec.rules[].backendRefs":             "supported: Services, weighted; a backend that does not resolve answers 500 (BackendNotFound, InvalidKind, RefNotPermitted)",
	"HTTPRoute spec.rules[].sessionPersistence":      "rejected: the route is not accepted (UnsupportedValue)",
	"HTTPRoute spec.rules[].retry":                   "supported: attempts (default 2), backoff, codes; connection failures are retried too",
	"HTTPRoute spec.rules[].timeouts.backendRequest": "supported: each try's timeout with retries, else the request's",
	"GRPCRoute spec.useDefaultGateways":              "warned: default Gateways are not read",
	"GRPCRoute spec.parentRefs":                      "as `HTTPRoute parentRefs`",
	"GRPCRoute spec.rules[].filters":                 "supported: RequestHeaderModifier, ResponseHeaderModifier, RequestMirror (one per rule); ExtensionRef makes the route not accepted",
	"GRPCRoute spec.rules[].backendRefs":             "as `HTTPRoute rules[].backendRefs`",
	"GRPCRoute spec.rules[].sessionPersistence":      "rejected: the route is not accepted (UnsupportedValue)",
	"TLSRoute spec.useDefaultGateways":               "warned: default Gateways are not read",
	"TLSRoute spec.parentRefs":                       "as `HTTPRoute parentRefs`",
	"TLSRoute spec.hostnames":                        "supported: the SNI names routed, those the listener's hostname admits",
	"TLSRoute spec.rules[].backendRefs":              "supported: Services, weighted; a backend that does not resolve is left out (BackendNotFound, InvalidKind, RefNotPermitted)",
	"TCPRoute spec.useDefaultGateways":               "warned: default Gateways are not read",
	"TCPRoute spec.parentRefs":                       "as `HTTPRoute parentRefs`",
	"TCPRoute spec.rules[].backendRefs":              "as `TLSRoute rules[].backendRefs`",
}

// Fields lists the fields of the kinds read.
func Fields() []FieldRow {
	var out []FieldRow
	for _, k := range kinds {
		out = append(out, ingest.TypeFields(k.kind, k.spec, "spec", fieldNotes)...)
	}
	return out
}

// FieldTable is Fields as a Markdown table.
func FieldTable() string {
	return ingest.FieldTable(Fields())
}
