// Package deploy_test checks what operators install: the image's
// Dockerfile, and the Helm chart rendered with its default values and with
// a large mesh's, linted by helm and applied as a server-side dry run to a
// real kube-apiserver (the Istio CRDs first).
package deploy_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	line      int
	cmd, args string
}

func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if cont, ok := strings.CutSuffix(line, "\\"); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{line: start, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur.Len() > 0 {
		t.Fatalf("Dockerfile: line %d: a continuation runs off the end", start)
	}
	return out
}

// TestDockerfile lints the image's Dockerfile: known instructions only,
// base images pinned, static binaries of every command built and copied
// into a distroless final stage that runs as a non-root user, exec-form
// entrypoint, no ADD.
func TestDockerfile(t *testing.T) {
	known := []string{"FROM", "WORKDIR", "COPY", "RUN", "ARG", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL"}
	var stages [][]instruction
	for _, in := range parseDockerfile(t, filepath.Join("..", "Dockerfile")) {
		where := fmt.Sprintf("Dockerfile:%d: %s", in.line, in.cmd)
		if !slices.Contains(known, in.cmd) {
			t.Errorf("%s: not an instruction this image uses (ADD fetches URLs and unpacks archives: use COPY)", where)
		}
		if in.cmd == "FROM" {
			image := strings.Fields(in.args)[0]
			if _, tag, ok := strings.Cut(image, ":"); !ok || tag == "latest" {
				t.Errorf("%s %s: pin the base image to a tag", where, image)
			}
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Errorf("%s: before the first FROM", where)
			}
			continue
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages: want a build stage and a final one", len(stages))
	}
	var build string
	for _, in := range stages[0] {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			build = in.args
		}
	}
	if !strings.Contains(build, "CGO_ENABLED=0") {
		t.Errorf("the build stage's go build (%q) must set CGO_ENABLED=0: the final image has no C library", build)
	}
	final := stages[len(stages)-1]
	if base := strings.Fields(final[0].args)[0]; !strings.HasPrefix(base, "gcr.io/distroless/static") && base != "scratch" {
		t.Errorf("final stage FROM %s: want distroless static or scratch", base)
	}
	var user, entry string
	var copied []string
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entry = in.args
		case "COPY":
			copied = append(copied, strings.Fields(in.args)...)
		}
	}
	for _, cmd := range []string{"ingester", "pusher", "standalone"} {
		if !strings.Contains(build, "./cmd/"+cmd) || !slices.ContainsFunc(copied, func(s string) bool { return strings.HasSuffix(s, "/"+cmd) }) {
			t.Errorf("%s: not built in the build stage and copied into the final one", cmd)
		}
	}
	if u, _, _ := strings.Cut(user, ":"); u == "" || u == "0" || u == "root" {
		t.Errorf("final stage USER %q: want a non-root user", user)
	}
	var argv []string
	if err := json.Unmarshal([]byte(entry), &argv); err != nil || len(argv) == 0 {
		t.Errorf("ENTRYPOINT %s: want the exec form, a JSON array (there is no shell in the image)", entry)
	}
}

func helm(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("SHARDPILOT_HELM"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("SHARDPILOT_HELM=%s: %v (make helm installs it)", bin, err)
		}
		return bin
	}
	bin, err := exec.LookPath("helm")
	if err != nil {
		t.Skip("no helm: run make helm, or go install helm.sh/helm/v3/cmd/helm@v3.22.0")
	}
	return bin
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// values reads a values file over the chart's defaults, as helm merges
// them (maps deep, everything else replaced).
func values(t *testing.T, files ...string) map[string]any {
	t.Helper()
	merged := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := yaml.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		merge(merged, v)
	}
	return merged
}

func merge(dst, src map[string]any) {
	for k, v := range src {
		if m, ok := v.(map[string]any); ok {
			if d, ok := dst[k].(map[string]any); ok {
				merge(d, m)
				continue
			}
		}
		dst[k] = v
	}
}

