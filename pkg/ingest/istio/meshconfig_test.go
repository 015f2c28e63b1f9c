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
