package deploy_test

import (
	"cmp"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/version"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// checkSchema: values that cannot work are refused with what to change,
// and valid values the schema once refused are taken.
func checkSchema(t *testing.T, h, chart string) {
	t.Helper()
	// Values that cannot work are refused with what to change.
	for set, want := range map[string]string{
		"etcd.tls.secretName=etcd-tls":                   "etcd.endpoints must be https://",
		"nats.auth.type=creds":                           "nats.auth.secretName",
		"etcd.auth.username=root":                        "etcd.auth.secretName",
		"nats.auth.type=password,nats.auth.secretName=s": "nats.auth.user",
		"pusher.ads.ca.secretName=ca":                    "pusher.ads.tls.secretName",
		"pusher.ads.ca.sealSecretName=seal":              "pusher.ads.tls.secretName",
		"etcd.auth.roles.enabled=true":                   "etcd.auth.roles.secretName",
		"etcd.auth.roles.enabled=true,etcd.auth.roles.secretName=s,etcd.auth.username=u": "alternatives",
		"etcd.auth.roles.enabled=true,etcd.auth.roles.secretName=s":                      "etcd.auth.roles.rootSecretName",
		"nats.auth.type=token":               "/nats/auth/type",
		"injection.enabled=true":             "injection.enabled: Istio's agents dial ADS and the CA over TLS",
		"imagePullSecrets[0].secret=regcred": "/imagePullSecrets/0",
		"pusher.autoscaling.minReplicas=5,pusher.autoscaling.maxReplicas=2": "minReplicas 5 is above maxReplicas 2",
		"etcd.endpoints=etcd:2379":        "/etcd/endpoints",
		"pusher.resources.limits.cpu=abc": "/pusher/resources/limits/cpu",
		"extraEnv[0].value=x":             "/extraEnv/0",
		"pusher.ads.remoteClusters[0].clusterID=east,pusher.ads.remoteClusters[0].secretName=s": "set pusher.ads.tokens",
	} {
		out, err := exec.Command(h, "template", "sp", chart, "--set", set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), want) {
			t.Errorf("helm template --set %s: %v, want an error naming %s:\n%.500s", set, err, want, out)
		}
	}

	// Valid values the schema once refused.
	for _, set := range []string{"pusher.debounce.maxHold=1m30s", "pusher.resources.requests.cpu=500m", "etcd.endpoints=https://a:2379\\,https://b:2379"} {
		if out, err := exec.Command(h, "template", "sp", chart, "--set", set).CombinedOutput(); err != nil {
			t.Errorf("helm template --set %s: %v\n%.500s", set, err, out)
		}
	}
}

// checkSecured: with the secured example, each part signs in to etcd and
// NATS with credentials of its own.
func checkSecured(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	// Each part signs in to etcd as its own user, with its own
	// password alone; a hook Job makes the users first.
	for part, key := range map[string]string{"sp-pusher": "pusher", "sp-ingester": "ingester"} {
		d := find(objs, "Deployment", part)
		vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
		if !slices.ContainsFunc(vols, func(v any) bool {
			items, _, _ := unstructured.NestedSlice(v.(map[string]any), "secret", "items")
			return v.(map[string]any)["name"] == "etcd-auth" && len(items) == 1 && items[0].(map[string]any)["key"] == key
		}) {
			t.Errorf("%s does not mount its etcd password alone: %v", part, vols)
		}
		ctr := d.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		envs, _, _ := unstructured.NestedSlice(ctr, "env")
		if !slices.ContainsFunc(envs, func(e any) bool {
			return e.(map[string]any)["name"] == "SHARDPILOT_ETCD_USERNAME" && e.(map[string]any)["value"] == "shardpilot-"+key
		}) {
			t.Errorf("%s does not sign in to etcd as shardpilot-%s", part, key)
		}
	}
	job := find(objs, "Job", "sp-etcd-roles")
	if job == nil {
		t.Fatal("no Job making the etcd users")
	}
	if hook := job.GetAnnotations()["helm.sh/hook"]; hook != "pre-install,pre-upgrade" {
		t.Errorf("the etcd users' Job runs at %q, want before install and upgrade", hook)
	}
	// Pushers sign in to NATS with credentials of their own.
	for part, secret := range map[string]string{"sp-pusher": "shardpilot-nats-pusher", "sp-ingester": "shardpilot-nats-ingester"} {
		vols, _, _ := unstructured.NestedSlice(find(objs, "Deployment", part).Object, "spec", "template", "spec", "volumes")
		if !slices.ContainsFunc(vols, func(v any) bool {
			got, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName")
			return v.(map[string]any)["name"] == "nats-auth" && got == secret
		}) {
			t.Errorf("%s does not sign in to NATS with %s: %v", part, secret, vols)
		}
	}
}

