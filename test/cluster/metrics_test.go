package cluster

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// sample is one series of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the Prometheus text format: each series' name, labels
// and value (comments and timestamps left out).
func parseMetrics(text string) []sample {
	var out []sample
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i > 0 && line[i] == '{' {
			s.name = line[:i]
			j := strings.LastIndex(line, "}")
			if j < i {
				continue
			}
			parseLabels(line[i+1:j], s.labels)
			rest = strings.TrimSpace(line[j+1:])
		} else {
			name, r, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			s.name, rest = name, r
		}
		v, _, _ := strings.Cut(rest, " ")
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			continue
		}
		s.value = f
		out = append(out, s)
	}
	return out
}

// parseLabels reads k="v",... (values with \" and \\ escapes).
func parseLabels(s string, into map[string]string) {
	for s != "" {
		k, rest, ok := strings.Cut(s, "=\"")
		if !ok {
			return
		}
		var v strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
			}
			v.WriteByte(rest[i])
		}
		into[strings.TrimPrefix(k, ",")] = v.String()
		if i+1 >= len(rest) {
			return
		}
		s = rest[i+1:]
	}
}

// sum adds the series of a name whose labels include want.
func sum(samples []sample, name string, want map[string]string) float64 {
	var total float64
	for _, s := range samples {
		if s.name != name {
			continue
		}
		match := true
		for k, v := range want {
			match = match && s.labels[k] == v
		}
		if match {
			total += s.value
		}
	}
	return total
}

// podUsage is a pod's memory and CPU as the kubelet's cAdvisor reports
// them.
type podUsage struct {
	uid     string    // the pod's, from its cgroup
	rss     float64   // bytes
	cpu     float64   // seconds, since the pod started
	started time.Time // from the API
}

// podUsages reads the kubelet's cAdvisor metrics of the pods of a namespace,
// by pod name.
func (e *env) podUsages(t *testing.T, ns string) map[string]podUsage {
	t.Helper()
	nodes, err := e.kc.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]podUsage{}
	for _, n := range nodes.Items {
		b, err := e.kc.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", n.Name, "proxy", "metrics", "cadvisor").DoRaw(context.Background())
		if err != nil {
			t.Fatalf("the kubelet's cAdvisor metrics on %s: %v", n.Name, err)
		}
		for _, s := range parseMetrics(string(b)) {
			// The pod's own cgroup: no container label.
			if s.labels["namespace"] != ns || s.labels["container"] != "" || s.labels["pod"] == "" {
				continue
			}
			u := out[s.labels["pod"]]
			u.uid = s.labels["id"][strings.LastIndex(s.labels["id"], "/pod")+1:]
			switch s.name {
			case "container_memory_rss":
				u.rss = s.value
			case "container_cpu_usage_seconds_total":
				u.cpu = s.value
			}
			out[s.labels["pod"]] = u
		}
	}
	pods, err := e.kc.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if u, ok := out[p.Name]; ok && p.Status.StartTime != nil {
			u.started = p.Status.StartTime.Time
			out[p.Name] = u
		}
	}
	return out
}

// usageTable says each pod's RSS and its CPU over the interval between two
// readings (a pod made meanwhile: since it started).
func usageTable(before, after map[string]podUsage, over time.Duration) string {
	var names []string
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "| pod | RSS MiB | CPU (share of a core) |\n|---|---|---|\n")
	for _, n := range names {
		a := after[n]
		var cpu string
		if p, ok := before[n]; ok && p.uid == a.uid && over > 0 {
			cpu = fmt.Sprintf("%.1f %%", 100*(a.cpu-p.cpu)/over.Seconds())
		} else if life := time.Since(a.started); !a.started.IsZero() && life > 0 {
			cpu = fmt.Sprintf("%.1f %% (new: over its %s)", 100*a.cpu/life.Seconds(), life.Round(time.Second))
		}
		fmt.Fprintf(&b, "| %s | %.1f | %s |\n", n, a.rss/(1<<20), cpu)
	}
	return b.String()
}

// partMetrics reads the admin /metrics of every Ready pod of a part of the
// release (pusher: port 15014, ingester: 15015), by pod name.
func (e *env) partMetrics(t *testing.T, part string) map[string][]sample {
	t.Helper()
	port := map[string]string{"pusher": "15014", "ingester": "15015"}[part]
	pods, err := e.kc.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=" + part})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]sample{}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || !ready(&p) {
			continue
		}
		b, err := e.kc.CoreV1().Pods(namespace).ProxyGet("http", p.Name, port, "metrics", nil).DoRaw(context.Background())
		if err != nil {
			continue // it may be going away; the caller reads what answers
		}
		out[p.Name] = parseMetrics(string(b))
	}
	return out
}
