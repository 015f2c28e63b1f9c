package kube_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/store"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestRootCertConfigMaps: the roots the pushers publish reach every
// namespace of the mesh as Istio's istio-ca-root-cert ConfigMap, as
// istiod writes it: in namespaces that exist and in new ones, again when
// the roots change, put back when edited or deleted; not in a namespace
// outside the mesh.
func TestRootCertConfigMaps(t *testing.T) {
	kc := kubetest.Get(t)
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	mesh := map[string]string{"rootcert-test": fmt.Sprint(time.Now().UnixNano())}
	first := kc.Namespace(t, mesh)
	outside := kc.Namespace(t, nil)
	if _, err := cli.Put(ctx, store.TrustKey, "root one\n"); err != nil {
		t.Fatal(err)
	}
	r := &kube.RootCerts{Client: kc.Client, Store: store.New(cli), NamespaceSelector: labels.SelectorFromSet(mesh), Log: testutil.Log(t)}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("publisher: %v", err)
		}
	})
	holds := func(ns, want string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, ns+" holds the roots", func() (bool, string) {
			cm, err := kc.Client.CoreV1().ConfigMaps(ns).Get(ctx, kube.RootCertConfigMap, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return cm.Data[kube.RootCertKey] == want && len(cm.Data) == 1, fmt.Sprint(cm.Data)
		})
	}
	holds(first, "root one\n")
	second := kc.Namespace(t, mesh)
	holds(second, "root one\n")

	if _, err := cli.Put(ctx, store.TrustKey, "root one\nroot two\n"); err != nil {
		t.Fatal(err)
	}
	holds(first, "root one\nroot two\n")
	holds(second, "root one\nroot two\n")

	cms := kc.Client.CoreV1().ConfigMaps(first)
	cm, err := cms.Get(ctx, kube.RootCertConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data = map[string]string{kube.RootCertKey: "forged", "extra": "x"}
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	holds(first, "root one\nroot two\n")
	if err := cms.Delete(ctx, kube.RootCertConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	holds(first, "root one\nroot two\n")

	if _, err := kc.Client.CoreV1().ConfigMaps(outside).Get(ctx, kube.RootCertConfigMap, metav1.GetOptions{}); err == nil {
		t.Errorf("%s, outside the mesh, got the roots", outside)
	}
}
