package gatewayapi_test

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	"github.com/shardpilot/shardpilot/pkg/model"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// load reads a file of YAML documents into inputs: the Gateway API
// kinds, and the Services and Namespaces they refer to.
func load(t *testing.T, file string) gatewayapi.Inputs {
	in, _ := loadWithServices(t, file)
	return in
}

// loadWithServices is load, with the Services read.
func loadWithServices(t *testing.T, file string) (gatewayapi.Inputs, []*corev1.Service) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	services := map[string]*corev1.Service{}
	namespaces := map[string]map[string]string{}
	var in gatewayapi.Inputs
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		switch u.GetKind() {
		case "Service":
			var s corev1.Service
			if err := yaml.Unmarshal([]byte(doc), &s); err != nil {
				t.Fatal(err)
			}
			services[s.Namespace+"/"+s.Name] = &s
		case "Namespace":
			namespaces[u.GetName()] = u.GetLabels()
		default:
			if err := in.Add(&u); err != nil {
				t.Fatal(err)
			}
		}
	}
	in.Service = func(ns, name string) *corev1.Service { return services[ns+"/"+name] }
	in.Namespace = func(name string) (map[string]string, bool) { l, ok := namespaces[name]; return l, ok }
	in.GatewayServices = func(ns, gw string) []*corev1.Service {
		var out []*corev1.Service
		for _, s := range services {
			if s.Namespace == ns && s.Labels[gatewayapi.GatewayNameLabel] == gw {
				out = append(out, s)
			}
		}
		return out
	}
	list := slices.Collect(maps.Values(services))
	slices.SortFunc(list, func(a, b *corev1.Service) int { return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	return in, list
}

func statusOf(t *testing.T, out gatewayapi.Output, kind, ns, name string) gatewayapi.Status {
	t.Helper()
	for _, s := range out.Statuses {
		if s.Kind == kind && s.Namespace == ns && s.Name == name {
			return s
		}
	}
	t.Fatalf("no status for %s %s/%s", kind, ns, name)
	return gatewayapi.Status{}
}

// reason returns a condition's status and reason, "" when it is missing.
func reason(conds []metav1.Condition, typ string) string {
	for _, c := range conds {
		if c.Type == typ {
			return string(c.Status) + "/" + c.Reason
		}
	}
	return ""
}

func TestIngressStatus(t *testing.T) {
	out := gatewayapi.Translate(load(t, "testdata/ingress.yaml"), gatewayapi.Options{})
	if got := reason(statusOf(t, out, "GatewayClass", "", "istio").Class.Conditions, "Accepted"); got != "True/Accepted" {
		t.Errorf("class istio: Accepted %s", got)
	}
	for _, s := range out.Statuses {
		if s.Name == "other" || s.Name == "elsewhere" {
			t.Errorf("%s %s: another controller's resource was given a status", s.Kind, s.Name)
		}
	}
	gw := statusOf(t, out, "Gateway", "infra", "edge").Gateway
	for typ, want := range map[string]string{"Accepted": "True/Accepted", "Programmed": "True/Programmed"} {
		if got := reason(gw.Conditions, typ); got != want {
			t.Errorf("Gateway edge: %s is %s, want %s", typ, got, want)
		}
	}
	if len(gw.Addresses) == 0 || gw.Addresses[0].Value != "10.96.0.10" {
		t.Errorf("Gateway edge: addresses %v, want its Service's cluster IP first", gw.Addresses)
	}
	listeners := map[string]struct {
		attached                                   int32
		accepted, programmed, resolved, conflicted string
	}{
		"http":       {1, "True/Accepted", "True/Programmed", "True/ResolvedRefs", "False/NoConflicts"},
		"https":      {2, "True/Accepted", "True/Programmed", "True/ResolvedRefs", "False/NoConflicts"},
		"other-cert": {0, "True/Accepted", "False/Invalid", "False/RefNotPermitted", "False/NoConflicts"},
		"clash":      {0, "True/Accepted", "False/Invalid", "True/ResolvedRefs", "True/ProtocolConflict"},
		"udp":        {0, "False/UnsupportedProtocol", "False/Invalid", "True/ResolvedRefs", "False/NoConflicts"},
		"tls":        {1, "True/Accepted", "True/Programmed", "True/ResolvedRefs", "False/NoConflicts"},
		"tcp":        {1, "True/Accepted", "True/Programmed", "True/ResolvedRefs", "False/NoConflicts"},
	}
	for _, l := range gw.Listeners {
		want, ok := listeners[string(l.Name)]
		if !ok {
			t.Errorf("unexpected listener %s", l.Name)
			continue
		}
		got := struct {
			attached                                   int32
			accepted, programmed, resolved, conflicted string
		}{l.AttachedRoutes, reason(l.Conditions, "Accepted"), reason(l.Conditions, "Programmed"), reason(l.Conditions, "ResolvedRefs"), reason(l.Conditions, "Conflicted")}
		if got != want {
			t.Errorf("listener %s: %+v, want %+v", l.Name, got, want)
		}
	}
	routes := map[string][]string{ // "<ns>/<name>" → per parent, "Accepted ResolvedRefs"
		"infra/web":        {"True/Accepted True/ResolvedRefs"},
		"shop/cart":        {"True/Accepted True/ResolvedRefs"},
		"blog/posts":       {"False/NotAllowedByListeners False/RefNotPermitted"},
		"shop/wrong-host":  {"False/NoMatchingListenerHostname True/ResolvedRefs"},
		"infra/lost":       {"False/NoMatchingParent False/BackendNotFound", "False/NoMatchingParent False/BackendNotFound"},
		"shop/refused":     {"True/Accepted False/RefNotPermitted"},
		"tls:infra/secure": {"True/Accepted True/ResolvedRefs"},
		"tcp:infra/db":     {"True/Accepted True/ResolvedRefs"},
	}
	for id, want := range routes {
		ns, name, _ := strings.Cut(id, "/")
		var got []string
		kind := "HTTPRoute"
		if strings.HasPrefix(id, "tls:") || strings.HasPrefix(id, "tcp:") {
			kind = map[string]string{"tls": "TLSRoute", "tcp": "TCPRoute"}[id[:3]]
			ns = strings.TrimPrefix(ns, id[:4])
		}
		for _, p := range statusOf(t, out, kind, ns, name).Parents {
			if p.ControllerName != gatewayapi.DefaultController {
				t.Errorf("%s: controller %s", id, p.ControllerName)
			}
			got = append(got, reason(p.Conditions, "Accepted")+" "+reason(p.Conditions, "ResolvedRefs"))
		}
		if !slices.Equal(got, want) {
			t.Errorf("HTTPRoute %s: parents %q, want %q", id, got, want)
		}
	}
}

func object(t *testing.T, out gatewayapi.Output, kind model.Kind, ns, name string) model.Object {
	t.Helper()
	for _, o := range out.Objects {
		if o.Key == (model.Key{Kind: kind, Namespace: ns, Name: name}) {
			return o.Object
		}
	}
	var have []string
	for _, o := range out.Objects {
		have = append(have, o.Key.String())
	}
	t.Fatalf("no %s %s/%s among %v", kind, ns, name, have)
	return nil
}

func TestIngressObjects(t *testing.T) {
	out := gatewayapi.Translate(load(t, "testdata/ingress.yaml"), gatewayapi.Options{})
	for _, o := range out.Objects {
		if err := model.ValidateKey(o.Key); err != nil {
			t.Errorf("%s: %v", o.Key, err)
		}
		if err := model.Validate(o.Object); err != nil {
			t.Errorf("%s: %v", o.Key, err)
		}
	}
	https := object(t, out, model.KindGateway, "infra", "edge-istio-autogenerated-k8s-gateway-https").(*meshv1.Gateway)
	if srv := https.Servers[0]; srv.Port != 443 || srv.Tls.GetCredentialName() != "example-cert" || !slices.Equal(srv.Hosts, []string{"*/*.example.com"}) {
		t.Errorf("https server: %v", srv)
	}
	if https.Selector[gatewayapi.GatewayNameLabel] != "edge" {
		t.Errorf("selector %v", https.Selector)
	}
	for _, l := range []string{"other-cert", "clash", "udp"} {
		for _, o := range out.Objects {
			if o.Key.Name == gatewayapi.ListenerGatewayName("edge", l) {
				t.Errorf("listener %s is not valid but was served", l)
			}
		}
	}
	cart := object(t, out, model.KindRouteRule, "shop", "cart~httproute~gateway").(*meshv1.RouteRule)
	if !cart.GatewayApi || !slices.Equal(cart.Gateways, []string{"infra/edge-istio-autogenerated-k8s-gateway-https"}) {
		t.Errorf("cart rule: %v", cart)
	}
	if ds := cart.Http[0].Route; len(ds) != 2 || ds[1].Destination.Host != "web.infra.svc.cluster.local" || ds[1].Weight != 10 {
		t.Errorf("cart destinations: %v", ds)
	}
	web := object(t, out, model.KindRouteRule, "infra", "web~httproute~gateway").(*meshv1.RouteRule)
	// By precedence: the exact path's rule before the prefix's.
	if r := web.Http[0]; r.Match[0].Uri.GetExact() != "/old" || r.Redirect.GetScheme() != "https" || r.Redirect.GetRedirectCode() != 301 {
		t.Errorf("web redirect: %v", r)
	}
	if m := web.Http[1].Match[0]; m.Uri.GetPrefix() != "/app" || m.Headers["x-version"].GetExact() != "v2" || m.Method.GetExact() != "GET" {
		t.Errorf("web match: %v", m)
	}
	for _, o := range out.Objects {
		if o.Key.Namespace == "blog" || strings.HasPrefix(o.Key.Name, "wrong-host") {
			t.Errorf("%s: a refused route was served", o.Key)
		}
	}
	lost := map[string]bool{}
	for _, p := range out.Problems {
		lost[p.Resource] = true
	}
	for _, r := range []string{"HTTPRoute.gateway.networking.k8s.io blog/posts", "HTTPRoute.gateway.networking.k8s.io shop/wrong-host",
		"HTTPRoute.gateway.networking.k8s.io infra/lost", "Gateway.gateway.networking.k8s.io infra/edge"} {
		if !lost[r] {
			t.Errorf("%s: no problem reported", r)
		}
	}
}

// TestClassOfOurOwn: the classes served are those of the controllers
// named; the others' are left alone, statuses included.
func TestClassOfOurOwn(t *testing.T) {
	out := gatewayapi.Translate(load(t, "testdata/ingress.yaml"), gatewayapi.Options{Controllers: []string{"example.com/other"}})
	if got := reason(statusOf(t, out, "GatewayClass", "", "other").Class.Conditions, "Accepted"); got != "True/Accepted" {
		t.Errorf("class other: Accepted %s", got)
	}
	statusOf(t, out, "Gateway", "infra", "elsewhere")
	for _, s := range out.Statuses {
		if s.Name == "istio" || s.Name == "edge" {
			t.Errorf("%s %s: a class not served was given a status", s.Kind, s.Name)
		}
	}
	if out.Controller != "example.com/other" {
		t.Errorf("controller %q", out.Controller)
	}
}
