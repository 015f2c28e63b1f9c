// Package inject is a mutating admission webhook that points the Istio
// agents of new pods at their namespace's pushers. Istio's sidecar
// injector stays; this webhook sets what it and the agent read:
//
//   - discoveryAddress in the pod's proxy.istio.io/config annotation
//     (ProxyConfig, YAML or JSON): the injector renders it into the
//     agent's PROXY_CONFIG, and the agent reads the annotation again at
//     start, over PROXY_CONFIG;
//   - the CA address, which the injector sets as the istio-proxy
//     container's CA_ADDR (istiod's by default) before the annotation's
//     proxyMetadata: as proxyMetadata.CA_ADDR for an injector that runs
//     after this webhook, and directly in CA_ADDR of an istio-proxy
//     container that is already there (the webhook is configured to be
//     called again after later webhooks changed the pod).
//
// A pod whose annotation already names a discovery address keeps it (the
// operator's choice for that workload). A pod the webhook cannot read is
// admitted unchanged with a warning: pods are never refused.
package inject

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	yamlv3 "go.yaml.in/yaml/v3"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// ProxyConfigAnnotation is the pod annotation Istio's injector and agent
// read a pod's ProxyConfig from.
const ProxyConfigAnnotation = "proxy.istio.io/config"

// The istio-proxy container's variable for the CA's address, and the name
// of the container (a sidecar, or a native sidecar among the init
// containers).
const (
	caAddressEnv = "CA_ADDR"
	proxyName    = "istio-proxy"
)

// maxReview is the largest AdmissionReview read: the API server's own
// request limit (3 MiB) with room for the review around the object.
const maxReview = 4 << 20

// Webhook answers AdmissionReviews (admission.k8s.io/v1) for pods.
type Webhook struct {
	address  string // with {namespace}
	log      *slog.Logger
	outcomes *prometheus.CounterVec
}

