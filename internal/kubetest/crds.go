package kubetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest/gatewayapi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// IstioKinds are the networking.istio.io kinds InstallIstioCRDs installs;
// SecurityKinds, the security.istio.io kinds; TelemetryKinds, the
// telemetry.istio.io kinds.
var (
	IstioKinds     = []string{"ServiceEntry", "WorkloadEntry", "VirtualService", "DestinationRule", "Sidecar", "Gateway", "EnvoyFilter", "WorkloadGroup"}
	SecurityKinds  = []string{"AuthorizationPolicy", "PeerAuthentication", "RequestAuthentication"}
	TelemetryKinds = []string{"Telemetry"}
)

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

// CRDFiles hold the Istio CRDs the chart ships, by group, relative to the
// repository root: the tests install the same files.
var CRDFiles = map[string]string{
	"networking.istio.io": "deploy/helm/shardpilot/crds/istio-networking.yaml",
	"security.istio.io":   "deploy/helm/shardpilot/crds/istio-security.yaml",
	"telemetry.istio.io":  "deploy/helm/shardpilot/crds/istio-telemetry.yaml",
}

func (c *Cluster) installIstioCRDs() error {
	ctx := context.Background()
	root, err := repoRoot()
	if err != nil {
		return err
	}
	type served struct{ groupVersion, plural string }
	var wait []served
	for group, file := range CRDFiles {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			return fmt.Errorf("kubetest: %w", err)
		}
		crds, err := Decode(data)
		if err != nil {
			return fmt.Errorf("kubetest: %s: %w", file, err)
		}
		if want := kindsOf(group); len(crds) != len(want) {
			return fmt.Errorf("kubetest: %s holds %d CRDs, want one per kind of %v", file, len(crds), want)
		}
		for _, crd := range crds {
			if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("kubetest: create CRD %s: %w", crd.GetName(), err)
			}
			plural, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "plural")
			versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
			for _, v := range versions {
				if name, _, _ := unstructured.NestedString(v.(map[string]any), "name"); name != "" {
					wait = append(wait, served{group + "/" + name, plural})
				}
			}
		}
	}
	// The first create after a CRD install can take a few seconds: wait
	// until every kind is listed by discovery in every version.
	deadline := time.Now().Add(60 * time.Second)
	for _, w := range wait {
		for !c.serves(w.groupVersion, w.plural) {
			if time.Now().After(deadline) {
				return fmt.Errorf("kubetest: Istio's %s not served at %s within 60s", w.plural, w.groupVersion)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func kindsOf(group string) []string {
	switch group {
	case "security.istio.io":
		return SecurityKinds
	case "telemetry.istio.io":
		return TelemetryKinds
	}
	return IstioKinds
}

// GatewayAPICRDs is the file of Gateway API CRDs the chart ships (make
// gateway-api-crds), relative to the repository root.
const GatewayAPICRDs = "deploy/helm/shardpilot/crds/gateway-api.yaml"

var (
	gatewayOnce sync.Once
	gatewayErr  error
)

// InstallGatewayAPICRDs installs the Gateway API CRDs the chart ships once
// per test process and waits until they serve.
func (c *Cluster) InstallGatewayAPICRDs(t testing.TB) {
	t.Helper()
	gatewayOnce.Do(func() { gatewayErr = c.installGatewayAPICRDs() })
	if gatewayErr != nil {
		t.Fatal(gatewayErr)
	}
}

func (c *Cluster) installGatewayAPICRDs() error {
	ctx := context.Background()
	root, err := repoRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, GatewayAPICRDs))
	if err != nil {
		return fmt.Errorf("kubetest: %w", err)
	}
	crds, err := Decode(data)
	if err != nil {
		return fmt.Errorf("kubetest: %s: %w", GatewayAPICRDs, err)
	}
	for _, crd := range crds {
		if _, err := c.Dynamic.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("kubetest: create CRD %s: %w", crd.GetName(), err)
		}
	}
	// Wait until each kind read is listed by discovery in the version read.
	deadline := time.Now().Add(60 * time.Second)
	for _, r := range gatewayapi.Resources {
		for !c.serves(gatewayapi.Group+"/"+r.Version, r.Resource) {
			if time.Now().After(deadline) {
				return fmt.Errorf("kubetest: Gateway API %s not served within 60s", r.Resource)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

func (c *Cluster) serves(groupVersion, resource string) bool {
	list, err := c.Client.Discovery().ServerResourcesForGroupVersion(groupVersion)
	if err != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true
		}
	}
	return false
}
