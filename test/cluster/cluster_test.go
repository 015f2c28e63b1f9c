// Package cluster installs shardpilot as users install it, on a real
// Kubernetes cluster with a node running its pods (make e2e-cluster, on the
// single-node cluster of make cluster), and checks what a proxyless grpc-go
// client in the mesh sees through installs, upgrades and faults.
//
// It runs when SHARDPILOT_CLUSTER_KUBECONFIG names the cluster, whose node
// has the images make e2e-cluster imports; it skips otherwise.
package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/internal/version"
)

const (
	release   = "shardpilot"
	namespace = "shardpilot"
	mesh      = "mesh"
)

// env is the cluster and the tools the test drives it with.
type env struct {
	kubeconfig, kubectl, helm, root string
	// image is what the quickstart builds and installs; nextTag a second
	// tag of it, for an upgrade that changes the image.
	image, nextTag string
	kc             kubernetes.Interface
	report         []row
	// usage are the pods' RSS and CPU tables, each with what was going on.
	usage []struct{ what, table string }
}

// row is one line of the report: a step and what the client saw during it.
type row struct {
	step   string
	took   time.Duration
	ok     int64
	failed int64
	// explained are the failures of a documented limit (raceOnNewCluster).
	explained int64
	comments  string
}

func setup(t *testing.T) *env {
	kubeconfig := os.Getenv("SHARDPILOT_CLUSTER_KUBECONFIG")
	if kubeconfig == "" {
		t.Skip("SHARDPILOT_CLUSTER_KUBECONFIG is not set: make e2e-cluster runs this test on make cluster's node")
	}
	e := &env{
		kubeconfig: kubeconfig,
		kubectl:    os.Getenv("SHARDPILOT_KUBECTL"),
		helm:       os.Getenv("SHARDPILOT_HELM"),
		nextTag:    version.Release + "-next",
	}
	if e.kubectl == "" || e.helm == "" {
		t.Fatal("SHARDPILOT_KUBECTL and SHARDPILOT_HELM must be set beside SHARDPILOT_CLUSTER_KUBECONFIG (make e2e-cluster sets them)")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	e.root = root
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	e.kc, err = kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// run runs a command with the cluster's kubeconfig and returns what it
// wrote to its standard output; it fails the test, saying what it printed,
// when the command fails.
func (e *env) run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, errOut, err := e.exec(name, args...)
	if err != nil {
		var why string
		if name == e.helm || (len(args) > 2 && args[2] == "rollout") {
			why = e.diagnose()
		}
		t.Fatalf("%s %s: %v\n%s%s%s", filepath.Base(name), strings.Join(args, " "), err, out, errOut, why)
	}
	return out
}

// diagnose says what the release's and the mesh's pods are doing and the
// latest warnings, for a wait that timed out.
func (e *env) diagnose() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"get", "pods", "-n", namespace, "-o", "wide"},
		{"get", "pods", "-n", mesh, "-o", "wide"},
		{"get", "events", "-A", "--field-selector", "type=Warning", "--sort-by=.lastTimestamp"},
		{"describe", "node"},
	} {
		out, errOut, _ := e.exec(e.kubectl, args...)
		lines := strings.Split(strings.TrimSpace(out+errOut), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		fmt.Fprintf(&b, "\n$ kubectl %s\n%s\n", strings.Join(args, " "), strings.Join(lines, "\n"))
	}
	return b.String()
}

func (e *env) exec(name string, args ...string) (stdout, stderr string, err error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = e.root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

func (e *env) kubectlApply(t *testing.T, yaml string) {
	t.Helper()
	cmd := exec.Command(e.kubectl, "apply", "-f", "-")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	cmd.Stdin = strings.NewReader(yaml)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
}

// clientStats is what the mesh's client says on /stats.
type clientStats struct {
	OK      map[string]int64 `json:"ok"`
	Failed  int64            `json:"failed"`
	Startup int64            `json:"startup"`
	Errors  []string         `json:"errors"`
}

func (s clientStats) total() int64 {
	var n int64
	for _, c := range s.OK {
		n += c
	}
	return n
}

// clients is what every client pod says, by pod: a pod replaced (the
// client pointed at other pushers) counts from zero.
type clients map[string]clientStats

// stats asks every running client pod, through the API server.
func (e *env) stats(t *testing.T) clients {
	t.Helper()
	pods, err := e.kc.CoreV1().Pods(mesh).List(context.Background(), metav1.ListOptions{LabelSelector: "app=client"})
	if err != nil {
		t.Fatal(err)
	}
	out := clients{}
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		var last error
		for range 10 {
			b, err := e.kc.CoreV1().Pods(mesh).ProxyGet("http", p.Name, "9090", "stats", nil).DoRaw(context.Background())
			if err == nil {
				var s clientStats
				if err := json.Unmarshal(b, &s); err != nil {
					t.Fatalf("%s's /stats: %v: %s", p.Name, err, b)
				}
				out[p.Name], last = s, nil
				break
			}
			last = err
			time.Sleep(500 * time.Millisecond)
		}
		if last != nil && ready(&p) {
			t.Fatalf("%s's /stats: %v", p.Name, last)
		}
	}
	if len(out) == 0 {
		t.Fatal("no client pod answers /stats")
	}
	return out
}