// New returns a webhook setting the discovery and CA address address, in
// which {namespace} stands for the pod's namespace (for a namespace's
// Service of its shard: "shardpilot-xds-{namespace}.shardpilot.svc:15012";
// see addressOf).
// Its outcomes are counted on reg, when given.
func New(address string, log *slog.Logger, reg prometheus.Registerer) (*Webhook, error) {
	host, port, err := net.SplitHostPort(strings.ReplaceAll(address, "{namespace}", "ns"))
	if err != nil || host == "" {
		return nil, fmt.Errorf("discovery address %q: want <host>:<port>, {namespace} standing for the pod's namespace", address)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("discovery address %q: port %q is not a port number", address, port)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Webhook{address: address, log: log, outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shardpilot_inject_pods_total",
		Help: "Pods the discovery-address webhook answered for, by outcome: set (pointed at the pushers), kept (the pod names its own discovery address), unreadable (admitted unchanged), ignored (not a pod's creation).",
	}, []string{"outcome"})}
	for _, o := range []string{"set", "kept", "unreadable", "ignored"} {
		w.outcomes.WithLabelValues(o)
	}
	if reg != nil {
		if err := reg.Register(w.outcomes); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// ServeHTTP answers one AdmissionReview. A request that is no review is
// answered 400 with the reason; a review is always answered allowed.
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview (admission.k8s.io/v1)", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxReview+1))
	if err == nil && len(body) > maxReview {
		err = fmt.Errorf("larger than %d bytes", maxReview)
	}
	var review admissionv1.AdmissionReview
	if err == nil {
		err = json.Unmarshal(body, &review)
	}
	if err == nil && review.Request == nil {
		err = errors.New("no request in it")
	}
	if err != nil {
		w.log.Warn("refused a request that is no AdmissionReview", "from", r.RemoteAddr, "err", err)
		http.Error(rw, "the body is no AdmissionReview (admission.k8s.io/v1): "+err.Error(), http.StatusBadRequest)
		return
	}
	resp := w.review(review.Request)
	resp.UID = review.Request.UID
	out, err := json.Marshal(admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp})
	if err != nil {
		http.Error(rw, err.Error(), http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	_, _ = rw.Write(out)
}

// review answers a request: allowed, with a JSON patch when the pod is
// pointed at the pushers.
func (w *Webhook) review(req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allowed := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind.Kind != "Pod" || req.Kind.Group != "" || req.Operation != admissionv1.Create || req.SubResource != "" {
		w.outcomes.WithLabelValues("ignored").Inc()
		return allowed
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return w.unreadable(allowed, req, fmt.Errorf("the pod cannot be read: %w", err))
	}
	ns := req.Namespace
	if ns == "" {
		ns = pod.Namespace
	}
	address := w.addressOf(ns)
	patch, kept, err := pointAt(&pod, address)
	if err != nil {
		return w.unreadable(allowed, req, err)
	}
	if kept {
		w.outcomes.WithLabelValues("kept").Inc()
		return allowed
	}
	raw, err := json.Marshal(patch)
	if err != nil {
		return w.unreadable(allowed, req, err)
	}
	w.outcomes.WithLabelValues("set").Inc()
	w.log.Debug("pointed a pod at the pushers", "namespace", ns, "pod", podName(req, &pod), "address", address)
	pt := admissionv1.PatchTypeJSONPatch
	allowed.Patch, allowed.PatchType = raw, &pt
	return allowed
}

// addressOf is the discovery address of namespace ns's pods. Each DNS
// label of its host is cut to 63 characters, and a "-" it then ends with
// is dropped, as the chart names a namespace's Service.
func (w *Webhook) addressOf(ns string) string {
	host, port, _ := net.SplitHostPort(strings.ReplaceAll(w.address, "{namespace}", ns))
	labels := strings.Split(host, ".")
	for i, l := range labels {
		if len(l) > 63 {
			labels[i] = strings.TrimSuffix(l[:63], "-")
		}
	}
	return net.JoinHostPort(strings.Join(labels, "."), port)
}

// unreadable admits the pod unchanged, saying why in a warning the client
// sees and in the log.
func (w *Webhook) unreadable(allowed *admissionv1.AdmissionResponse, req *admissionv1.AdmissionRequest, err error) *admissionv1.AdmissionResponse {
	w.outcomes.WithLabelValues("unreadable").Inc()
	w.log.Warn("admitted a pod without pointing it at the pushers", "namespace", req.Namespace, "name", req.Name, "err", err)
	allowed.Warnings = []string{"shardpilot: the pod keeps its discovery address: " + err.Error()}
	return allowed
}

func podName(req *admissionv1.AdmissionRequest, pod *corev1.Pod) string {
	switch {
	case req.Name != "":
		return req.Name
	case pod.Name != "":
		return pod.Name
	}
	return pod.GenerateName + "*"
}

// op is one JSON patch operation (RFC 6902).
type op struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// aliasedAt returns the line of the first anchor or alias of a YAML text
// (0 when there is none, or when it does not parse: the decoder says why).
func aliasedAt(text string) int {
	var node yamlv3.Node
	if err := yamlv3.Unmarshal([]byte(text), &node); err != nil {
		return 0
	}
	return istio.Aliased(&node)
}

// pointAt returns the patch pointing pod's agent at address for discovery
// and certificates; kept is true when the pod names its own discovery
// address.
func pointAt(pod *corev1.Pod, address string) (patch []op, kept bool, err error) {
	cfg := map[string]any{}
	if v, ok := pod.Annotations[ProxyConfigAnnotation]; ok {
		if line := aliasedAt(v); line > 0 {
			return nil, false, fmt.Errorf("annotation %s: line %d: anchors and aliases are not accepted (a few bytes of them can expand into gigabytes)", ProxyConfigAnnotation, line)
		}
		if err := yaml.Unmarshal([]byte(v), &cfg); err != nil {
			return nil, false, fmt.Errorf("annotation %s is not a ProxyConfig in YAML or JSON: %w", ProxyConfigAnnotation, err)
		}
		if cfg == nil {
			cfg = map[string]any{}
		}
	}
	if v, ok := cfg["discoveryAddress"]; ok && v != address {
		return nil, true, nil
	}
	cfg["discoveryAddress"] = address
	meta, ok := cfg["proxyMetadata"].(map[string]any)
	if !ok {
		if cfg["proxyMetadata"] != nil {
			return nil, false, fmt.Errorf("annotation %s: proxyMetadata is not a map", ProxyConfigAnnotation)
		}
		meta = map[string]any{}
		cfg["proxyMetadata"] = meta
	}
	ca := address
	if v, ok := meta[caAddressEnv]; ok {
		if ca, ok = v.(string); !ok {
			return nil, false, fmt.Errorf("annotation %s: proxyMetadata.%s is not a string", ProxyConfigAnnotation, caAddressEnv)
		}
	}
	meta[caAddressEnv] = ca
	value, err := json.Marshal(cfg)
	if err != nil {
		return nil, false, err
	}
	if pod.Annotations == nil {
		patch = append(patch, op{"add", "/metadata/annotations", map[string]string{ProxyConfigAnnotation: string(value)}})
	} else {
		patch = append(patch, op{"add", "/metadata/annotations/" + escape(ProxyConfigAnnotation), string(value)})
	}
	patch = append(patch, caEnv("/spec/initContainers", pod.Spec.InitContainers, ca)...)
	patch = append(patch, caEnv("/spec/containers", pod.Spec.Containers, ca)...)
	return patch, false, nil
}

// caEnv sets CA_ADDR of an istio-proxy container among containers (at
// path), which Istio's injector has already added.
func caEnv(path string, containers []corev1.Container, ca string) []op {
	var patch []op
	for i, c := range containers {
		if c.Name != proxyName {
			continue
		}
		at := fmt.Sprintf("%s/%d/env", path, i)
		if c.Env == nil {
			return append(patch, op{"add", at, []corev1.EnvVar{{Name: caAddressEnv, Value: ca}}})
		}
		found := false
		for j, e := range c.Env {
			if e.Name == caAddressEnv {
				patch, found = append(patch, op{"replace", fmt.Sprintf("%s/%d", at, j), corev1.EnvVar{Name: caAddressEnv, Value: ca}}), true
			}
		}
		if !found {
			patch = append(patch, op{"add", at + "/-", corev1.EnvVar{Name: caAddressEnv, Value: ca}})
		}
	}
	return patch
}

// escape escapes a JSON pointer's reference token (RFC 6901).
func escape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

// Path is where the webhook answers.
const Path = "/inject"

// Serve answers the API server's AdmissionReviews at Path over TLS (tc)
// on lis until ctx ends.
func (w *Webhook) Serve(ctx context.Context, lis net.Listener, tc *tls.Config) error {
	mux := http.NewServeMux()
	mux.Handle(Path, w)
	srv := &http.Server{Handler: mux, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(w.log.Handler(), slog.LevelDebug)}
	done := make(chan error, 1)
	go func() { done <- srv.ServeTLS(lis, "", "") }()
	select {
	case err := <-done:
		return fmt.Errorf("inject: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-done
	return err
}
