package sim

import (
	"slices"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// The raw codec reads what the generated types would, split over several
// buffers or not, and keeps the difference between a Delta resource with
// an empty body and one without a body.
func TestRawCodecReadsWhatProtoReads(t *testing.T) {
	codec := newRawCodec(mem.DefaultBufferPool())
	sotw, _ := proto.Marshal(&discovery.DiscoveryResponse{VersionInfo: "v7", TypeUrl: "t/cluster", Nonce: "n3",
		Resources:    []*anypb.Any{{TypeUrl: "t/cluster", Value: []byte("first")}, {TypeUrl: "t/cluster", Value: []byte("second")}},
		ControlPlane: nil})
	delta, _ := proto.Marshal(&discovery.DeltaDiscoveryResponse{SystemVersionInfo: "s1", TypeUrl: "t/listener", Nonce: "n4",
		Resources: []*discovery.Resource{
			{Name: "a", Version: "1", Resource: &anypb.Any{TypeUrl: "t/listener", Value: []byte("body-a")}},
			{Name: "b", Version: "2", Resource: &anypb.Any{TypeUrl: "t/listener"}},
			{Name: "c", Version: "3"},
		},
		RemovedResources: []string{"x", "y"}})
	for _, split := range []int{0, 3} {
		slice := func(b []byte) mem.BufferSlice {
			if split == 0 {
				return mem.BufferSlice{mem.SliceBuffer(b)}
			}
			return mem.BufferSlice{mem.SliceBuffer(b[:split]), mem.SliceBuffer(b[split:])}
		}
		var r response
		if err := codec.Unmarshal(slice(sotw), &r); err != nil {
			t.Fatal(err)
		}
		if r.version != "v7" || r.typeURL != "t/cluster" || r.nonce != "n3" || len(r.resources) != 2 ||
			string(r.resources[0].value) != "first" || string(r.resources[1].value) != "second" || r.size() != 11 {
			t.Errorf("split %d: SotW read as %+v", split, r)
		}
		r.release()
		d := response{delta: true}
		if err := codec.Unmarshal(slice(delta), &d); err != nil {
			t.Fatal(err)
		}
		if d.version != "s1" || d.typeURL != "t/listener" || d.nonce != "n4" || len(d.resources) != 3 || !slices.Equal(d.removed, []string{"x", "y"}) {
			t.Fatalf("split %d: Delta read as %+v", split, d)
		}
		a, b, c := d.resources[0], d.resources[1], d.resources[2]
		if a.name != "a" || a.version != "1" || string(a.value) != "body-a" || b.name != "b" || b.value == nil || len(b.value) != 0 ||
			c.name != "c" || c.version != "3" || c.value != nil {
			t.Errorf("split %d: Delta resources read as %+v", split, d.resources)
		}
		d.release()
	}
	var r response
	if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(sotw[:len(sotw)-2])}, &r); err == nil {
		t.Error("a truncated response was read without an error")
	}
}