// since is what the clients saw after before: RPCs by backend, failures
// (with the last errors), and the failures before a new pod's first
// answer.
func (after clients) since(before clients) clientStats {
	d := clientStats{OK: map[string]int64{}}
	for pod, a := range after {
		b := before[pod]
		for addr, n := range a.OK {
			d.OK[addr] += n - b.OK[addr]
		}
		d.Failed += a.Failed - b.Failed
		d.Startup += a.Startup - b.Startup
		d.Errors = append(d.Errors, a.Errors[len(a.Errors)-min(int(a.Failed-b.Failed), len(a.Errors)):]...)
	}
	return d
}

// raceOnNewCluster is how grpc-go fails an RPC that a new route sends to a
// cluster its balancer has not been told of yet: the route's config
// selector is swapped in before the cluster manager's picker has the
// cluster (a window of microseconds on the client; the same route from
// istiod meets it the same way, and a picker's error is not retried).
// README "On a real cluster" documents it.
const raceOnNewCluster = "unknown cluster selected for RPC"

// step runs fn and records what the client saw meanwhile: every RPC made
// during it must succeed, but for failures whose error says explained
// (when not empty), which are counted apart.
func (e *env) step(t *testing.T, name, explained string, fn func(t *testing.T) string) {
	t.Helper()
	ok := t.Run(name, func(t *testing.T) {
		before := e.stats(t)
		start := time.Now()
		comments := fn(t)
		took := time.Since(start)
		d := e.stats(t).since(before)
		r := row{step: name, took: took, ok: d.total(), failed: d.Failed, comments: comments}
		if d.Startup > 0 {
			r.comments += fmt.Sprintf("; %d RPCs of a new client pod failed before its first answer", d.Startup)
		}
		var unexplained []string
		if r.failed > 0 {
			for _, err := range d.Errors {
				if explained != "" && strings.Contains(err, explained) {
					r.explained++
					continue
				}
				unexplained = append(unexplained, err)
			}
			if r.explained > 0 {
				r.comments += fmt.Sprintf("; %d failed as grpc-go does on a route naming a new cluster (%q)", r.explained, explained)
			}
		}
		e.report = append(e.report, r)
		if len(unexplained) > 0 || r.failed > int64(len(d.Errors)) {
			t.Errorf("%d of the client's RPCs failed during %q (%d explained); the others: %s", r.failed, name, r.explained, strings.Join(unexplained, "\n"))
		}
		if r.ok == 0 {
			t.Errorf("the client made no RPC that succeeded during %q", name)
		}
	})
	if !ok {
		t.FailNow()
	}
}

// servedBy waits until every RPC the client makes for 3 s lands on the
// pods of want (addresses ip:port), and says how long that took.
func (e *env) servedBy(t *testing.T, what string, want func() map[string]bool) time.Duration {
	t.Helper()
	return e.served(t, what, want, false)
}

// servedByAll is servedBy where every pod of want must also answer some of
// the RPCs: the client holds exactly the endpoints that are there.
func (e *env) servedByAll(t *testing.T, what string, want func() map[string]bool) time.Duration {
	t.Helper()
	return e.served(t, what, want, true)
}

