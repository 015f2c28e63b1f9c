package inject_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	tu "github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/inject"
	admissionv1 "k8s.io/api/admission/v1"
	admregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// serveTLS serves h over TLS on loopback with a certificate of a test
// root, returning its URL and the root (the caBundle the API server
// trusts it by).
func serveTLS(t *testing.T, h http.Handler) (string, []byte) {
	t.Helper()
	ca := tu.NewCA(t)
	certFile, keyFile := ca.Issue(t, "webhook")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	root, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if w, ok := h.(*inject.Webhook); ok {
		go func() { done <- w.Serve(ctx, lis, tc) }()
	} else {
		srv := &http.Server{Handler: h, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second}
		go func() { done <- srv.ServeTLS(lis, "", "") }()
		context.AfterFunc(ctx, func() { srv.Close() })
	}
	t.Cleanup(func() { cancel(); <-done })
	return "https://" + lis.Addr().String() + inject.Path, root
}

// register has the API server call the webhook at url for the creation
// of pods in namespace ns, called again when later webhooks change the pod.
func register(t *testing.T, kc *kubetest.Cluster, name, url string, root []byte, ns string) {
	t.Helper()
	none, fail, again := admregv1.SideEffectClassNone, admregv1.Fail, admregv1.IfNeededReinvocationPolicy
	timeout := int32(10)
	cfg := &admregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: name},
		Webhooks: []admregv1.MutatingWebhook{{
			Name:         strings.TrimPrefix(name, "z-") + ".shardpilot.io",
			ClientConfig: admregv1.WebhookClientConfig{URL: &url, CABundle: root},
			Rules: []admregv1.RuleWithOperations{{Operations: []admregv1.OperationType{admregv1.Create},
				Rule: admregv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}}}},
			NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{ns}}}},
			SideEffects: &none, FailurePolicy: &fail, ReinvocationPolicy: &again, TimeoutSeconds: &timeout,
			AdmissionReviewVersions: []string{"v1"},
		}}}
	cs := kc.Client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if _, err := cs.Create(context.Background(), cfg, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// istioInjector does what Istio's injector does with the CA's address: it
// adds an istio-proxy container whose CA_ADDR is istiod's, followed by the
// proxyMetadata of the pod's proxy.istio.io/config annotation, once.
func istioInjector(t *testing.T) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var review admissionv1.AdmissionReview
		var pod corev1.Pod
		if err := json.NewDecoder(r.Body).Decode(&review); err != nil || json.Unmarshal(review.Request.Object.Raw, &pod) != nil {
			t.Errorf("istio's injector got no pod: %v", err)
			return
		}
		resp := &admissionv1.AdmissionResponse{UID: review.Request.UID, Allowed: true}
		if pod.Annotations["sidecar.istio.io/status"] == "" {
			env := []corev1.EnvVar{{Name: "CA_ADDR", Value: "istiod.istio-system.svc:15012"}}
			var cfg struct{ ProxyMetadata map[string]string }
			_ = json.Unmarshal([]byte(pod.Annotations[inject.ProxyConfigAnnotation]), &cfg)
			for _, k := range slices.Sorted(maps.Keys(cfg.ProxyMetadata)) {
				env = append(env, corev1.EnvVar{Name: k, Value: cfg.ProxyMetadata[k]})
			}
			annotations := maps.Clone(pod.Annotations)
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations["sidecar.istio.io/status"] = "{}"
			patch, _ := json.Marshal([]map[string]any{
				{"op": "add", "path": "/spec/containers/-", "value": corev1.Container{Name: "istio-proxy", Image: "proxyv2", Env: env}},
				{"op": "add", "path": "/metadata/annotations", "value": annotations},
			})
			pt := admissionv1.PatchTypeJSONPatch
			resp.Patch, resp.PatchType = patch, &pt
		}
		out, _ := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write(out)
	})
}

// caAddr is the CA address an istio-proxy container's agent reads: the
// last CA_ADDR of its environment ("" without the container).
func caAddr(pod *corev1.Pod) string {
	addr := ""
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		for _, e := range c.Env {
			if c.Name == "istio-proxy" && e.Name == "CA_ADDR" {
				addr = e.Value
			}
		}
	}
	return addr
}

