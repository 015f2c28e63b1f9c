package kubetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// IstioKinds are the networking.istio.io kinds InstallIstioCRDs installs.
var IstioKinds = []string{"ServiceEntry", "WorkloadEntry", "VirtualService", "DestinationRule", "Sidecar", "Gateway"}

var (
	crdOnce sync.Once
	crdErr  error
)

// InstallIstioCRDs installs Istio's networking CRDs (v1alpha3, v1beta1 and
// v1 served, v1 stored, schemas open as in a minimal Istio install) once per
// test process and waits until they serve.
func (c *Cluster) InstallIstioCRDs(t testing.TB) {
	t.Helper()
	crdOnce.Do(func() { crdErr = c.installIstioCRDs() })
	if crdErr != nil {
		t.Fatal(crdErr)
	}
}

func (c *Cluster) installIstioCRDs() error {
	ctx := context.Background()
	for _, kind := range IstioKinds {
		plural := strings.ToLower(kind) + "s"
		if kind == "ServiceEntry" || kind == "WorkloadEntry" {
			plural = strings.ToLower(strings.TrimSuffix(kind, "y")) + "ies"
		}
		var versions []any
		for _, v := range []string{"v1alpha3", "v1beta1", "v1"} {
			versions = append(versions, map[string]any{
				"name": v, "served": true, "storage": v == "v1",
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object", "x-kubernetes-preserve-unknown-fields": true,
				}},
				"subresources": map[string]any{"status": map[string]any{}},
			})
		}
		crd := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "apiextensions.k8s.io/v1",
			"kind":       "CustomResourceDefinition",
			"metadata":   map[string]any{"name": plural + ".networking.istio.io"},
			"spec": map[string]any{
				"group":    "networking.istio.io",
				"scope":    "Namespaced",
				"names":    map[string]any{"kind": kind, "plural": plural, "singular": strings.ToLower(kind), "listKind": kind + "List"},
				"versions": versions,
			},
		}}
		if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kubetest: create CRD %s: %w", kind, err)
		}
	}
	// The first create after a CRD install can take a few seconds: wait
	// until every kind is listed by discovery and can be listed.
	deadline := time.Now().Add(60 * time.Second)
	for {
		list, err := c.Client.Discovery().ServerResourcesForGroupVersion("networking.istio.io/v1")
		if err == nil && len(list.APIResources) >= 2*len(IstioKinds) { // each kind and its status
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kubetest: Istio CRDs not served within 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}
