package ingress

import (
	"reflect"

	"github.com/shardpilot/shardpilot/pkg/ingest"
	networkingv1 "k8s.io/api/networking/v1"
)

// fieldNotes are the fields of an Ingress that are not simply supported,
// and what the supported ones with a limit do; a field listed is one row.
var fieldNotes = map[string]string{
	"Ingress spec.ingressClassName":              "supported: an IngressClass whose controller is istio.io/ingress-controller (or the kubernetes.io/ingress.class annotation naming MeshConfig's ingressClass)",
	"Ingress spec.defaultBackend":                "warned: not served, as in Istio (a VirtualService for host \"*\" does that)",
	"Ingress spec.tls":                           "supported: HTTPS on 443 for the hosts of each entry with a secretName (served through SDS as a Gateway's credentialName); an entry without is warned",
	"Ingress spec.rules[].http.paths[].pathType": "supported: Exact and Prefix as they say; ImplementationSpecific as istiod reads it (\"/a/*\" and \"/a.*\" prefixes, \"\", \"*\", \"/*\" anything, the rest exact)",
	"Ingress spec.rules[].http.paths[].backend":  "supported: a Service and its port (by number, or by name from the Service); a resource backend, or a port name the Service lacks, is warned and the path not served",
}

// Fields lists the fields of an Ingress.
func Fields() []ingest.FieldRow {
	return ingest.TypeFields("Ingress", reflect.TypeFor[networkingv1.IngressSpec](), "spec", fieldNotes)
}

// FieldTable is Fields as a Markdown table.
func FieldTable() string { return ingest.FieldTable(Fields()) }