func num(m map[string]any, path ...string) int64 {
	var v any = m
	for _, p := range path {
		v = v.(map[string]any)[p]
	}
	return int64(v.(float64))
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

var envName = regexp.MustCompile(`\$(SHARDPILOT_[A-Z0-9_]+)`)

// TestChart renders the chart with its default values and with the large
// mesh's, checks what an operator of a large mesh relies on, and applies
// every object as a server-side dry run to a real kube-apiserver.
func TestChart(t *testing.T) {
	h := helm(t)
	chart := filepath.Join("helm", "shardpilot")
	defaults := filepath.Join(chart, "values.yaml")

	// Every pusher flag is in the chart.
	pusher := filepath.Join(t.TempDir(), "pusher")
	run(t, "go", "build", "-o", pusher, "../cmd/pusher")
	ingester := filepath.Join(t.TempDir(), "ingester")
	run(t, "go", "build", "-o", ingester, "../cmd/ingester")
	help, _ := exec.Command(pusher, "--help").CombinedOutput()
	flags := envName.FindAllStringSubmatch(string(help), -1)
	if len(flags) < 10 {
		t.Fatalf("pusher --help names %d environment variables:\n%s", len(flags), help)
	}

	// The templates' text, where a flag set only on request is named.
	var helpers string
	templates, err := filepath.Glob(filepath.Join(chart, "templates", "*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range templates {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		helpers += string(b)
	}

	checkSchema(t, h, chart)

	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := kc.WriteKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}

	for name, files := range map[string][]string{
		"default": nil,
		"large":   {filepath.Join("helm", "examples", "values-large.yaml")},
		"trial":   {filepath.Join("helm", "examples", "values-trial.yaml")},
		"secured": {filepath.Join("helm", "examples", "values-secured.yaml")},
		"istio":   {filepath.Join("helm", "examples", "values-istio-migration.yaml")},
		"knobs":   {filepath.Join("testdata", "values-knobs.yaml")},
	} {
		t.Run(name, func(t *testing.T) {
			var args []string
			for _, f := range files {
				args = append(args, "-f", f)
			}
			v := values(t, append([]string{defaults}, files...)...)
			run(t, h, append([]string{"lint", "--strict", chart}, args...)...)
			rendered := run(t, h, append([]string{"template", "sp", chart, "--namespace", ns}, args...)...)
			objs, err := kubetest.Decode([]byte(rendered))
			if err != nil {
				t.Fatal(err)
			}

			dep := checkPusher(t, objs, v)
			checkPusherFlags(t, dep, flags, helpers, firstPusher(v))
			checkStarts(t, dep, pusher)
			checkStarts(t, find(objs, "Deployment", "sp-ingester"), ingester)
			checkMountedFiles(t, dep, find(objs, "Deployment", "sp-ingester"))
			if name == "secured" {
				checkSecured(t, objs)
			}

			checkServed(t, name, objs, v, ns)
			if err := kc.Apply(context.Background(), objs, ns, true); err != nil {
				t.Fatalf("server-side dry run: %v", err)
			}
			out := run(t, h, append([]string{"install", "sp", chart, "--namespace", ns, "--dry-run=server", "--kubeconfig", kubeconfig}, args...)...)
			if !strings.Contains(out, "Proxies connect to ADS") {
				t.Errorf("helm install --dry-run=server printed no NOTES:\n%s", out)
			}
			checkNotes(t, out, v)
		})
	}
}

// checkPusher checks the pusher Deployment (the first shard's when
// sharded) and what goes with it: its autoscaler and disruption budget,
// the ingester's, their network policies, graceful termination, a
// locked-down container with a startup probe, and the memory request of
// the sizing formula. It returns the Deployment.
func checkPusher(t *testing.T, objs []*unstructured.Unstructured, v map[string]any) *unstructured.Unstructured {
	t.Helper()
	pusherName := firstPusher(v)
	dep := find(objs, "Deployment", pusherName)
	if dep == nil {
		t.Fatalf("no pusher Deployment %s", pusherName)
	}
	autoscaled := v["pusher"].(map[string]any)["autoscaling"].(map[string]any)["enabled"].(bool)
	if _, ok, _ := unstructured.NestedFieldNoCopy(dep.Object, "spec", "replicas"); ok == autoscaled {
		t.Errorf("the pusher Deployment sets replicas: %v, its autoscaler is on: %v (with it on, every upgrade would reset the count)", ok, autoscaled)
	}
	hpa := find(objs, "HorizontalPodAutoscaler", pusherName)
	if (hpa != nil) != autoscaled {
		t.Fatalf("autoscaler rendered: %v, enabled: %v", hpa != nil, autoscaled)
	}
	if hpa != nil {
		if pol, _, _ := unstructured.NestedSlice(hpa.Object, "spec", "behavior", "scaleDown", "policies"); len(pol) == 0 {
			t.Error("the autoscaler scales down without a policy: proxies would move all at once")
		}
	}
	if trial, _ := v["trial"].(map[string]any)["enabled"].(bool); trial != (find(objs, "StatefulSet", "sp-etcd") != nil && find(objs, "StatefulSet", "sp-nats") != nil) {
		t.Errorf("trial.enabled %v, but etcd and NATS StatefulSets rendered: %v", trial, !trial)
	}
	for _, part := range []string{"sp-pusher", "sp-ingester"} {
		if budget := strings.Replace(part, "sp-pusher", pusherName, 1); find(objs, "PodDisruptionBudget", budget) == nil {
			t.Errorf("no PodDisruptionBudget for %s", budget)
		}
		if find(objs, "NetworkPolicy", part) == nil {
			t.Errorf("no NetworkPolicy for %s", part)
		}
	}
	spec, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	grace := num(spec, "terminationGracePeriodSeconds")
	if drain := num(v, "pusher", "drainTimeoutSeconds") + num(v, "pusher", "preStopSeconds"); grace <= drain {
		t.Errorf("termination grace %d s, not above preStop + drain %d s", grace, drain)
	}
	if run, _, _ := unstructured.NestedBool(spec, "securityContext", "runAsNonRoot"); !run {
		t.Error("the pusher's pods may run as root")
	}
	c := spec["containers"].([]any)[0].(map[string]any)
	if ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem"); !ro {
		t.Error("the pusher's root filesystem is writable")
	}
	if _, ok := c["startupProbe"]; !ok {
		t.Error("the pusher has no startup probe for a cold load of a large mesh")
	}
	sizing := v["pusher"].(map[string]any)["sizing"].(map[string]any)
	mib := num(sizing, "baseMiB") + num(sizing, "services")*num(sizing, "perServiceKiB")/1024 + num(sizing, "proxiesPerReplica")*num(sizing, "perProxyKiB")/1024
	if got, _, _ := unstructured.NestedString(c, "resources", "requests", "memory"); got != fmt.Sprintf("%dMi", mib) {
		t.Errorf("pusher memory request %s, want %dMi from the sizing formula", got, mib)
	}
	return dep
}