func (e *env) served(t *testing.T, what string, want func() map[string]bool, all bool) time.Duration {
	t.Helper()
	start := time.Now()
	testutil.Eventually(t, 90*time.Second, what, func() (bool, string) {
		allowed := want()
		before := e.stats(t)
		time.Sleep(3 * time.Second)
		got := e.stats(t).since(before).OK
		var wrong []string
		n := int64(0)
		for addr, d := range got {
			n += d
			if d > 0 && !allowed[addr] {
				wrong = append(wrong, fmt.Sprintf("%s (%d)", addr, d))
			}
		}
		if n == 0 {
			return false, "no RPC succeeded"
		}
		if len(wrong) > 0 {
			sort.Strings(wrong)
			return false, "served by " + strings.Join(wrong, ", ")
		}
		if all {
			var idle []string
			for addr := range allowed {
				if got[addr] == 0 {
					idle = append(idle, addr)
				}
			}
			if len(idle) > 0 {
				sort.Strings(idle)
				return false, "no RPC reached " + strings.Join(idle, ", ")
			}
		}
		return true, ""
	})
	return time.Since(start).Round(100 * time.Millisecond)
}

// podAddrs are the addresses (ip:8080) of the ready pods with the labels.
func (e *env) podAddrs(t *testing.T, selector string) map[string]bool {
	t.Helper()
	pods, err := e.kc.CoreV1().Pods(mesh).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string]bool{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && ready(&p) {
			addrs[p.Status.PodIP+":8080"] = true
		}
	}
	return addrs
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// allReady waits until every pod of the namespace is Ready and none is
// terminating, and returns them; a pod that ran to completion (a Job's,
// such as the one making the trial etcd's users) is done, not unready,
// and left out.
func (e *env) allReady(t *testing.T, ns string, within time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	testutil.Eventually(t, within, "every pod of "+ns+" Ready", func() (bool, string) {
		l, err := e.kc.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var not []string
		var running []corev1.Pod
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodSucceeded && p.DeletionTimestamp == nil {
				continue
			}
			if p.DeletionTimestamp != nil || !ready(&p) {
				not = append(not, fmt.Sprintf("%s (%s)", p.Name, podState(&p)))
			}
			running = append(running, p)
		}
		if len(running) == 0 || len(not) > 0 {
			return false, fmt.Sprintf("%d pods, not ready: %s", len(running), strings.Join(not, ", "))
		}
		pods = running
		return true, ""
	})
	return pods
}

// podState says why a pod is not ready, as kubectl get pods would.
func podState(p *corev1.Pod) string {
	if p.DeletionTimestamp != nil {
		return "Terminating"
	}
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			return c.Name + ": " + c.State.Waiting.Reason + " " + c.State.Waiting.Message
		case c.State.Terminated != nil:
			return fmt.Sprintf("%s: terminated %s (exit %d)", c.Name, c.State.Terminated.Reason, c.State.Terminated.ExitCode)
		case !c.Ready:
			return fmt.Sprintf("%s: running, not ready (restarts %d)", c.Name, c.RestartCount)
		}
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			return string(c.Type) + ": " + c.Message
		}
	}
	return string(p.Status.Phase)
}