// TestDiscoveryAddress: with the webhook registered for a namespace (a
// real API server calls it), new pods there are pointed at the pushers of
// their namespace, whichever of Istio's injector and the webhook runs
// first; a pod's own discovery address and the rest of its ProxyConfig are
// kept; an annotation that is no ProxyConfig leaves the pod as it is; pods
// elsewhere are not touched.
func TestDiscoveryAddress(t *testing.T) {
	kc := kubetest.Get(t)
	ns, other := kc.Namespace(t, nil), kc.Namespace(t, nil)
	reg := prometheus.NewRegistry()
	w, err := inject.New("sp-xds-{namespace}.shardpilot.svc:15012", tu.Log(t), reg)
	if err != nil {
		t.Fatal(err)
	}
	url, root := serveTLS(t, w)
	register(t, kc, "m-shardpilot-"+ns, url, root, ns)
	want := "sp-xds-" + ns + ".shardpilot.svc:15012"
	// create makes a pod in ns (server-side dry run: every webhook runs,
	// nothing is stored) and returns it as the API server would store it.
	create := func(ns string, pod *corev1.Pod) *corev1.Pod {
		t.Helper()
		pod.GenerateName = "p-"
		pod.Spec.Containers = append([]corev1.Container{{Name: "app", Image: "app"}}, pod.Spec.Containers...)
		got, err := kc.Client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	tu.Eventually(t, 30*time.Second, "the API server calls the webhook", func() (bool, string) {
		got := create(ns, &corev1.Pod{}).Annotations[inject.ProxyConfigAnnotation]
		return got != "", got
	})
	proxyConfig := func(pod *corev1.Pod) map[string]any {
		var cfg map[string]any
		if err := json.Unmarshal([]byte(pod.Annotations[inject.ProxyConfigAnnotation]), &cfg); err != nil {
			t.Fatalf("the pod's ProxyConfig %q: %v", pod.Annotations[inject.ProxyConfigAnnotation], err)
		}
		return cfg
	}

	pod := create(ns, &corev1.Pod{})
	if got := fmt.Sprint(proxyConfig(pod)); got != fmt.Sprintf("map[discoveryAddress:%s proxyMetadata:map[CA_ADDR:%s]]", want, want) {
		t.Errorf("a new pod's ProxyConfig: %s, want the discovery and CA address %s", got, want)
	}
	own := create(ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		inject.ProxyConfigAnnotation: "concurrency: 2\nproxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"true\"\n"}}})
	if got := fmt.Sprint(proxyConfig(own)); got != fmt.Sprintf("map[concurrency:2 discoveryAddress:%s proxyMetadata:map[CA_ADDR:%s ISTIO_META_DNS_CAPTURE:true]]", want, want) {
		t.Errorf("a pod with a ProxyConfig of its own: %s, want it kept beside the addresses", got)
	}
	pinned := `{"discoveryAddress":"istiod.istio-system.svc:15012"}`
	if got := create(ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{inject.ProxyConfigAnnotation: pinned}}}); got.Annotations[inject.ProxyConfigAnnotation] != pinned {
		t.Errorf("a pod naming its discovery address: %q, want it kept", got.Annotations[inject.ProxyConfigAnnotation])
	}
	if got := create(ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{inject.ProxyConfigAnnotation: "{{{"}}}); got.Annotations[inject.ProxyConfigAnnotation] != "{{{" {
		t.Errorf("a pod whose annotation is no ProxyConfig: %q, want it admitted as it is", got.Annotations[inject.ProxyConfigAnnotation])
	}
	// Aliases could expand a few bytes into gigabytes: refused unread.
	aliased := "a: &x [1, 2]\nb: *x\n"
	if got := create(ns, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{inject.ProxyConfigAnnotation: aliased}}}); got.Annotations[inject.ProxyConfigAnnotation] != aliased {
		t.Errorf("a pod whose ProxyConfig holds aliases: %q, want it admitted as it is", got.Annotations[inject.ProxyConfigAnnotation])
	}
	if got := create(other, &corev1.Pod{}); got.Annotations[inject.ProxyConfigAnnotation] != "" {
		t.Errorf("a pod of a namespace the webhook is not registered for: %v", got.Annotations)
	}
	// Injected already (Istio's injector ran first), as a sidecar or as a
	// native sidecar: the agent's CA_ADDR is the pushers'.
	injected := create(ns, &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "istio-proxy", Image: "proxyv2",
		Env: []corev1.EnvVar{{Name: "CA_ADDR", Value: "istiod.istio-system.svc:15012"}, {Name: "ISTIO_META_MESH_ID", Value: "m"}}}}}})
	native := create(ns, &corev1.Pod{Spec: corev1.PodSpec{InitContainers: []corev1.Container{{Name: "istio-proxy", Image: "proxyv2"}}}})
	for name, p := range map[string]*corev1.Pod{"a sidecar": injected, "a native sidecar": native} {
		if got := caAddr(p); got != want {
			t.Errorf("%s injected before: CA_ADDR %q, want %q", name, got, want)
		}
	}
	if got := counted(t, reg, "unreadable"); got < 2 {
		t.Errorf("unreadable pods counted: %v, want 2", got)
	}

	// Istio's injector after the webhook (its configuration sorts after
	// this one's), then before it: either way the agent dials the pushers.
	for _, name := range []string{"z-istio-sidecar-injector-", "a-istio-sidecar-injector-"} {
		iurl, iroot := serveTLS(t, istioInjector(t))
		register(t, kc, name+ns, iurl, iroot, ns)
		tu.Eventually(t, 30*time.Second, "istio's injector ("+name+") and the webhook", func() (bool, string) {
			p := create(ns, &corev1.Pod{})
			return caAddr(p) == want && proxyConfig(p)["discoveryAddress"] == want, fmt.Sprintf("CA_ADDR %q, %v", caAddr(p), p.Annotations)
		})
		_ = kc.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), name+ns, metav1.DeleteOptions{})
	}
}