// checkPusherFlags: every pusher flag is set by the chart, or can be (a
// file of a Secret, an override, a shard's namespaces file).
func checkPusherFlags(t *testing.T, dep *unstructured.Unstructured, flags [][]string, helpers, pusherName string) {
	t.Helper()
	c := dep.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	var env []string
	for _, e := range c["env"].([]any) {
		env = append(env, e.(map[string]any)["name"].(string))
	}
	for _, f := range flags {
		// A file of a Secret (TLS, credentials, the admin token)
		// is set only when its Secret is named, an override of
		// the mesh's MeshConfig only when its value is; the chart
		// must still be able to set them.
		if slices.Contains(env, f[1]) || f[1] == "SHARDPILOT_CHECK_FLAGS" {
			continue
		}
		optional := strings.HasSuffix(f[1], "_FILE") || f[1] == "SHARDPILOT_ETCD_USERNAME" || f[1] == "SHARDPILOT_NATS_USER" ||
			f[1] == "SHARDPILOT_AUTO_MTLS" || f[1] == "SHARDPILOT_OUTBOUND_TRAFFIC_POLICY" || f[1] == "SHARDPILOT_ADS_CERT_NAMES" ||
			f[1] == "SHARDPILOT_TOKEN_REVIEW_CLUSTERS" ||
			// A shard reads its namespaces from its file instead.
			f[1] == "SHARDPILOT_NAMESPACES" && pusherName != "sp-pusher"
		if !optional || !strings.Contains(helpers, f[1]) {
			t.Errorf("pusher flag %s is not set by the chart", f[1])
		}
	}
}

