package deploy_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// quickstart returns the commands of the chart README's first section.
func quickstart(t *testing.T) []string {
	t.Helper()
	cmds, err := kubetest.Quickstart(filepath.Join("helm", "shardpilot", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	return cmds
}

// TestChartQuickstart runs the chart README's quickstart as far as a
// kube-apiserver without nodes allows: the image it builds and pushes is
// the Makefile's target and archive and the chart's appVersion, the install
// is run as a server-side dry run (every object admitted), the Deployment
// it waits for exists, and shardctl takes the arguments it is given.
// make e2e-cluster runs the same commands on a node.
func TestChartQuickstart(t *testing.T) {
	h := helm(t)
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kc.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile(filepath.Join("..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if b, err := os.ReadFile(filepath.Join("helm", "shardpilot", "Chart.yaml")); err != nil || yaml.Unmarshal(b, &chart) != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	var image string
	var objs []*unstructured.Unstructured
	for _, cmd := range quickstart(t) {
		args := strings.Fields(strings.TrimSuffix(cmd, " &"))
		switch {
		case strings.HasPrefix(cmd, "make image IMAGE="):
			image = strings.TrimPrefix(args[2], "IMAGE=")
			if !strings.Contains(string(makefile), "\nimage:") || !strings.Contains(string(makefile), "hack/image.sh $(IMAGE) $(BIN)/image.tar") {
				t.Errorf("%s: the Makefile builds no $(IMAGE) into .bin/image.tar", cmd)
			}
			if !strings.HasSuffix(image, ":"+chart.AppVersion) {
				t.Errorf("%s: the image is not tagged with the chart's appVersion %s", cmd, chart.AppVersion)
			}
		case strings.HasPrefix(cmd, "crane push "):
			if len(args) != 4 || args[2] != ".bin/image.tar" || args[3] != image {
				t.Errorf("%s: pushes another archive or image than the one built (.bin/image.tar, %s)", cmd, image)
			}
		case strings.HasPrefix(cmd, "helm install "):
			objs = quickstartInstall(t, kc, h, kubeconfig, args, image)
		case strings.HasPrefix(cmd, "kubectl "):
			quickstartKubectl(t, cmd, args, objs)
		case strings.HasPrefix(cmd, "go run ./cmd/shardctl "):
			// No pod runs on a cluster without nodes: shardctl must fail
			// finding the pushers, not on its arguments.
			c := exec.Command("go", args[1:]...)
			c.Dir = ".."
			c.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
			out, _ := c.CombinedOutput()
			if strings.Contains(string(out), "flag provided but not defined") || strings.Contains(string(out), "unknown command") || !strings.Contains(string(out), "shardpilot") {
				t.Errorf("%s: %s", cmd, out)
			}
		default:
			t.Errorf("the quickstart runs %q, which this test does not check", cmd)
		}
	}
	if objs == nil {
		t.Error("the quickstart installs nothing")
	}
}

// quickstartInstall runs the quickstart's helm install as a server-side
// dry run, in its namespace made beforehand, and returns its objects.
func quickstartInstall(t *testing.T, kc *kubetest.Cluster, h, kubeconfig string, args []string, image string) []*unstructured.Unstructured {
	t.Helper()
	i := slices.Index(args, "-n")
	if i < 0 {
		t.Fatalf("%s: names no namespace", strings.Join(args, " "))
	}
	ns := args[i+1]
	_, err := kc.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// From the repository's root, as the README says.
	c := exec.Command(h, append(args[1:], "--dry-run=server", "--kubeconfig", kubeconfig)...)
	c.Dir = ".."
	b, err := c.CombinedOutput()
	out := string(b)
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	manifest, _, _ := strings.Cut(out, "NOTES:")
	_, manifest, _ = strings.Cut(manifest, "MANIFEST:")
	objs, err := kubetest.Decode([]byte(manifest))
	if err != nil || len(objs) == 0 {
		t.Fatalf("the install's manifest: %v\n%s", err, out)
	}
	repo, _, _ := strings.Cut(image, ":")
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		ctrs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		if got := ctrs[0].(map[string]any)["image"]; got != image {
			t.Errorf("%s runs %v, want the image built (%s from image.repository %s)", o.GetName(), got, image, repo)
		}
	}
	return objs
}

// quickstartKubectl checks a kubectl command of the quickstart against the
// objects installed: the Deployment it names, and the port it forwards.
func quickstartKubectl(t *testing.T, cmd string, args []string, objs []*unstructured.Unstructured) {
	t.Helper()
	var dep *unstructured.Unstructured
	for _, a := range args {
		if name, ok := strings.CutPrefix(a, "deployment/"); ok {
			dep = find(objs, "Deployment", name)
		}
	}
	if dep == nil {
		t.Errorf("%s: names no Deployment the install made", cmd)
		return
	}
	if !slices.Contains(args, "port-forward") {
		return
	}
	_, port, _ := strings.Cut(args[len(args)-1], ":")
	ctrs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
	ports, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "ports")
	if !slices.ContainsFunc(ports, func(p any) bool { return strings.TrimSpace(toString(p.(map[string]any)["containerPort"])) == port }) {
		t.Errorf("%s: %s has no port %s: %v", cmd, dep.GetName(), port, ports)
	}
}

func toString(v any) string {
	b, _ := yaml.Marshal(v)
	return string(b)
}