// TestCluster runs the chart README's quickstart, the mesh's workloads,
// and takes the release through changes, upgrades and faults while the
// client counts its RPCs.
func TestCluster(t *testing.T) {
	e := setup(t)
	defer e.printReport(t)
	e.run(t, e.helm, "uninstall", release, "-n", namespace, "--wait", "--ignore-not-found")
	e.run(t, e.kubectl, "delete", "namespace", mesh, "churn", "--ignore-not-found", "--wait")

	if !t.Run("quickstart", e.install) {
		return
	}
	if !t.Run("workloads", e.workloads) {
		return
	}
	v1 := func() map[string]bool { return e.podAddrs(t, "app=echo,version=v1") }
	v2 := func() map[string]bool { return e.podAddrs(t, "app=echo,version=v2") }
	both := func() map[string]bool { return e.podAddrs(t, "app=echo") }
	e.step(t, "VirtualService weight shift to v2", raceOnNewCluster, func(t *testing.T) string {
		e.setWeights(t, 0, 100)
		return fmt.Sprintf("all RPCs on v2 after %s", e.servedBy(t, "every RPC on v2", v2))
	})
	e.step(t, "VirtualService weight shift back to v1", raceOnNewCluster, func(t *testing.T) string {
		e.setWeights(t, 100, 0)
		return fmt.Sprintf("all RPCs on v1 after %s", e.servedBy(t, "every RPC on v1", v1))
	})
	e.step(t, "rollout of echo-v1 (endpoints move)", "", func(t *testing.T) string {
		old := v1()
		e.run(t, e.kubectl, "-n", mesh, "rollout", "restart", "deployment/echo-v1")
		e.run(t, e.kubectl, "-n", mesh, "rollout", "status", "deployment/echo-v1", "--timeout=3m")
		took := e.servedBy(t, "every RPC on the new v1 pods", v1)
		for a := range v1() {
			if old[a] {
				t.Errorf("pod address %s both before and after the rollout", a)
			}
		}
		return fmt.Sprintf("the new pods alone served %s after the rollout", took)
	})
	e.step(t, "50/50 between v1 and v2", raceOnNewCluster, func(t *testing.T) string {
		e.setWeights(t, 50, 50)
		return fmt.Sprintf("every pod of both served after %s", e.servedByAll(t, "RPCs on every pod of v1 and v2", both))
	})
	e.step(t, "30 s at rest", "", func(t *testing.T) string {
		before, at := e.podUsages(t, namespace), time.Now()
		time.Sleep(30 * time.Second)
		e.recordUsage(t, "At rest: the release's pods over 30 s while the client calls at 20 RPC/s", before, at)
		return "pods' RSS and CPU below"
	})
	e.step(t, "helm upgrade: 2 pushers and a new image tag", "", func(t *testing.T) string {
		repo, _, _ := strings.Cut(e.image, ":")
		e.run(t, "make", "image", "IMAGE="+repo+":"+e.nextTag)
		e.run(t, e.helm, "upgrade", release, "deploy/helm/shardpilot", "-n", namespace, "--reuse-values",
			"--set", "pusher.replicas=2", "--set", "image.tag="+e.nextTag, "--wait", "--timeout", "5m")
		e.pushersRun(t, 2, e.nextTag)
		return fmt.Sprintf("2 pushers Ready on the new tag; every pod served after %s", e.servedByAll(t, "RPCs on every pod after the upgrade", both))
	})
	e.step(t, "60 s of churn", "", func(t *testing.T) string {
		before, at := e.podUsages(t, namespace), time.Now()
		stop := e.churn(t)
		time.Sleep(60 * time.Second)
		n := stop()
		e.recordUsage(t, fmt.Sprintf("Under churn: the release's pods over 60 s of %d changes (a Service of namespace churn created or deleted every 2 s, echo-v2 scaled between 1 and 2 replicas every 6 s)", n), before, at)
		return fmt.Sprintf("%d changes; every pod served, no other, %s after the churn stopped", n, e.servedByAll(t, "RPCs on every pod of echo after the churn", both))
	})
	for _, f := range []struct{ name, pod string }{
		{"a pusher pod killed", "pusher"},
		{"the NATS pod killed", release + "-nats-0"},
		{"the etcd pod killed", release + "-etcd-0"},
		{"the leading ingester pod killed", "ingester"},
	} {
		e.step(t, f.name+" under churn", "", func(t *testing.T) string { return e.fault(t, f.pod, both) })
	}

	e.step(t, "helm upgrade to shards: namespace mesh on a shard of its own", raceOnNewCluster, func(t *testing.T) string {
		e.run(t, e.helm, "upgrade", release, "deploy/helm/shardpilot", "-n", namespace, "--reuse-values",
			"--set", "pusher.shards[0].name=mesh", "--set", "pusher.shards[0].namespaces[0]=mesh", "--wait", "--timeout", "5m")
		e.pushersRun(t, 2, e.nextTag)
		// The whole-mesh pushers are gone: the client calls on with what
		// it was sent until it is pointed at its namespace's Service.
		e.servedByAll(t, "RPCs on every pod of echo on the config the client holds", both)
		moved := e.pointClient(t, fmt.Sprintf("%s-xds-%s.%s.svc:15010", release, mesh, namespace), both)
		e.setWeights(t, 0, 100)
		shifted := e.servedBy(t, "every RPC on v2 through the shard", v2)
		out := e.run(t, "go", "run", "./cmd/shardctl", "proxy-status", "--kube-namespace", namespace, "--kubeconfig", e.kubeconfig)
		if !strings.Contains(out, release+"-pusher-"+mesh+"-") {
			t.Errorf("proxy-status shows the client on no pusher of shard %s:\n%s", mesh, out)
		}
		return fmt.Sprintf("the client pointed at %s-xds-%s answered in %s; a weight shift through the shard served in %s", release, mesh, moved, shifted)
	})
	e.step(t, "helm rollback to the first release", raceOnNewCluster, func(t *testing.T) string {
		e.run(t, e.helm, "rollback", release, "1", "-n", namespace, "--wait", "--timeout", "5m")
		e.pushersRun(t, 1, version.Release)
		moved := e.pointClient(t, fmt.Sprintf("%s-pusher.%s.svc:15010", release, namespace), v2)
		e.setWeights(t, 50, 50)
		return fmt.Sprintf("1 pusher Ready on %s; the client pointed back answered in %s; every pod served after %s", version.Release, moved,
			e.servedByAll(t, "RPCs on every pod after the rollback", both))
	})
	t.Run("shardctl proxy-status from outside through kube discovery", func(t *testing.T) {
		out := e.run(t, "go", "run", "./cmd/shardctl", "proxy-status", "--kube-namespace", namespace, "--kubeconfig", e.kubeconfig)
		pods, err := e.kc.CoreV1().Pods(mesh).List(context.Background(), metav1.ListOptions{LabelSelector: "app=client"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if !strings.Contains(out, p.Name+"."+mesh) {
				t.Errorf("proxy-status does not list the client pod %s.%s:\n%s", p.Name, mesh, out)
			}
		}
		t.Logf("shardctl proxy-status:\n%s", out)
	})
	t.Run("shardctl security-check: the trial's bus is secured by default", e.securityCheck)
	t.Run("a port-forward to /debug/ needs the admin token", e.portForwardNeedsToken)
	t.Run("helm uninstall leaves the CRDs alone behind", e.uninstall)
}

// securityCheck: the release as helm install made it signs in to its NATS
// as a user per role and signs its events, and its etcd has a user per
// part with authentication on: shardctl security-check, asking every
// replica, finds neither NATS nor etcd letting in clients without a
// credential nor events unsigned or unverified (the trial's plaintext ADS
// and connections in the clear it does report, and fails for them).
func (e *env) securityCheck(t *testing.T) {
	stdout, stderr, err := e.exec("go", "run", "./cmd/shardctl", "security-check", "--kube-namespace", namespace, "--kubeconfig", e.kubeconfig, "-o", "json")
	var got []struct {
		Severity, Setting string
		Replicas          []string
	}
	if jerr := json.Unmarshal([]byte(stdout), &got); jerr != nil || len(got) == 0 {
		t.Fatalf("shardctl security-check: %v (%v)\n%s%s", err, jerr, stdout, stderr)
	}
	if err == nil {
		t.Error("security-check of a trial (plaintext ADS) exited 0")
	}
	for _, w := range got {
		for _, bad := range []string{"NATS server authorization", "etcd authentication", "--bus-verify-key-file", "--bus-signing-key-file", "--admin-token"} {
			if strings.HasPrefix(w.Setting, bad) {
				t.Errorf("the installed release reports %s: %+v", bad, w)
			}
		}
	}
	t.Logf("shardctl security-check -o json:\n%s", stdout)
}

// pushersRun waits until n pushers, and no other, are Ready on the tag.
func (e *env) pushersRun(t *testing.T, n int, tag string) {
	t.Helper()
	testutil.Eventually(t, 3*time.Minute, fmt.Sprintf("%d pushers Ready on %s", n, tag), func() (bool, string) {
		pods, err := e.kc.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=pusher"})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		good := 0
		for _, p := range pods.Items {
			seen = append(seen, fmt.Sprintf("%s %s (%s)", p.Name, p.Spec.Containers[0].Image, podState(&p)))
			if p.DeletionTimestamp == nil && ready(&p) && strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) {
				good++
			}
		}
		return good == n && len(pods.Items) == n, strings.Join(seen, ", ")
	})
}

