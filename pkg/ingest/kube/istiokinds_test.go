package kube_test

import (
	"testing"

	"github.com/shardpilot/shardpilot/internal/kubetest"
)

// applyIstioKinds applies one object of each Istio kind the source reads.
func applyIstioKinds(t *testing.T, kc *kubetest.Cluster, ns string) {
	t.Helper()
	apply(t, kc, istioObject("ServiceEntry", "v1beta1", ns, "payments", map[string]any{
		"hosts": []any{"payments.example.com"}, "resolution": "STATIC",
		"ports":     []any{map[string]any{"number": 443, "name": "https", "protocol": "HTTPS"}},
		"endpoints": []any{map[string]any{"address": "10.2.0.1"}},
	}))
	apply(t, kc, istioObject("VirtualService", "v1alpha3", ns, "reviews", map[string]any{
		"hosts": []any{"reviews"},
		"http":  []any{map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": "reviews", "subset": "v1"}}}}},
	}))
	apply(t, kc, istioObject("DestinationRule", "v1", ns, "reviews", map[string]any{
		"host": "reviews", "subsets": []any{map[string]any{"name": "v1", "labels": map[string]any{"version": "v1"}}},
	}))
	apply(t, kc, istioObject("Sidecar", "v1", ns, "default", map[string]any{
		"egress": []any{map[string]any{"hosts": []any{"./*"}}},
	}))
	apply(t, kc, istioObject("Telemetry", "v1", ns, "logs", map[string]any{
		"accessLogging": []any{map[string]any{"providers": []any{map[string]any{"name": "envoy"}}}},
	}))
	apply(t, kc, istioObject("EnvoyFilter", "v1alpha3", ns, "timeouts", map[string]any{
		"configPatches": []any{map[string]any{"applyTo": "CLUSTER", "match": map[string]any{"cluster": map[string]any{"service": "reviews"}},
			"patch": map[string]any{"operation": "MERGE", "value": map[string]any{"connect_timeout": "2s"}}}},
	}))
	apply(t, kc, istioObject("WorkloadEntry", "v1", ns, "vm-1", map[string]any{
		"address": "10.4.0.1", "labels": map[string]any{"app": "vm"}, "locality": "us-west1/us-west1-a",
	}))
	apply(t, kc, istioObject("ServiceEntry", "v1", ns, "vms", map[string]any{
		"hosts": []any{"vms.internal"}, "resolution": "STATIC",
		"ports":            []any{map[string]any{"number": 80, "name": "http", "protocol": "HTTP"}},
		"workloadSelector": map[string]any{"labels": map[string]any{"app": "vm"}},
	}))
	apply(t, kc, istioObject("Gateway", "v1", ns, "ingress", map[string]any{
		"selector": map[string]any{"istio": "ingressgateway"},
		"servers":  []any{map[string]any{"port": map[string]any{"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": []any{"*/reviews.example.com"}}},
	}))
}
