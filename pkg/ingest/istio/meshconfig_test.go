package istio_test

import (
	"strings"
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
)

func meshInput(text string) istio.Input {
	return istio.Input{Location: "mesh.yaml", Resource: istio.Resource{APIVersion: "v1", Kind: istio.KindConfigMap,
		Metadata: istio.Metadata{Name: "istio", Namespace: "istio-system"}, Data: map[string]string{"mesh": text}}}
}

// TestMeshConfigRejects: settings that cannot be read are a problem that
// keeps the settings in effect, saying what and where; an unknown field is
// warned and the rest applies.
func TestMeshConfigRejects(t *testing.T) {
	for _, c := range []struct{ name, mesh, want string }{
		{"malformed", "connectTimeout: [", "data.mesh: malformed YAML"},
		{"not a mapping", "- a", "the settings must be a mapping"},
		{"alias", "a: &x 1s\nconnectTimeout: *x", "line 1: anchors and aliases"},
		{"type", "enableAutoMtls: sometimes", "not Istio's MeshConfig"},
		{"duration", "connectTimeout: soon", `data.mesh: connectTimeout: "soon" is not a duration`},
		{"nested duration", "defaultHttpRetryPolicy: {attempts: 2, perTryTimeout: 1 hour}", `defaultHttpRetryPolicy.perTryTimeout: "1 hour"`},
		{"retries", "defaultHttpRetryPolicy: {attempts: -1}", "data.mesh.defaultHttpRetryPolicy.attempts: -1 is negative"},
		{"locality", "localityLbSetting: {distribute: [{from: us, to: {eu: 50}}]}", "the weights add up to 50"},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs, problems := istio.Normalize([]istio.Input{meshInput(c.mesh)}, istio.Options{})
			if len(objs) != 0 || len(problems) != 1 || !strings.Contains(problems[0].Error(), c.want) || problems[0].Keep == nil || problems[0].Warning {
				t.Fatalf("objects %v, problems %v; want one problem keeping the settings, saying %q", objs, problems, c.want)
			}
		})
	}
	t.Run("missing key", func(t *testing.T) {
		in := meshInput("")
		in.Resource.Data = map[string]string{"meshNetworks": ""}
		if _, problems := istio.Normalize([]istio.Input{in}, istio.Options{}); len(problems) != 1 || !strings.Contains(problems[0].Error(), "settings are missing") {
			t.Fatalf("problems %v", problems)
		}
	})
	t.Run("unknown field", func(t *testing.T) {
		objs, problems := istio.Normalize([]istio.Input{meshInput("connectTimeout: 1m30s\nconectTimeout: 2s")}, istio.Options{})
		if len(problems) != 1 || !problems[0].Warning || !strings.Contains(problems[0].Error(), "data.mesh.conectTimeout: not a field of Istio's MeshConfig") {
			t.Fatalf("problems %v", problems)
		}
		if len(objs) != 1 || objs[0].Object.(*meshv1.MeshConfig).ConnectTimeout.AsDuration().Seconds() != 90 {
			t.Fatalf("objects %v: want connectTimeout 90s applied", objs)
		}
	})
	t.Run("unknown fields, nested too", func(t *testing.T) {
		objs, problems := istio.Normalize([]istio.Input{meshInput("conectTimeout: 2s\ndefaultHttpRetryPolicy: {attempts: 3, atempts: 4}")}, istio.Options{})
		var got []string
		for _, p := range problems {
			got = append(got, p.Error())
		}
		if len(problems) != 2 || !strings.Contains(got[0], "data.mesh.conectTimeout: not a field") ||
			!strings.Contains(got[1], "data.mesh.defaultHttpRetryPolicy.atempts: not a field") {
			t.Fatalf("problems %v: want each unknown field named", got)
		}
		if len(objs) != 1 || objs[0].Object.(*meshv1.MeshConfig).GetDefaultHttpRetry().GetAttempts() != 3 {
			t.Fatalf("objects %v: want the rest applied", objs)
		}
	})
	t.Run("empty", func(t *testing.T) {
		objs, problems := istio.Normalize([]istio.Input{meshInput("")}, istio.Options{})
		if len(problems) != 0 || len(objs) != 1 {
			t.Fatalf("objects %v, problems %v: empty settings are istiod's defaults", objs, problems)
		}
	})
	t.Run("mode left out", func(t *testing.T) {
		objs, _ := istio.Normalize([]istio.Input{meshInput("outboundTrafficPolicy: {}")}, istio.Options{})
		if got := objs[0].Object.(*meshv1.MeshConfig).OutboundTrafficPolicy; got != meshv1.OutboundPolicy_OUTBOUND_POLICY_UNSET {
			t.Fatalf("outbound policy %v: a policy naming no mode keeps the default", got)
		}
	})
}

// TestMeshConfigTelemetryProviders: the providers shardpilot sends are
// read (a JSON access log's labels, an OTLP/HTTP exporter's path and
// timeout), the settings they lack are warned in a stable order, an HTTP
// exporter without its required path is refused, and a provider of
// another kind is warned of.
func TestMeshConfigTelemetryProviders(t *testing.T) {
	const providers = `extensionProviders:
- name: json
  envoyFileAccessLog: {path: /dev/stdout, logFormat: {labels: {code: "%RESPONSE_CODE%"}}}
- name: otel
  opentelemetry:
    service: observability/collector.observability.svc.cluster.local
    port: 4318
    http: {path: /v1/traces, timeout: 2s, headers: [{name: x, value: y}]}
    resourceDetectors: {environment: {}}
- name: dd
  datadog: {service: dd.svc, port: 8126}
`
	for range 3 {
		objs, problems := istio.Normalize([]istio.Input{meshInput(providers)}, istio.Options{})
		var got []string
		for _, p := range problems {
			got = append(got, p.Error())
		}
		want := []string{"opentelemetry.resourceDetectors: not supported yet", "opentelemetry.http.headers: not supported yet", `provider "dd" (Datadog) is not sent`}
		if len(got) != len(want) {
			t.Fatalf("problems %q, want %q", got, want)
		}
		for i := range want {
			if !strings.Contains(got[i], want[i]) {
				t.Errorf("problem %d %q, want %q", i, got[i], want[i])
			}
		}
		m := objs[0].Object.(*meshv1.MeshConfig)
		if p := m.TelemetryProviders; len(p) != 2 || p[0].GetFileAccessLog().GetLabels().GetFields()["code"].GetStringValue() != "%RESPONSE_CODE%" ||
			p[1].GetOtelTracing().GetHttpPath() != "/v1/traces" || p[1].GetOtelTracing().GetHttpTimeout().AsDuration().Seconds() != 2 ||
			p[1].GetOtelTracing().GetCollector().GetHost() != "collector.observability.svc.cluster.local" {
			t.Fatalf("providers %v", p)
		}
	}
	_, problems := istio.Normalize([]istio.Input{meshInput("extensionProviders: [{name: otel, opentelemetry: {service: c.svc, port: 4318, http: {}}}]")}, istio.Options{})
	if len(problems) != 1 || problems[0].Warning || !strings.Contains(problems[0].Error(), "opentelemetry.http.path: a path is required") {
		t.Fatalf("problems %v: want the missing path refused", problems)
	}
}