func (e *env) recordUsage(t *testing.T, what string, before map[string]podUsage, at time.Time) {
	t.Helper()
	e.usage = append(e.usage, struct{ what, table string }{what, usageTable(before, e.podUsages(t, namespace), time.Since(at))})
}

// churn changes the mesh until stop is called: every 2 s a Service of
// namespace churn created (or deleted, when it is there), and every 6 s
// echo-v2 scaled between 1 and 2 replicas (its pods start and drain under
// the client's RPCs). stop waits for the last change and for echo-v2's
// pods to be Ready, and says how many changes were made.
func (e *env) churn(t *testing.T) (stop func() int) {
	t.Helper()
	if _, err := e.kc.CoreV1().Namespaces().Get(context.Background(), "churn", metav1.GetOptions{}); err != nil {
		e.run(t, e.kubectl, "create", "namespace", "churn")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		changes := 0
		tick := time.NewTicker(2 * time.Second)
		defer tick.Stop()
		for i := 0; ; i++ {
			svc := e.kc.CoreV1().Services("churn")
			name := fmt.Sprintf("churn-%d", i%10)
			if svc.Delete(ctx, name, metav1.DeleteOptions{}) == nil {
				changes++
			} else if _, err := svc.Create(ctx, &corev1.Service{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "grpc", Port: int32(9000 + i)}}, Selector: map[string]string{"app": name}},
			}, metav1.CreateOptions{}); err == nil {
				changes++
			}
			if i%3 == 0 {
				if sc, err := e.kc.AppsV1().Deployments(mesh).GetScale(ctx, "echo-v2", metav1.GetOptions{}); err == nil {
					sc.Spec.Replicas = 3 - sc.Spec.Replicas
					if sc.Spec.Replicas < 1 || sc.Spec.Replicas > 2 {
						sc.Spec.Replicas = 1
					}
					if _, err := e.kc.AppsV1().Deployments(mesh).UpdateScale(ctx, "echo-v2", sc, metav1.UpdateOptions{}); err == nil {
						changes++
					}
				}
			}
			select {
			case <-ctx.Done():
				done <- changes
				return
			case <-tick.C:
			}
		}
	}()
	return func() int {
		cancel()
		n := <-done
		e.run(t, e.kubectl, "-n", mesh, "rollout", "status", "deployment/echo-v2", "--timeout=3m")
		return n
	}
}

