package istio_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/golden"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/ingest/yamldir"
)

// TestNormalize normalizes every kind and reports every broken input; the
// expected objects and problems are in testdata/normalized.json.
func TestNormalize(t *testing.T) {
	inputs, problems, err := yamldir.Read("testdata/mesh", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 0 {
		t.Fatalf("reading: %v", problems)
	}
	objs, problems := istio.Normalize(inputs, istio.Options{Shard: "yaml"})
	type object struct {
		Key    string `json:"key"`
		Object any    `json:"object"`
	}
	out := struct {
		Objects  []object `json:"objects"`
		Problems []string `json:"problems"`
	}{}
	for _, o := range objs {
		out.Objects = append(out.Objects, object{o.Key.String(), golden.Proto(t, o.Object)})
	}
	for _, p := range problems {
		out.Problems = append(out.Problems, p.Error())
	}
	golden.Check(t, "normalized.json", golden.JSON(t, out))
}

// TestNormalizeSameInputSameOutput: the normalizer is deterministic, which
// is what lets the ingester skip writes on resync.
func TestNormalizeSameInputSameOutput(t *testing.T) {
	inputs, _, err := yamldir.Read("testdata/mesh", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := istio.Normalize(inputs, istio.Options{})
	b, _ := istio.Normalize(inputs, istio.Options{})
	if string(golden.JSON(t, a)) != string(golden.JSON(t, b)) {
		t.Error("two normalizations of the same input differ")
	}
}

// TestWorkloadGroups: where workloads are registered a WorkloadGroup is
// checked (a template is required, its labels must be Kubernetes labels,
// a probe is warned of); elsewhere it is warned of. An auto-registered
// WorkloadEntry's name holds its address, dots and all.
func TestWorkloadGroups(t *testing.T) {
	group := func(name, spec string) istio.Input {
		return istio.Input{Location: "wg " + name, Resource: istio.Resource{APIVersion: "networking.istio.io/v1", Kind: "WorkloadGroup",
			Metadata: istio.Metadata{Name: name, Namespace: "vms"}, Spec: []byte(spec)}}
	}
	inputs := []istio.Input{
		group("fine", `{"metadata": {"labels": {"app": "vm"}}, "template": {"serviceAccount": "vm"}}`),
		group("no-template", `{"metadata": {"labels": {"app": "vm"}}}`),
		group("bad-labels", `{"metadata": {"labels": {"app": "a b"}}, "template": {}}`),
		group("probed", `{"template": {}, "probe": {"httpGet": {"port": 8080}}}`),
		group("misspelled", `{"templat": {}}`),
		{Location: "we", Resource: istio.Resource{APIVersion: "networking.istio.io/v1", Kind: "WorkloadEntry",
			Metadata: istio.Metadata{Name: "fine-10.0.0.7", Namespace: "vms"}, Spec: []byte(`{"address": "10.0.0.7", "labels": {"app": "vm"}}`)}},
	}
	for registration, want := range map[bool][]string{
		true: {
			`wg no-template (WorkloadGroup vms/no-template): spec.template: a template is required`,
			`wg bad-labels (WorkloadGroup vms/bad-labels): spec.metadata.labels: label app value "a b": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')`,
			`wg probed (WorkloadGroup vms/probed): warning: spec.probe: not supported: registered workloads are served healthy, their readiness not probed`,
			`wg misspelled (WorkloadGroup vms/misspelled): warning: spec: unknown field "templat": ignored (not a field of WorkloadGroup networking.istio.io/v1; the rest applies)`,
			`wg misspelled (WorkloadGroup vms/misspelled): spec.template: a template is required`,
		},
		false: {
			`wg fine (WorkloadGroup vms/fine): warning: spec: workloads are not registered from this source: auto-registration needs the Kubernetes source and the bus; write a WorkloadEntry per VM (its template's labels and service account)`,
		},
	} {
		_, problems := istio.Normalize(inputs, istio.Options{Registration: registration})
		got := problemTexts(problems)
		for _, w := range want {
			if !slices.Contains(got, w) {
				t.Errorf("registration %v: problems\n%s\nwant among them\n%s", registration, strings.Join(got, "\n"), w)
			}
		}
		for _, g := range got {
			if strings.Contains(g, "(WorkloadEntry ") || (registration && strings.Contains(g, "vms/fine)")) {
				t.Errorf("registration %v: %s", registration, g)
			}
		}
	}
}

// TestUnknownFields: a field the decoder does not know is a warning and
// the rest of the resource applies, but for the security policies and
// EnvoyFilter, which are refused whole.
func TestUnknownFields(t *testing.T) {
	in := func(kind, version, spec string) istio.Input {
		return istio.Input{Location: kind, Resource: istio.Resource{APIVersion: istio.GroupOf(kind) + "/" + version, Kind: kind,
			Metadata: istio.Metadata{Name: "future", Namespace: "shop"}, Spec: []byte(spec)}}
	}
	inputs := []istio.Input{
		in("VirtualService", "v1", `{"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}], "newerField": true}]}`),
		in("AuthorizationPolicy", "v1", `{"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["a"], "newerField": ["b"]}}]}]}`),
		in("EnvoyFilter", "v1alpha3", `{"configPatches": [{"applyTo": "CLUSTER", "match": {"cluster": {"service": "reviews", "newerMatch": "x"}}, "patch": {"operation": "REMOVE"}}]}`),
	}
	objs, problems := istio.Normalize(inputs, istio.Options{})
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, string(o.Key.Kind))
	}
	if !slices.Equal(kinds, []string{"routerules"}) {
		t.Errorf("objects %v, want the VirtualService's alone", kinds)
	}
	want := map[string]string{
		"VirtualService":      `VirtualService (VirtualService shop/future): warning: spec: unknown field "http[0].newerField": ignored (not a field of VirtualService networking.istio.io/v1; the rest applies)`,
		"AuthorizationPolicy": `AuthorizationPolicy (AuthorizationPolicy shop/future): spec: unknown field "rules[0].from[0].source.newerField" (not a field of AuthorizationPolicy security.istio.io/v1; a field not understood could widen what it allows or changes, so the resource is refused)`,
		"EnvoyFilter":         `EnvoyFilter (EnvoyFilter shop/future): spec: unknown field "configPatches[0].match.cluster.newerMatch" (not a field of EnvoyFilter networking.istio.io/v1alpha3; a field not understood could widen what it allows or changes, so the resource is refused)`,
	}
	got := problemTexts(problems)
	for kind, w := range want {
		if !slices.Contains(got, w) {
			t.Errorf("%s: problems\n%s\nwant\n%s", kind, strings.Join(got, "\n"), w)
		}
	}
}