// checkServed: ADS is served on the port its mode names, every object has
// the standard labels, and the istio and knobs cases get what they set.
func checkServed(t *testing.T, name string, objs []*unstructured.Unstructured, v map[string]any, ns string) {
	t.Helper()
	// ADS over TLS on Istio's 15012; 15010 in plaintext alone.
	tlsOn := v["pusher"].(map[string]any)["ads"].(map[string]any)["tls"].(map[string]any)["secretName"] != ""
	ports, _, _ := unstructured.NestedSlice(find(objs, "Service", firstPusher(v)).Object, "spec", "ports")
	if got := fmt.Sprint(ports[0].(map[string]any)["port"]); got != map[bool]string{true: "15012", false: "15010"}[tlsOn] {
		t.Errorf("the pushers' Service serves ADS on %s (TLS: %v)", got, tlsOn)
	}
	if name == "istio" {
		checkInjection(t, objs, ns)
	}
	if name == "knobs" {
		checkPodKnobs(t, objs)
	}
	checkAdminToken(t, objs, v)
	// The standard labels, so that tools and two releases tell
	// each other's objects apart.
	for _, obj := range objs {
		l := obj.GetLabels()
		if l["app.kubernetes.io/name"] != "shardpilot" || l["app.kubernetes.io/instance"] != "sp" || l["app.kubernetes.io/version"] == "" {
			t.Errorf("%s %s: labels %v, want app.kubernetes.io/name, instance and version", obj.GetKind(), obj.GetName(), l)
		}
	}
}

// checkAdminToken: /debug/ and the status page answer a token alone,
// loopback included (kubectl port-forward arrives from loopback), and the
// token is there without a value given: the chart makes its Secret.
func checkAdminToken(t *testing.T, objs []*unstructured.Unstructured, v map[string]any) {
	t.Helper()
	secret, _ := v["adminToken"].(map[string]any)["secretName"].(string)
	if secret == "" {
		secret = "sp-admin-token"
		s := find(objs, "Secret", secret)
		if s == nil {
			t.Fatalf("no admin token Secret %s made", secret)
		}
		tok, _, _ := unstructured.NestedString(s.Object, "data", "token")
		if b, err := base64.StdEncoding.DecodeString(tok); err != nil || telemetry.CheckToken(string(b)) != nil {
			t.Errorf("the admin token the chart makes is refused: %v %v", err, telemetry.CheckToken(string(b)))
		}
	}
	for _, d := range objs {
		if d.GetKind() != "Deployment" {
			continue
		}
		tmpl := fmt.Sprint(d.Object["spec"].(map[string]any)["template"])
		for _, want := range []string{"secretName:" + secret, "name:SHARDPILOT_ADMIN_TOKEN_ON_LOOPBACK value:true", "name:SHARDPILOT_ADMIN_TOKEN_FILE value:/etc/shardpilot/admin/token"} {
			if !strings.Contains(tmpl, want) {
				t.Errorf("%s: no %s in its pod template", d.GetName(), want)
			}
		}
	}
}

// checkNotes: NOTES warn of plaintext ADS and of trial mode, when so.
func checkNotes(t *testing.T, out string, v map[string]any) {
	t.Helper()
	tlsSecret := v["pusher"].(map[string]any)["ads"].(map[string]any)["tls"].(map[string]any)["secretName"]
	trial, _ := v["trial"].(map[string]any)["enabled"].(bool)
	if got := strings.Contains(out, "WARNING: ADS is served in plaintext"); got != (tlsSecret == "") {
		t.Errorf("NOTES warn of plaintext ADS: %v, with TLS Secret %q", got, tlsSecret)
	}
	if got := strings.Contains(out, "WARNING: trial mode"); got != trial {
		t.Errorf("NOTES warn of trial mode: %v, trial %v", got, trial)
	}
}