// counted is the webhook's count of one outcome.
func counted(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "shardpilot_inject_pods_total" && m.GetLabel()[0].GetValue() == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestBadRequests: what is no AdmissionReview is answered 400 with the
// reason; a review of anything but a pod's creation is allowed unchanged;
// an address that is no host:port is refused at the start.
func TestBadRequests(t *testing.T) {
	w, err := inject.New("sp-xds-{namespace}.shardpilot.svc:15012", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	post := func(method, body string) (int, string) {
		rec := httptest.NewRecorder()
		w.ServeHTTP(rec, httptest.NewRequest(method, inject.Path, strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	for _, c := range []struct {
		name, method, body string
		code               int
		want               string
	}{
		{"a GET", http.MethodGet, "", http.StatusMethodNotAllowed, "POST an AdmissionReview"},
		{"garbage", http.MethodPost, "\x00garbage", http.StatusBadRequest, "no AdmissionReview"},
		{"a review without a request", http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest, "no request in it"},
		{"too large", http.MethodPost, `{"x":"` + strings.Repeat("a", 5<<20) + `"}`, http.StatusBadRequest, "larger than"},
		{"a pod's update", http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"version":"v1","kind":"Pod"},"operation":"UPDATE","object":{}}}`,
			http.StatusOK, `"response":{"uid":"u1","allowed":true}`},
		{"a pod that is none", http.MethodPost, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u2","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","object":{"spec":7}}}`,
			http.StatusOK, `the pod cannot be read`},
	} {
		if code, body := post(c.method, c.body); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %.200s, want %d saying %q", c.name, code, body, c.code, c.want)
		}
	}
	// A namespace's Service name is cut to a DNS label, as the chart cuts it.
	long := strings.Repeat("n", 60)
	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u3","kind":{"version":"v1","kind":"Pod"},"operation":"CREATE","namespace":"` + long + `","object":{}}}`
	_, resp := post(http.MethodPost, body)
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal([]byte(resp), &review); err != nil || review.Response == nil {
		t.Fatalf("%s: %v", resp, err)
	}
	if want := "sp-xds-" + long[:56] + ".shardpilot.svc:15012"; !strings.Contains(string(review.Response.Patch), want) {
		t.Errorf("a pod of namespace %s: patch %s, want the address %s", long, review.Response.Patch, want)
	}
	for _, bad := range []string{"", "sp-xds-{namespace}", ":15012", "host:port", "host:70000"} {
		if _, err := inject.New(bad, nil, nil); err == nil || !strings.Contains(err.Error(), "discovery address") {
			t.Errorf("address %q: %v, want it refused", bad, err)
		}
	}
}
