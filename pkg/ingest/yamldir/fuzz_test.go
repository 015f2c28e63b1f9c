package yamldir

import (
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
)

// FuzzParseFile: any file parses into inputs and problems, each with the
// location it comes from, and the inputs normalize into objects and
// problems without panicking.
func FuzzParseFile(f *testing.F) {
	for _, seed := range []string{
		"apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: a, namespace: demo}\nspec:\n  hosts: [a.example.com]\n  ports: [{number: 80, name: http, protocol: HTTP}]\n  resolution: STATIC\n  endpoints: [{address: 10.0.0.1}]\n",
		"apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: a}\nspec:\n  hosts: [a]\n  http:\n  - match: [{headers: {x: {regex: \"a.*\"}}}]\n    route: [{destination: {host: a, subset: v1}, weight: 100}]\n",
		"apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: a}\nspec: {host: a, subsets: [{name: v1, labels: {v: '1'}}]}\n---\n---\n",
		"metadata: {name: [oops\n",
		"- a\n- b\n",
		"",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		limits := Limits{}
		limits.defaults()
		inputs, problems := parseFile("f.yaml", data, "v", time.Unix(1, 0), limits)
		for _, p := range problems {
			if !strings.HasPrefix(p.Location, "f.yaml") || p.Reason == "" {
				t.Fatalf("problem %+v lacks its location or reason", p)
			}
		}
		for _, in := range inputs {
			if !strings.HasPrefix(in.Location, "f.yaml document ") {
				t.Fatalf("input at %q", in.Location)
			}
		}
		objs, more := istio.Normalize(inputs, istio.Options{})
		for _, p := range more {
			if p.Location == "" || p.Reason == "" {
				t.Fatalf("normalizer problem %+v lacks its location or reason", p)
			}
		}
		for _, o := range objs {
			if o.Object.GetOrigin().GetLocation() == "" {
				t.Fatalf("object %s has no origin location", o.Key)
			}
		}
	})
}
