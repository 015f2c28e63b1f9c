package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// Decode splits multi-document YAML into objects; empty documents (a
// template that rendered nothing) are skipped.
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []*unstructured.Unstructured
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Apply applies objects to the apiserver by server-side apply, in order,
// as a dry run (validated and admitted, not stored) when dryRun; an
// object without a namespace that needs one gets ns.
func (c *Cluster) Apply(ctx context.Context, objs []*unstructured.Unstructured, ns string, dryRun bool) error {
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	opts := metav1.PatchOptions{FieldManager: "shardpilot-tests", Force: new(true)}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
		body, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		res := c.Dynamic.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			namespace := o.GetNamespace()
			if namespace == "" {
				namespace = ns
			}
			_, err = res.Namespace(namespace).Patch(ctx, o.GetName(), types.ApplyPatchType, body, opts)
		} else {
			_, err = res.Patch(ctx, o.GetName(), types.ApplyPatchType, body, opts)
		}
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
		}
	}
	return nil
}