// checkStarts runs a command's binary (the pusher's, the ingester's) with
// the environment the chart renders for its Deployment (--check-flags: the
// checks it makes before it starts, no file read): a rendered set of flags
// it refuses would be a pod that exits at its start. Values from Secrets
// and the downward API are placeholders.
func checkStarts(t *testing.T, dep *unstructured.Unstructured, bin string) {
	t.Helper()
	if dep == nil {
		t.Fatalf("%s: no Deployment rendered", filepath.Base(bin))
	}
	c := dep.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	env := []string{"PATH=" + os.Getenv("PATH")}
	for _, e := range c["env"].([]any) {
		e := e.(map[string]any)
		value, ok := e["value"].(string)
		if !ok {
			value = "placeholder"
		}
		env = append(env, e["name"].(string)+"="+value)
	}
	cmd := exec.Command(bin, "--check-flags")
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s refuses the flags the chart renders for %s (its pods would exit at start): %v\n%s", filepath.Base(bin), dep.GetName(), err, out)
	}
}

// checkMountedFiles: every file the commands are pointed at lies in a
// mounted volume.
func checkMountedFiles(t *testing.T, deps ...*unstructured.Unstructured) {
	t.Helper()
	for _, d := range deps {
		ctr := d.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		mounts, _, _ := unstructured.NestedSlice(ctr, "volumeMounts")
		envs, _, _ := unstructured.NestedSlice(ctr, "env")
		for _, e := range envs {
			name, value := e.(map[string]any)["name"].(string), fmt.Sprint(e.(map[string]any)["value"])
			if !strings.HasSuffix(name, "_FILE") {
				continue
			}
			if !slices.ContainsFunc(mounts, func(m any) bool { return strings.HasPrefix(value, m.(map[string]any)["mountPath"].(string)+"/") }) {
				t.Errorf("%s: %s=%s lies in no mounted volume", d.GetName(), name, value)
			}
		}
	}
}

// firstPusher names the pusher Deployment of the values: the unsharded
// one, or the first shard's.
func firstPusher(v map[string]any) string {
	if shards, _ := v["pusher"].(map[string]any)["shards"].([]any); len(shards) > 0 {
		return "sp-pusher-" + shards[0].(map[string]any)["name"].(string)
	}
	return "sp-pusher"
}

