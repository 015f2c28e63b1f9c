package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/shardpilot/shardpilot/internal/kubetest"
)

// istiodMesh is the MeshConfig istiod runs with: Istio's defaults, in the
// namespace it runs in.
const istiodMesh = "rootNamespace: istio-system\ntrustDomain: cluster.local\n"

// startIstiod runs Istio's pilot-discovery from dir (hack/istio-binaries.sh)
// against the apiserver of kc, serving plaintext ADS, and returns it once
// it says it is ready. Its profiles (/debug/pprof) are on its HTTP port.
func startIstiod(ctx context.Context, sc Scenario, name, dir, work string, kc *kubetest.Cluster, kubeconfig string) (*proc, error) {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := kc.Client.CoreV1().Namespaces().Create(cctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "istio-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("istiod: create its namespace: %w", err)
	}
	mesh := filepath.Join(work, "istiod-mesh.yaml")
	if err := os.WriteFile(mesh, []byte(istiodMesh), 0o644); err != nil {
		return nil, err
	}
	var addrs [5]string
	for i := range addrs {
		a, err := freeAddr()
		if err != nil {
			return nil, err
		}
		addrs[i] = a
	}
	ads, httpAddr := addrs[0], addrs[1]
	p, err := startWith([]string{"POD_NAMESPACE=istio-system", "REVISION=default", "PILOT_ENABLE_ANALYSIS=false", "POD_NAME=istiod-0",
		// Accept streams unthrottled, as the pushers do by default.
		"PILOT_MAX_REQUESTS_PER_SECOND=100000"},
		sc.out, name, filepath.Join(dir, "pilot-discovery"), "discovery", "--kubeconfig", kubeconfig, "--meshConfig", mesh,
		"--networksConfig", filepath.Join(work, "none"), "--grpcAddr", ads, "--httpAddr", httpAddr, "--httpsAddr", addrs[2],
		"--monitoringAddr", addrs[3], "--secureGRPCAddr", addrs[4], "--domain", "cluster.local", "--log_output_level", "default:warn")
	if err != nil {
		return nil, err
	}
	p.ads, p.heap = ads, httpAddr
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if httpOK("http://" + httpAddr + "/ready") {
			return p, nil
		}
	}
	p.stop()
	return nil, fmt.Errorf("istiod was not ready within 2 minutes (its log: %s)", p.log.Name())
}
