package model

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
)

// FuzzDecode: any stored value either fails to decode with an error or
// decodes into an object that encodes and decodes to itself, and that
// Validate judges without panicking.
func FuzzDecode(f *testing.F) {
	for i, o := range []Object{
		&meshv1.Service{Hostnames: []string{"a.ns"}, Ports: []*meshv1.Port{{Name: "http", Number: 80}}},
		&meshv1.Endpoints{Service: "a", Shard: "k8s", Endpoints: []*meshv1.Endpoint{{Address: "10.0.0.1", Ports: map[string]uint32{"http": 8080}}}},
		&meshv1.RouteRule{Hosts: []string{"a.ns"}},
		&meshv1.TrafficPolicy{Host: "a.ns", Subsets: []*meshv1.Subset{{Name: "v1", Labels: map[string]string{"v": "1"}}}},
		&meshv1.Scope{},
		&meshv1.Gateway{Selector: map[string]string{"istio": "ingress"}},
	} {
		b, err := Encode(o)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	f.Fuzz(func(t *testing.T, kind uint8, value []byte) {
		k := Key{Kind: Kinds[int(kind)%len(Kinds)], Namespace: "ns", Name: "a"}
		if k.Kind == KindEndpoints {
			k.Name = EndpointsName("a", "k8s")
		}
		o, err := Decode(k, value)
		if err != nil {
			return
		}
		_ = Validate(o)
		b, err := Encode(o)
		if err != nil {
			t.Fatalf("decoded %v does not encode: %v", o, err)
		}
		again, err := Decode(k, b)
		if err != nil || !proto.Equal(o, again) {
			t.Fatalf("%v encodes and decodes to %v (%v)", o, again, err)
		}
	})
}
