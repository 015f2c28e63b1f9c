package main

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/version"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// foundInKubernetes: the pushers found as pods of a namespace of a real
// kube-apiserver, by label, answer proxy-status -n as those found in
// etcd do. The test apiserver has no kubelet, so the pods are objects
// whose status this test writes (ready, their IP the pushers' loopback)
// and are reached at their IPs (--kube-reach pod-ip, shardctl run in the
// cluster); a port-forward, which needs a kubelet, is refused with the
// API server's reason.
func (f *twoPushers) foundInKubernetes(t *testing.T) {
	kc := kubetest.Get(t)
	ns := kc.Namespace(t, nil)
	ctx := context.Background()
	for _, p := range []struct {
		name string
		proc *process
	}{{"sp-pusher-a", f.a}, {"sp-pusher-b", f.b}, {"sp-pusher-starting", f.a}, {"other-release", f.a}} {
		_, port, _ := strings.Cut(p.proc.admin, ":")
		instance := "sp"
		if p.name == "other-release" {
			instance = "other"
		}
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: p.name, Labels: map[string]string{"app.kubernetes.io/name": "shardpilot",
				"app.kubernetes.io/instance": instance, "app.kubernetes.io/component": "pusher"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "pusher", Image: "shardpilot",
				Ports: []corev1.ContainerPort{{Name: "http-admin", ContainerPort: int32(mustAtoi(t, port))}}}}},
		}
		created, err := kc.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ready := corev1.ConditionTrue
		if p.name == "sp-pusher-starting" {
			ready = corev1.ConditionFalse
		}
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1",
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}
		if _, err := kc.Client.CoreV1().Pods(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kc.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	kube := []string{"--kubeconfig", kubeconfig, "--kube-namespace", ns, "--kube-selector", "app.kubernetes.io/instance=sp"}
	out, errOut, err := shardctl("http://127.0.0.1:1", append(kube, "--kube-reach", "pod-ip", "proxy-status", "-n", "demo")...)
	if err != nil {
		t.Fatalf("proxy-status through Kubernetes: %v\n%s", err, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.Contains(out, "sp-pusher-a") || !strings.Contains(out, "sp-pusher-b") {
		t.Errorf("proxy-status through Kubernetes, want the 4 proxies on sp-pusher-a and sp-pusher-b:\n%s", out)
	}
	out, _, err = shardctl("http://127.0.0.1:1", append(kube, "--kube-reach", "pod-ip", "members")...)
	if err != nil || strings.Contains(out, "starting") || strings.Contains(out, "other-release") || strings.Count(out, "shardpilot "+version.Release) != 2 {
		t.Errorf("members through Kubernetes (the pod not ready and the other release's left out, each one's version): %v\n%s", err, out)
	}
	// Pods announce no version: their metrics say it.
	out, _, err = shardctl("http://127.0.0.1:1", append(kube, "--kube-reach", "pod-ip", "version")...)
	if want := "shardpilot " + version.Release + " (revision "; err != nil || strings.Count(out, want) != 3 || strings.Contains(out, "(unknown)") {
		t.Errorf("version through Kubernetes: %v, want the client's and two pushers' versions\n%s", err, out)
	}
	if _, _, err := shardctl("http://127.0.0.1:1", append(kube, "proxy-status")...); err == nil || !strings.Contains(err.Error(), "port-forward") {
		t.Errorf("a port-forward without a kubelet: %v, want its failure named", err)
	}
	if _, _, err := shardctl("http://127.0.0.1:1", "--kubeconfig", kubeconfig, "--kube-namespace", "nowhere", "--kube-reach", "pod-ip", "proxy-status"); err == nil ||
		!strings.Contains(err.Error(), `no ready pusher pod in namespace "nowhere"`) {
		t.Errorf("a namespace without pushers: %v", err)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