// checkPodKnobs: every pod knob of values-knobs.yaml reaches the pods of
// both parts.
func checkPodKnobs(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, d := range []string{"sp-pusher", "sp-ingester"} {
		tmpl, _, _ := unstructured.NestedMap(find(objs, "Deployment", d).Object, "spec", "template")
		got := fmt.Sprint(tmpl)
		for _, want := range []string{"imagePullSecrets:[map[name:regcred]]", "nodeSelector:map[kubernetes.io/os:linux]", "key:dedicated",
			"nodeAffinity", "priorityClassName:system-cluster-critical", "annotations:map[example.com/team:mesh]", "team:mesh", "name:GODEBUG"} {
			if !strings.Contains(got, want) {
				t.Errorf("%s: no %s in its pod template", d, want)
			}
		}
	}
}

// checkInjection: the discovery-address webhook is served by the
// ingesters on the port their Service names, with a certificate for that
// Service which the webhook's caBundle verifies, and points pods at the
// pushers' TLS port.
func checkInjection(t *testing.T, objs []*unstructured.Unstructured, ns string) {
	t.Helper()
	hook := find(objs, "MutatingWebhookConfiguration", "sp-discovery-address")
	if hook == nil {
		t.Fatal("no MutatingWebhookConfiguration")
	}
	wh := hook.Object["webhooks"].([]any)[0].(map[string]any)
	svc, _, _ := unstructured.NestedMap(wh, "clientConfig", "service")
	if fmt.Sprintf("%v %v %v", svc["name"], svc["port"], svc["path"]) != "sp-ingester 15017 /inject" {
		t.Errorf("the webhook is called at %v, want the ingesters' Service, port 15017, /inject", svc)
	}
	ports, _, _ := unstructured.NestedSlice(find(objs, "Service", "sp-ingester").Object, "spec", "ports")
	if !slices.ContainsFunc(ports, func(p any) bool { return fmt.Sprint(p.(map[string]any)["port"]) == "15017" }) {
		t.Errorf("the ingesters' Service has no port 15017: %v", ports)
	}
	secret := find(objs, "Secret", "sp-inject-tls")
	if secret == nil {
		t.Fatal("no Secret with the webhook's certificate")
	}
	der := func(key string) []byte {
		b, err := base64.StdEncoding.DecodeString(fmt.Sprint(secret.Object["data"].(map[string]any)[key]))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bundle, err := base64.StdEncoding.DecodeString(fmt.Sprint(wh["clientConfig"].(map[string]any)["caBundle"]))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	block, _ := pem.Decode(der("tls.crt"))
	if !roots.AppendCertsFromPEM(bundle) || block == nil {
		t.Fatal("no certificate in the caBundle or the Secret")
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "sp-ingester." + ns + ".svc"}); err != nil {
		t.Errorf("the caBundle does not verify the webhook's certificate for its Service: %v", err)
	}
	ctr := find(objs, "Deployment", "sp-ingester").Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	envs, _, _ := unstructured.NestedSlice(ctr, "env")
	if !slices.ContainsFunc(envs, func(e any) bool {
		return e.(map[string]any)["name"] == "SHARDPILOT_INJECT_DISCOVERY_ADDRESS" && e.(map[string]any)["value"] == "sp-pusher."+ns+".svc:15012"
	}) {
		t.Errorf("the ingesters do not point pods at sp-pusher.%s.svc:15012: %v", ns, envs)
	}
}

