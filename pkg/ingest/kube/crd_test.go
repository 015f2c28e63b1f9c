package kube_test

import (
	"context"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCRDsRefuseMisspelledFields: the chart's CRDs, whose schemas come
// from the ingester's decoder types, make the real API server refuse a
// misspelled field under strict field validation (kubectl apply's
// default), and take what the ingester reads, of every version served.
func TestCRDsRefuseMisspelledFields(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	strict := metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict, DryRun: []string{metav1.DryRunAll}}
	create := func(kind, version, name string, spec map[string]any) error {
		u := istioObject(kind, version, ns, name, spec)
		g := gvr(kind)
		g.Version = version
		_, err := kc.Dynamic.Resource(g).Namespace(ns).Create(context.Background(), u, strict)
		return err
	}
	route := map[string]any{"route": []any{map[string]any{"destination": map[string]any{"host": "reviews", "subset": "v1"}, "weight": int64(100)}},
		"timeout": "2s", "retries": map[string]any{"attempts": int64(3)}}
	for _, version := range []string{"v1alpha3", "v1beta1", "v1"} {
		if err := create("VirtualService", version, "good-"+version, map[string]any{"hosts": []any{"reviews"}, "http": []any{route}}); err != nil {
			t.Errorf("a valid VirtualService %s: %v", version, err)
		}
	}
	for name, c := range map[string]struct {
		kind, version string
		spec          map[string]any
		field         string
	}{
		"a misspelled route field": {"VirtualService", "v1", map[string]any{"hosts": []any{"reviews"}, "htpp": []any{route}}, "spec.htpp"},
		"a misspelled nested field": {"DestinationRule", "v1", map[string]any{"host": "reviews",
			"subsets": []any{map[string]any{"name": "v1", "lables": map[string]any{"version": "v1"}}}}, "spec.subsets[0].lables"},
		"a misspelled policy field": {"AuthorizationPolicy", "v1", map[string]any{"rules": []any{map[string]any{
			"from": []any{map[string]any{"source": map[string]any{"namepsaces": []any{"a"}}}}}}}, "spec.rules[0].from[0].source.namepsaces"},
		"a negative port": {"ServiceEntry", "v1", map[string]any{"hosts": []any{"a.example.com"},
			"ports": []any{map[string]any{"number": int64(-1), "name": "http", "protocol": "HTTP"}}}, "spec.ports[0].number"},
	} {
		err := create(c.kind, c.version, "bad", c.spec)
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want refused naming %s", name, err, c.field)
		}
	}
}
