package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/loadtest/meshgen"
)

// kubeSink writes the mesh through the Kubernetes API, as Istio custom
// resources, with server-side apply.
type kubeSink struct {
	dyn dynamic.Interface
}

var istioResources = map[string]string{"ServiceEntry": "serviceentries", "VirtualService": "virtualservices"}

func gvr(kind string) (schema.GroupVersionResource, error) {
	plural, ok := istioResources[kind]
	if !ok {
		return schema.GroupVersionResource{}, fmt.Errorf("kube sink: unexpected kind %q", kind)
	}
	return schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: plural}, nil
}

// Put applies every document of a file.
func (k kubeSink) Put(name string, docs []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	force := true
	for _, doc := range bytes.Split(docs, []byte("\n---\n")) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return fmt.Errorf("kube sink: %s: %w", name, err)
		}
		u := unstructured.Unstructured{Object: obj}
		res, err := gvr(u.GetKind())
		if err != nil {
			return err
		}
		data, err := json.Marshal(obj)
		if err != nil {
			return err
		}
		if _, err := k.dyn.Resource(res).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.ApplyPatchType, data,
			metav1.PatchOptions{FieldManager: "shardpilot-loadtest", Force: &force}); err != nil {
			return fmt.Errorf("kube sink: apply %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

// Delete deletes a dynamic service (which has no route).
func (k kubeSink) Delete(namespace, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for kind := range istioResources {
		res, _ := gvr(kind)
		if err := k.dyn.Resource(res).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("kube sink: delete %s %s/%s: %w", kind, namespace, name, err)
		}
	}
	return nil
}

// startKube starts a kube-apiserver (built once by hack/kube-binaries.sh)
// with Istio's CRDs and the mesh's namespaces, and writes its kubeconfig.
func startKube(work string, spec meshgen.Spec) (*kubetest.Cluster, string, error) {
	c, err := kubetest.Start()
	if err != nil {
		return nil, "", fmt.Errorf("kube-apiserver: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := spec.Validate(); err != nil {
		c.Stop()
		return nil, "", err
	}
	for _, ns := range spec.AllNamespaces() {
		if _, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			c.Stop()
			return nil, "", fmt.Errorf("create namespace %s: %w", ns, err)
		}
	}
	kubeconfig := filepath.Join(work, "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig); err != nil {
		c.Stop()
		return nil, "", err
	}
	return c, kubeconfig, nil
}
