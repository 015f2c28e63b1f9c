package server

import (
	"maps"
	"slices"
	"testing"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// TestDecodeRequests: the server's own decoders read what the proto
// decoder reads, and refuse what it refuses.
func TestDecodeRequests(t *testing.T) {
	node := &core.Node{Id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", Cluster: "c"}
	nodeRaw, _ := proto.Marshal(node)
	detail := &rpcstatus.Status{Code: 3, Message: "no"}
	detailRaw, _ := proto.Marshal(detail)

	delta, err := proto.Marshal(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: "t",
		ResourceNamesSubscribe: []string{"a", "b"}, ResourceNamesUnsubscribe: []string{"c"},
		InitialResourceVersions: map[string]string{"a": "1", "x": "2"}, ResponseNonce: "7", ErrorDetail: detail})
	if err != nil {
		t.Fatal(err)
	}
	var d deltaRequest
	if err := d.decode(delta); err != nil {
		t.Fatal(err)
	}
	if !d.hasNode || !slices.Equal(d.node, nodeRaw) || string(d.typeURL) != "t" || !slices.Equal(d.subscribe, []string{"a", "b"}) ||
		!slices.Equal(d.unsubscribe, []string{"c"}) || !maps.Equal(d.initial, map[string]string{"a": "1", "x": "2"}) ||
		string(d.nonce) != "7" || !d.hasError || !slices.Equal(d.errorDetail, detailRaw) {
		t.Errorf("delta request decoded as %+v", d)
	}
	// The next request on the stream leaves nothing of this one behind.
	ack, _ := proto.Marshal(&discovery.DeltaDiscoveryRequest{TypeUrl: "t", ResponseNonce: "8"})
	if err := d.decode(ack); err != nil || d.hasNode || d.initial != nil || len(d.subscribe) != 0 || d.hasError || string(d.nonce) != "8" {
		t.Errorf("an ACK after it decoded as %+v (%v)", d, err)
	}

	sotw, err := proto.Marshal(&discovery.DiscoveryRequest{VersionInfo: "v", Node: node, ResourceNames: []string{"a", "b"},
		TypeUrl: "t", ResponseNonce: "7", ErrorDetail: detail})
	if err != nil {
		t.Fatal(err)
	}
	var s sotwRequest
	if err := s.decode(sotw); err != nil {
		t.Fatal(err)
	}
	if string(s.version) != "v" || !slices.Equal(s.node, nodeRaw) || !slices.Equal(s.nameList(), []string{"a", "b"}) ||
		string(s.typeURL) != "t" || string(s.nonce) != "7" || !s.hasError || s.fp != cache.FingerprintOf([]string{"a", "b"}) {
		t.Errorf("SotW request decoded as %+v", s)
	}

	for _, bad := range [][]byte{{0x0a, 0x05, 'a'}, {0xff}} {
		if err := d.decode(bad); err == nil {
			t.Errorf("delta: %x decoded", bad)
		}
		if err := s.decode(bad); err == nil {
			t.Errorf("SotW: %x decoded", bad)
		}
	}
}

// TestSameID: a node is recognised by its id whatever order its metadata
// is encoded in.
func TestSameID(t *testing.T) {
	meta, err := structpb.NewStruct(map[string]any{"NAMESPACE": "ns", "LABELS": map[string]any{"a": "1", "b": "2", "c": "3"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := proto.Marshal(&core.Node{Id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local", Metadata: meta, Cluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if !sameID(b, "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local") || sameID(b, "other") {
		t.Error("the id read from the encoded node is wrong")
	}
	noID, _ := proto.Marshal(&core.Node{Cluster: "c"})
	if !sameID(noID, "") || sameID(noID, "x") || sameID([]byte{0xff}, "") {
		t.Error("a node without id, or an unreadable one")
	}
}