// fault kills a pod of the release (a part's first Ready pod, or a pod by
// name) under churn, waits for the release to be whole again while
// reading what the pushers' metrics say, stops the churn, and checks that
// the client then reaches every pod of echo and no other: the last
// change of the churn is not lost.
func (e *env) fault(t *testing.T, pod string, want func() map[string]bool) string {
	t.Helper()
	stop := e.churn(t)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	time.Sleep(10 * time.Second)
	if pod == "pusher" || pod == "ingester" {
		pods, err := e.kc.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + pod})
		if err != nil || len(pods.Items) == 0 {
			t.Fatalf("no %s pod: %v", pod, err)
		}
		pod = pods.Items[0].Name
		if strings.Contains(pod, "ingester") {
			pod = e.leadingIngester(t, pods.Items[0].Name)
		}
	}
	before, err := e.kc.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=pusher"})
	if err != nil {
		t.Fatal(err)
	}
	others := map[string]bool{}
	for _, p := range before.Items {
		others[p.Name] = p.Name != pod
	}
	killed := time.Now()
	e.run(t, e.kubectl, "-n", namespace, "delete", "pod", pod, "--grace-period=0", "--force")
	// What the pushers say while the release heals: the longest they
	// called themselves stale, and whether any stopped being Ready.
	var maxStale float64
	notReady := map[string]bool{}
	healed := time.Duration(0)
	testutil.Eventually(t, 4*time.Minute, "the release whole again after killing "+pod, func() (bool, string) {
		for _, m := range e.partMetrics(t, "pusher") {
			maxStale = max(maxStale, sum(m, "shardpilot_pusher_stale_seconds", nil))
		}
		l, err := e.kc.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var not []string
		for _, p := range l.Items {
			if p.Status.Phase == corev1.PodSucceeded && p.DeletionTimestamp == nil {
				continue // a Job's, done
			}
			if p.DeletionTimestamp != nil || !ready(&p) {
				not = append(not, p.Name+" ("+podState(&p)+")")
				if others[p.Name] {
					notReady[p.Name] = true
				}
			}
		}
		if len(not) > 0 || len(l.Items) == 0 {
			return false, strings.Join(not, ", ")
		}
		healed = time.Since(killed)
		return true, ""
	})
	time.Sleep(10 * time.Second) // churn on the healed release too
	changes := stop()
	stopped = true
	converged := e.servedByAll(t, "RPCs on every pod of echo after the churn", want)
	var readiness string
	if len(notReady) == 0 {
		readiness = "the pushers not killed Ready throughout"
	} else {
		var names []string
		for n := range notReady {
			names = append(names, n)
		}
		readiness = "not Ready for a while: " + strings.Join(names, ", ")
	}
	return fmt.Sprintf("killed %s; whole again after %s; %d changes of churn; every pod served, no other, %s after the churn stopped; pushers' stale_seconds at most %.0f; %s",
		pod, healed.Round(100*time.Millisecond), changes, converged, maxStale, readiness)
}

