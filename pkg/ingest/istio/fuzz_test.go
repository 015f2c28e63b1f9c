package istio_test

import (
	"testing"

	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// FuzzNormalize: any spec of any kind normalizes into objects or problems
// naming where and why, never a panic; every object either passes the
// model's validation or fails it with an error.
func FuzzNormalize(f *testing.F) {
	for _, seed := range []struct{ kind, spec string }{
		{istio.KindServiceEntry, `{"hosts":["a.example.com"],"ports":[{"number":80,"name":"http","protocol":"HTTP"}],"resolution":"STATIC","endpoints":[{"address":"10.0.0.1"}]}`},
		{istio.KindServiceEntry, `{"hosts":["vms.internal"],"ports":[{"number":80,"name":"http","protocol":"HTTP"}],"workloadSelector":{"labels":{"app":"vm"}}}`},
		{istio.KindWorkloadEntry, `{"address":"10.0.0.2","labels":{"app":"vm"},"ports":{"http":8080},"locality":"r/z/s"}`},
		{istio.KindVirtualService, `{"hosts":["a"],"http":[{"match":[{"uri":{"prefix":"/"},"headers":{"x":{"exact":"y"}}}],"route":[{"destination":{"host":"a","subset":"v1"},"weight":80},{"destination":{"host":"a","subset":"v2"},"weight":20}],"retries":{"attempts":3,"retryOn":"unavailable"},"timeout":"1s"}]}`},
		{istio.KindDestinationRule, `{"host":"a","trafficPolicy":{"loadBalancer":{"simple":"ROUND_ROBIN"}},"subsets":[{"name":"v1","labels":{"v":"1"}}]}`},
		{istio.KindSidecar, `{"egress":[{"hosts":["./*","istio-system/*"]}]}`},
		{istio.KindGateway, `{"selector":{"istio":"ingressgateway"},"servers":[{"port":{"number":80,"name":"http","protocol":"HTTP"},"hosts":["*/a.example.com"]}]}`},
		{istio.KindVirtualService, `null`},
		{"Unknown", `{}`},
	} {
		f.Add(seed.kind, "a", []byte(seed.spec))
	}
	f.Fuzz(func(t *testing.T, kind, name string, spec []byte) {
		in := istio.Input{Location: "here", Resource: istio.Resource{APIVersion: istio.Group + "/v1", Kind: kind,
			Metadata: istio.Metadata{Name: name, Namespace: "demo"}, Spec: spec}}
		// A WorkloadEntry is only seen through a ServiceEntry selecting it.
		selector := istio.Input{Location: "there", Resource: istio.Resource{APIVersion: istio.Group + "/v1", Kind: istio.KindServiceEntry,
			Metadata: istio.Metadata{Name: "all", Namespace: "demo"},
			Spec:     []byte(`{"hosts":["all.internal"],"ports":[{"number":80,"name":"http","protocol":"HTTP"}],"workloadSelector":{"labels":{"app":"vm"}}}`)}}
		objs, problems := istio.Normalize([]istio.Input{in, selector}, istio.Options{})
		for _, p := range problems {
			if p.Location == "" || p.Reason == "" {
				t.Fatalf("problem %+v lacks its location or reason", p)
			}
		}
		for _, o := range objs {
			if model.KindOf(o.Object) != o.Key.Kind {
				t.Fatalf("object %T under key %s", o.Object, o.Key)
			}
			_ = model.Validate(o.Object)
		}
	})
}