// problemTexts are the problems as they are reported.
func problemTexts(problems []ingest.Problem) []string {
	out := make([]string, len(problems))
	for i, p := range problems {
		out[i] = p.Error()
	}
	return out
}

// TestAuditPolicy: an AUDIT policy's rules go in the model's audit; its
// action is DENY with no rules, so that a pusher that does not know audit
// applies nothing for it (an AUDIT read as an ALLOW would deny everything
// else). A field not checked widens the rule, and says so.
func TestAuditPolicy(t *testing.T) {
	objs, problems := istio.Normalize([]istio.Input{{Location: "audit", Resource: istio.Resource{APIVersion: "security.istio.io/v1", Kind: "AuthorizationPolicy",
		Metadata: istio.Metadata{Name: "audit", Namespace: "shop"},
		Spec:     []byte(`{"action": "AUDIT", "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}, {"from": [{"source": {"serviceAccounts": ["a"]}}]}]}`)}}}, istio.Options{})
	if len(objs) != 1 {
		t.Fatalf("objects %v, problems %v", objs, problemTexts(problems))
	}
	p := objs[0].Object.(*meshv1.AuthorizationPolicy)
	if p.Action != meshv1.AuthorizationPolicy_ACTION_DENY || len(p.Rules) != 0 || len(p.Audit) != 2 || p.Audit[0].To[0].Methods[0] != "GET" {
		t.Errorf("policy %v, want DENY without rules and the two audit rules", p)
	}
	if got := strings.Join(problemTexts(problems), "\n"); !strings.Contains(got, "this AUDIT rule audits regardless of it") {
		t.Errorf("problems %s, want the unchecked serviceAccounts warned of", got)
	}
}