// leadingIngester is the ingester leading the most elections (from its
// metric shardpilot_ingester_leading), or fallback when none leads.
func (e *env) leadingIngester(t *testing.T, fallback string) string {
	t.Helper()
	best, most := fallback, 0.0
	for name, m := range e.partMetrics(t, "ingester") {
		if n := sum(m, "shardpilot_ingester_leading", nil); n > most {
			best, most = name, n
		}
	}
	return best
}

// portForwardNeedsToken: kubectl port-forward (anyone allowed
// pods/portforward) arrives at a pusher from loopback; /debug/ answers it
// the token of the chart's Secret alone.
func (e *env) portForwardNeedsToken(t *testing.T) {
	pods, err := e.kc.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=pusher"})
	if err != nil || len(pods.Items) == 0 {
		t.Fatalf("no pusher pod: %v", err)
	}
	cmd := exec.Command(e.kubectl, "-n", namespace, "port-forward", "pod/"+pods.Items[0].Name, ":15014")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	// "Forwarding from 127.0.0.1:40123 -> 15014"
	line, err := bufio.NewReader(out).ReadString('\n')
	_, rest, ok := strings.Cut(line, "127.0.0.1:")
	port, _, _ := strings.Cut(rest, " ")
	if err != nil || !ok {
		t.Fatalf("kubectl port-forward said %q: %v", line, err)
	}
	sec, err := e.kc.CoreV1().Secrets(namespace).Get(context.Background(), release+"-admin-token", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {"not-the-token-0123456789abcdefghij", http.StatusUnauthorized}, {string(sec.Data["token"]), http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/debug/syncz", nil)
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("/debug/syncz through a port-forward, token %v: %s, want %d", c.token != "", resp.Status, c.want)
		}
	}
	e.report = append(e.report, row{step: "a port-forward to a pusher's /debug/", comments: "401 without the token or with another; 200 with the chart's Secret's"})
}