// TestChartShards: with pusher.shards, every shard gets its Deployment,
// Service, autoscaler and disruption budget, selecting its own pods and
// serving its namespaces; a namespace in two shards is refused.
func TestChartShards(t *testing.T) {
	h := helm(t)
	chart := filepath.Join("helm", "shardpilot")
	set := "pusher.shards[0].name=pay,pusher.shards[0].namespaces={payments,checkout},pusher.shards[1].name=shop,pusher.shards[1].namespaces={catalog}"
	objs, err := kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", set)))
	if err != nil {
		t.Fatal(err)
	}
	if find(objs, "Deployment", "sp-pusher") != nil {
		t.Error("an unsharded pusher Deployment beside the shards")
	}
	for shard, namespaces := range map[string]string{"pay": "payments,checkout", "shop": "catalog"} {
		name := "sp-pusher-" + shard
		dep, svc, hpa, pdb := find(objs, "Deployment", name), find(objs, "Service", name), find(objs, "HorizontalPodAutoscaler", name), find(objs, "PodDisruptionBudget", name)
		if dep == nil || svc == nil || hpa == nil || pdb == nil {
			t.Fatalf("shard %s: Deployment %v, Service %v, autoscaler %v, disruption budget %v", shard, dep != nil, svc != nil, hpa != nil, pdb != nil)
		}
		// The shard reads its namespaces from its key of the placement.
		envs, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
		if env := fmt.Sprint(envs); !strings.Contains(env, "SHARDPILOT_NAMESPACES_FILE value:/etc/shardpilot/placement/namespaces") {
			t.Errorf("shard %s reads no namespaces file: %.300s", shard, env)
		}
		vols, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "volumes")
		if v := fmt.Sprint(vols); !strings.Contains(v, "name:sp-placement") || !strings.Contains(v, "key:"+shard) {
			t.Errorf("shard %s mounts no placement of its own: %s", shard, v)
		}
		var placement []string
		for _, line := range strings.Split(data(t, find(objs, "ConfigMap", "sp-placement"), shard), "\n") {
			if line != "" && !strings.HasPrefix(line, "#") {
				placement = append(placement, line)
			}
		}
		if got := strings.Join(placement, ","); got != namespaces {
			t.Errorf("shard %s is placed %s, want %s", shard, got, namespaces)
		}
		for what, path := range map[string][]string{"Service": {"spec", "selector"}, "disruption budget": {"spec", "selector", "matchLabels"}} {
			obj := map[string]*unstructured.Unstructured{"Service": svc, "disruption budget": pdb}[what]
			if got, _, _ := unstructured.NestedString(obj.Object, append(path, "shardpilot.io/shard")...); got != shard {
				t.Errorf("shard %s: its %s selects shard %q", shard, what, got)
			}
		}
		if got, _, _ := unstructured.NestedString(dep.Object, "spec", "template", "metadata", "labels", "shardpilot.io/shard"); got != shard {
			t.Errorf("shard %s: pods labelled %q", shard, got)
		}
		if got, _, _ := unstructured.NestedString(hpa.Object, "spec", "scaleTargetRef", "name"); got != name {
			t.Errorf("shard %s: the autoscaler scales %s", shard, got)
		}
		// A Service per namespace selects its shard's pods.
		for _, ns := range strings.Split(namespaces, ",") {
			svc := find(objs, "Service", "sp-xds-"+ns)
			if svc == nil {
				t.Fatalf("no Service for namespace %s", ns)
			}
			if got, _, _ := unstructured.NestedString(svc.Object, "spec", "selector", "shardpilot.io/shard"); got != shard {
				t.Errorf("namespace %s's Service selects shard %q, want %s", ns, got, shard)
			}
		}
	}
	// Adding a shard that takes checkout from pay changes the placement and
	// checkout's Service, and no pod template of the shards before it: none
	// restarts, and pay's proxies of payments keep their streams.
	added, err := kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", set+",pusher.shards[0].namespaces={payments},pusher.shards[2].name=checkout,pusher.shards[2].namespaces={checkout}")))
	if err != nil {
		t.Fatal(err)
	}
	for _, shard := range []string{"pay", "shop"} {
		before, _, _ := unstructured.NestedMap(find(objs, "Deployment", "sp-pusher-"+shard).Object, "spec", "template")
		after, _, _ := unstructured.NestedMap(find(added, "Deployment", "sp-pusher-"+shard).Object, "spec", "template")
		if !reflect.DeepEqual(before, after) {
			t.Errorf("adding a shard changes shard %s's pod template: its pods would restart", shard)
		}
	}
	if got, _, _ := unstructured.NestedString(find(added, "Service", "sp-xds-checkout").Object, "spec", "selector", "shardpilot.io/shard"); got != "checkout" {
		t.Errorf("checkout's Service selects shard %q after it moved, want checkout", got)
	}
	if got := data(t, find(added, "ConfigMap", "sp-placement"), "pay"); strings.Contains(got, "checkout") {
		t.Errorf("pay is still placed checkout: %q", got)
	}
	// With injection, pods are pointed at their namespace's Service, and
	// only the namespaces of a shard are selected.
	injected, err := kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--namespace", "sp", "--set", set+",injection.enabled=true,pusher.ads.tls.secretName=t")))
	if err != nil {
		t.Fatal(err)
	}
	hook := find(injected, "MutatingWebhookConfiguration", "sp-discovery-address")
	if got := fmt.Sprint(hook.Object["webhooks"].([]any)[0].(map[string]any)["namespaceSelector"]); got !=
		"map[matchExpressions:[map[key:kubernetes.io/metadata.name operator:In values:[payments checkout catalog]]] matchLabels:map[shardpilot.io/discovery:enabled]]" {
		t.Errorf("the webhook selects namespaces %s, want the labelled ones of a shard", got)
	}
	if env := fmt.Sprint(find(injected, "Deployment", "sp-ingester").Object["spec"]); !strings.Contains(env, "SHARDPILOT_INJECT_DISCOVERY_ADDRESS value:sp-xds-{namespace}.sp.svc:15012") {
		t.Errorf("the ingesters do not point pods at their namespace's Service: %.2000s", env)
	}
	out, err := exec.Command(h, "template", "sp", chart, "--set", "pusher.shards[0].name=a,pusher.shards[0].namespaces={x},pusher.shards[1].name=b,pusher.shards[1].namespaces={x}").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "namespace x is in shards a and b") {
		t.Errorf("a namespace in two shards: %v\n%s", err, out)
	}
}