// TestChartMonitoring: the ServiceMonitors and the PrometheusRule carry the
// labels the Prometheus operator's selectors look for, and a
// ServiceMonitor selects its own release's Services alone.
func TestChartMonitoring(t *testing.T) {
	h := helm(t)
	out := run(t, h, "template", "sp", filepath.Join("helm", "shardpilot"), "--set",
		"serviceMonitor.enabled=true,serviceMonitor.labels.release=kps,prometheusRule.enabled=true,prometheusRule.labels.release=kps")
	objs, err := kubetest.Decode([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	for kind, names := range map[string][]string{"ServiceMonitor": {"sp-pusher", "sp-ingester"}, "PrometheusRule": {"sp"}} {
		for _, name := range names {
			obj := find(objs, kind, name)
			if obj == nil {
				t.Fatalf("no %s %s", kind, name)
			}
			if obj.GetLabels()["release"] != "kps" {
				t.Errorf("%s %s: labels %v, want release: kps", kind, name, obj.GetLabels())
			}
			if kind == "ServiceMonitor" {
				if got, _, _ := unstructured.NestedString(obj.Object, "spec", "selector", "matchLabels", "app.kubernetes.io/instance"); got != "sp" {
					t.Errorf("ServiceMonitor %s selects the Services of release %q, want sp's alone", name, got)
				}
			}
		}
	}
}

// TestChartRunbooks: every alert's runbook_url is prometheusRule.runbookBaseURL
// with the alert's anchor, a heading of docs/runbooks.md.
func TestChartRunbooks(t *testing.T) {
	h := helm(t)
	runbooks, err := os.ReadFile(filepath.Join("..", "docs", "runbooks.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{"", "https://wiki.example.com/mesh/runbooks"} {
		set := "prometheusRule.enabled=true"
		if base != "" {
			set += ",prometheusRule.runbookBaseURL=" + base
		}
		out := run(t, h, "template", "sp", filepath.Join("helm", "shardpilot"), "--set", set)
		urls := regexp.MustCompile(`runbook_url: (\S+)`).FindAllStringSubmatch(out, -1)
		if len(urls) == 0 {
			t.Fatal("no runbook_url")
		}
		for _, u := range urls {
			page, anchor, _ := strings.Cut(u[1], "#")
			if want := cmp.Or(base, "https://github.com/shardpilot/shardpilot/blob/main/docs/runbooks.md"); page != want {
				t.Errorf("runbook_url %s, want it at %s", u[1], want)
			}
			if !regexp.MustCompile(`(?mi)^## ` + anchor + `$`).Match(runbooks) {
				t.Errorf("runbook_url %s: docs/runbooks.md has no heading %s", u[1], anchor)
			}
		}
	}
}

// prometheusRule renders the chart with args and returns its
// PrometheusRule.
func prometheusRule(t *testing.T, h string, args ...string) *unstructured.Unstructured {
	t.Helper()
	objs, err := kubetest.Decode([]byte(run(t, h, append([]string{"template", "sp", filepath.Join("helm", "shardpilot")}, args...)...)))
	if err != nil {
		t.Fatal(err)
	}
	rule := find(objs, "PrometheusRule", "sp")
	if rule == nil {
		t.Fatal("no PrometheusRule")
	}
	return rule
}

// TestChartAlertScope: with prometheusRule.scopeLabel, every metric an
// alert reads is this release's (its namespace's), the group and the alerts
// name the release, and the rules still pass promtool.
func TestChartAlertScope(t *testing.T) {
	h := helm(t)
	rule := prometheusRule(t, h, "--namespace", "mesh", "--set", "prometheusRule.enabled=true,prometheusRule.scopeLabel=namespace")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	for _, g := range groups {
		if name := g.(map[string]any)["name"]; name != "shardpilot-mesh-sp" {
			t.Errorf("group %v, want it named after the release", name)
		}
		for _, r := range g.(map[string]any)["rules"].([]any) {
			r := r.(map[string]any)
			expr := fmt.Sprint(r["expr"])
			for _, sel := range regexp.MustCompile(`(shardpilot_[a-z0-9_]+|\bup)(\{[^}]*\})?`).FindAllStringSubmatch(expr, -1) {
				if !strings.Contains(sel[2], `namespace="mesh"`) {
					t.Errorf("%s: %s reads every release's metrics: %s", r["alert"], sel[0], expr)
				}
			}
			if r["labels"].(map[string]any)["shardpilot_release"] != "sp" {
				t.Errorf("%s: labels %v, want shardpilot_release: sp", r["alert"], r["labels"])
			}
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("no promtool on PATH (apt-get install prometheus)")
	}
	spec, err := yaml.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, spec, 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, promtool, "check", "rules", file)
}

// TestChartRevisions: two releases of one cluster, the running one and a
// canary with a revision, each have a webhook of their own that selects
// its own namespaces (the canary's: shardpilot.io/rev=canary), and every
// object of the canary carries its revision.
func TestChartRevisions(t *testing.T) {
	h := helm(t)
	migration := filepath.Join("helm", "examples", "values-istio-migration.yaml")
	selectors := map[string]string{}
	for _, r := range []struct{ release, revision string }{{"sp", ""}, {"sp-canary", "canary"}} {
		out := run(t, h, "template", r.release, filepath.Join("helm", "shardpilot"), "-f", migration, "--set", "revision="+r.revision)
		objs, err := kubetest.Decode([]byte(out))
		if err != nil {
			t.Fatal(err)
		}
		hook := find(objs, "MutatingWebhookConfiguration", r.release+"-discovery-address")
		if hook == nil {
			t.Fatalf("%s: no webhook of its own", r.release)
		}
		sel, _, _ := unstructured.NestedMap(hook.Object["webhooks"].([]any)[0].(map[string]any), "namespaceSelector")
		selectors[r.release] = fmt.Sprint(sel)
		if r.revision == "" {
			continue
		}
		if want := "map[matchLabels:map[shardpilot.io/rev:canary]]"; selectors[r.release] != want {
			t.Errorf("the canary's webhook selects %s, want %s", selectors[r.release], want)
		}
		for _, o := range objs {
			if o.GetLabels()["shardpilot.io/rev"] != "canary" {
				t.Errorf("%s %s: labels %v, want shardpilot.io/rev: canary", o.GetKind(), o.GetName(), o.GetLabels())
			}
		}
	}
	if selectors["sp"] == selectors["sp-canary"] {
		t.Errorf("both releases' webhooks select %s", selectors["sp"])
	}
}

// TestChartAlertThresholds: prometheusRule.alerts changes an alert's
// threshold, for and severity; an alert that does not exist, and a for
// that is no duration, are refused with the reason.
func TestChartAlertThresholds(t *testing.T) {
	h := helm(t)
	chart := filepath.Join("helm", "shardpilot")
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("prometheusRule:\n  enabled: true\n  alerts:\n"+
		"    ShardpilotConvergenceSlow: {threshold: 2.5, for: 5m}\n    ShardpilotPusherStale: {severity: warning}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rule := prometheusRule(t, h, "-f", values)
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	got := map[string]string{}
	for _, r := range groups[0].(map[string]any)["rules"].([]any) {
		m := r.(map[string]any)
		expr := m["expr"].(string)
		got[m["alert"].(string)] = fmt.Sprint(expr[strings.LastIndex(expr, " ")+1:], " ", m["for"], " ", m["labels"].(map[string]any)["severity"])
	}
	for alert, want := range map[string]string{"ShardpilotConvergenceSlow": "2.5 5m warning", "ShardpilotPusherStale": "30 1m warning", "ShardpilotNACKs": "0.01 10m warning"} {
		if got[alert] != want {
			t.Errorf("%s: threshold, for and severity %q, want %q", alert, got[alert], want)
		}
	}
	for set, says := range map[string]string{
		"prometheusRule.alerts.Nope.threshold=1":        "prometheusRule.alerts.Nope: no such alert",
		"prometheusRule.alerts.ShardpilotNACKs.for=ten": "does not match pattern",
	} {
		out, err := exec.Command(h, "template", "sp", chart, "--set", "prometheusRule.enabled=true,"+set).CombinedOutput()
		if err == nil || !strings.Contains(string(out), says) {
			t.Errorf("--set %s: %v %s, want refused saying %q", set, err, out, says)
		}
	}
}

// TestVersion: the chart's version and appVersion (the image tag it pulls
// by default) are the release the commands report, so is the newest
// heading of the changelog, and make image tags the image so.
func TestVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("helm", "shardpilot", "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		t.Fatal(err)
	}
	if chart.AppVersion != version.Release || chart.Version != version.Release {
		t.Errorf("the chart's version is %q and appVersion %q, the commands' release %q", chart.Version, chart.AppVersion, version.Release)
	}
	changes, err := os.ReadFile(filepath.Join("..", "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	if newest := regexp.MustCompile(`(?m)^## (\S+)`).FindSubmatch(changes); newest == nil || string(newest[1]) != version.Release {
		t.Errorf("CHANGELOG.md's newest release is %q, the commands' %q", newest, version.Release)
	}
	out, err := exec.Command("make", "-C", "..", "-n", "image").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "shardpilot:"+version.Release+" ") {
		t.Errorf("make image does not tag the image with the release %s: %v\n%s", version.Release, err, out)
	}
}