// uninstall removes the release and checks that nothing of it is left
// but the CRDs (objects labelled with the release's instance, in its
// namespace and in the cluster's scope).
func (e *env) uninstall(t *testing.T) {
	start := time.Now()
	e.run(t, e.helm, "uninstall", release, "-n", namespace, "--wait", "--timeout", "3m")
	var left []string
	testutil.Eventually(t, 2*time.Minute, "nothing of the release left", func() (bool, string) {
		left = nil
		for _, scope := range []string{"true", "false"} {
			kinds := strings.Fields(e.run(t, e.kubectl, "api-resources", "--namespaced="+scope, "--verbs=list", "-o", "name"))
			args := []string{"get", strings.Join(kinds, ","), "-l", "app.kubernetes.io/instance=" + release, "-o", "name", "--ignore-not-found"}
			if scope == "true" {
				args = append(args, "-A")
			}
			for _, o := range strings.Fields(e.run(t, e.kubectl, args...)) {
				if !strings.HasPrefix(o, "customresourcedefinition") {
					left = append(left, o)
				}
			}
		}
		pvcs, err := e.kc.CoreV1().PersistentVolumeClaims(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pvcs.Items {
			left = append(left, "persistentvolumeclaim/"+p.Name)
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	crds := strings.Fields(e.run(t, e.kubectl, "get", "crd", "-o", "name"))
	e.report = append(e.report, row{step: "helm uninstall", took: time.Since(start), comments: fmt.Sprintf("nothing left but %d CRDs", len(crds))})
}

// install runs the chart README's quickstart as it is written: make image,
// helm install of the trial, the pushers' rollout, shardctl proxy-status
// through the API server; the push to a registry alone is left out (the
// node imported the archive). Then every pod of the release must be Ready,
// each running the release and revision built.
func (e *env) install(t *testing.T) {
	start := time.Now()
	cmds, err := kubetest.Quickstart(filepath.Join(e.root, "deploy", "helm", "shardpilot", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range cmds {
		args := strings.Fields(cmd)
		switch args[0] {
		case "make":
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "IMAGE="); ok {
					e.image = v
				}
			}
			e.run(t, "make", args[1:]...)
		case "crane":
			t.Logf("skipped %q: the node imported the archive", cmd)
			continue
		case "helm":
			e.run(t, e.helm, args[1:]...)
		case "kubectl":
			e.run(t, e.kubectl, args[1:]...)
		case "go":
			t.Logf("%s:\n%s", cmd, e.run(t, "go", args[1:]...))
		default:
			t.Fatalf("the quickstart runs %q, which this test does not know", cmd)
		}
	}
	if e.image == "" {
		t.Fatal("the quickstart builds no image (make image IMAGE=...)")
	}
	pods := e.allReady(t, namespace, 3*time.Minute)
	want := "shardpilot " + version.Release
	for _, p := range pods {
		if c := p.Labels["app.kubernetes.io/component"]; c != "pusher" && c != "ingester" {
			continue
		}
		if img := p.Spec.Containers[0].Image; img != e.image {
			t.Errorf("%s runs %s, want the image the quickstart built, %s", p.Name, img, e.image)
		}
		out := e.run(t, e.kubectl, "-n", namespace, "exec", p.Name, "--", "/shardctl", "--version")
		if !strings.Contains(out, want) || strings.Contains(out, "revision unknown") {
			t.Errorf("%s: shardctl --version says %q, want %q with the revision it was built from", p.Name, strings.TrimSpace(out), want)
		}
	}
	e.report = append(e.report, row{step: "the chart README's quickstart (make image, helm install of the trial)", took: time.Since(start), comments: fmt.Sprintf("%d pods Ready", len(pods))})
}

// workloads starts the mesh's server and client and waits for the
// client's first answered RPC.
func (e *env) workloads(t *testing.T) {
	start := time.Now()
	e.applyWorkloads(t, fmt.Sprintf("%s-pusher.%s.svc:15010", release, namespace))
	e.allReady(t, mesh, 3*time.Minute)
	took := e.servedBy(t, "every RPC on v1", func() map[string]bool { return e.podAddrs(t, "app=echo,version=v1") })
	s := e.stats(t).since(nil)
	e.report = append(e.report, row{step: "workloads: 3 servers, a proxyless client", took: time.Since(start), ok: s.total(), failed: s.Failed,
		comments: fmt.Sprintf("%d RPCs failed before the first answer; all on v1 after %s", s.Startup, took.Round(100*time.Millisecond))})
}

// applyWorkloads applies testdata/workloads.yaml (only: its objects named
// so), the client's ADS server being xds (host:port).
func (e *env) applyWorkloads(t *testing.T, xds string, only ...string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "workloads.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(strings.ReplaceAll(string(b), "XDS_SERVER", xds), "\n---\n")
	if len(only) > 0 {
		var picked []string
		for _, d := range docs {
			for _, name := range only {
				if strings.Contains(d, "\n  name: "+name+"\n") {
					picked = append(picked, d)
				}
			}
		}
		if len(picked) != len(only) {
			t.Fatalf("testdata/workloads.yaml has %d of the objects %v", len(picked), only)
		}
		docs = picked
	}
	e.kubectlApply(t, strings.Join(docs, "\n---\n"))
}

// pointClient points the client at other pushers (xds), as an operator
// does when they move, and waits for its new pod to answer RPCs on the
// pods of want: the pushers there serve it.
func (e *env) pointClient(t *testing.T, xds string, want func() map[string]bool) time.Duration {
	t.Helper()
	start := time.Now()
	e.applyWorkloads(t, xds, "client")
	e.run(t, e.kubectl, "-n", mesh, "rollout", "status", "deployment/client", "--timeout=3m")
	e.servedBy(t, "the client's new pod answered through "+xds, want)
	return time.Since(start).Round(100 * time.Millisecond)
}

func (e *env) setWeights(t *testing.T, v1, v2 int) {
	t.Helper()
	e.kubectlApply(t, fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: VirtualService
metadata:
  name: echo
  namespace: %s
spec:
  hosts: [echo.mesh.svc.cluster.local]
  http:
  - route:
    - {destination: {host: echo.mesh.svc.cluster.local, subset: v1}, weight: %d}
    - {destination: {host: echo.mesh.svc.cluster.local, subset: v2}, weight: %d}
`, mesh, v1, v2))
}

func (e *env) printReport(t *testing.T) {
	var b strings.Builder
	fmt.Fprintf(&b, "| step | took | client RPCs answered | failed (of a documented limit) | |\n|---|---|---|---|---|\n")
	for _, r := range e.report {
		fmt.Fprintf(&b, "| %s | %s | %d | %d (%d) | %s |\n", r.step, r.took.Round(100*time.Millisecond), r.ok, r.failed, r.explained, r.comments)
	}
	for _, u := range e.usage {
		fmt.Fprintf(&b, "\n%s\n\n%s", u.what, u.table)
	}
	t.Logf("what the cluster test checked:\n%s", b.String())
	if out := os.Getenv("SHARDPILOT_CLUSTER_REPORT"); out != "" {
		if err := os.WriteFile(out, []byte(b.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}