// data returns a key of a ConfigMap ("" when it has none).
func data(t *testing.T, cm *unstructured.Unstructured, key string) string {
	t.Helper()
	if cm == nil {
		t.Fatal("no ConfigMap")
	}
	v, _, _ := unstructured.NestedString(cm.Object, "data", key)
	return v
}

// TestChartCASeal: with authenticated proxies and no CA Secret, the chart
// makes a seal key (one the pushers can read, kept on uninstall) and the
// pushers alone mount it; with a CA Secret it makes none.
func TestChartCASeal(t *testing.T) {
	h := helm(t)
	chart := filepath.Join("helm", "shardpilot")
	objs, err := kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", "pusher.ads.tls.secretName=ads,pusher.ads.ca.trustConfigMap=roots")))
	if err != nil {
		t.Fatal(err)
	}
	secret := find(objs, "Secret", "sp-ca-seal")
	if secret == nil {
		t.Fatal("no seal key Secret")
	}
	if secret.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
		t.Error("the seal key would be deleted on uninstall, and the root sealed with it lost")
	}
	encoded, _, _ := unstructured.NestedString(secret.Object, "data", "seal.key")
	key, err := base64.StdEncoding.DecodeString(encoded)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "seal.key")
	if err := os.WriteFile(file, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ca.ReadSealKeys(file); err != nil {
		t.Errorf("the pushers cannot read the chart's seal key: %v", err)
	}
	pusher, ingester := find(objs, "Deployment", "sp-pusher").Object, find(objs, "Deployment", "sp-ingester").Object
	for part, obj := range map[string]map[string]any{"pusher": pusher, "ingester": ingester} {
		vols, _, _ := unstructured.NestedSlice(obj, "spec", "template", "spec", "volumes")
		mounts := slices.ContainsFunc(vols, func(v any) bool {
			got, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName")
			return got == "sp-ca-seal"
		})
		if mounts != (part == "pusher") {
			t.Errorf("the %s mounts the seal key: %v", part, mounts)
		}
	}
	ctr, _, _ := unstructured.NestedSlice(pusher, "spec", "template", "spec", "containers")
	env := fmt.Sprint(ctr[0].(map[string]any)["env"])
	for _, want := range []string{"SHARDPILOT_CA_SEAL_KEY_FILE", "SHARDPILOT_CA_TRUST_FILE"} {
		if !strings.Contains(env, want) {
			t.Errorf("the pusher is not given %s", want)
		}
	}

	objs, err = kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", "pusher.ads.tls.secretName=ads,pusher.ads.ca.secretName=ca")))
	if err != nil {
		t.Fatal(err)
	}
	if find(objs, "Secret", "sp-ca-seal") != nil {
		t.Error("a seal key is made beside the operator's CA")
	}
}
