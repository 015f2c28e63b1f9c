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
)

func seedRequests(f *testing.F, msgs ...proto.Message) {
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Add([]byte{0xff})
}

// FuzzDecodeSotW: whatever protobuf decodes as a DiscoveryRequest, the
// server's decoder reads the same; nothing makes it panic.
func FuzzDecodeSotW(f *testing.F) {
	node := &core.Node{Id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local"}
	seedRequests(f,
		&discovery.DiscoveryRequest{VersionInfo: "v", Node: node, ResourceNames: []string{"a", "b"}, TypeUrl: "t", ResponseNonce: "7"},
		&discovery.DiscoveryRequest{TypeUrl: "t", ResponseNonce: "8", ErrorDetail: &rpcstatus.Status{Code: 3, Message: "no"}})
	var r sotwRequest
	f.Fuzz(func(t *testing.T, b []byte) {
		err := r.decode(b)
		var want discovery.DiscoveryRequest
		if proto.Unmarshal(b, &want) != nil {
			return // the server may read more leniently than protobuf
		}
		if err != nil {
			t.Fatalf("protobuf decodes %x, the server does not: %v", b, err)
		}
		if string(r.version) != want.VersionInfo || string(r.typeURL) != want.TypeUrl || string(r.nonce) != want.ResponseNonce {
			t.Fatalf("decoded version %q type %q nonce %q, protobuf %q %q %q", r.version, r.typeURL, r.nonce, want.VersionInfo, want.TypeUrl, want.ResponseNonce)
		}
		if !slices.Equal(r.nameList(), want.ResourceNames) || r.fp != cache.FingerprintOf(want.ResourceNames) {
			t.Fatalf("decoded names %q, protobuf %q", r.nameList(), want.ResourceNames)
		}
		if r.hasNode != (want.Node != nil) || r.hasError != (want.ErrorDetail != nil) {
			t.Fatalf("node %v error %v, protobuf %v %v", r.hasNode, r.hasError, want.Node != nil, want.ErrorDetail != nil)
		}
	})
}

// FuzzDecodeDelta: the same for a DeltaDiscoveryRequest.
func FuzzDecodeDelta(f *testing.F) {
	seedRequests(f,
		&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "n"}, TypeUrl: "t", ResourceNamesSubscribe: []string{"a", "b"},
			ResourceNamesUnsubscribe: []string{"c"}, InitialResourceVersions: map[string]string{"a": "1", "x": "2"}, ResponseNonce: "7"},
		&discovery.DeltaDiscoveryRequest{TypeUrl: "t", ResponseNonce: "8", ErrorDetail: &rpcstatus.Status{Code: 3}})
	var r deltaRequest
	f.Fuzz(func(t *testing.T, b []byte) {
		err := r.decode(b)
		var want discovery.DeltaDiscoveryRequest
		if proto.Unmarshal(b, &want) != nil {
			return
		}
		if err != nil {
			t.Fatalf("protobuf decodes %x, the server does not: %v", b, err)
		}
		if string(r.typeURL) != want.TypeUrl || string(r.nonce) != want.ResponseNonce ||
			!slices.Equal(r.subscribe, want.ResourceNamesSubscribe) || !slices.Equal(r.unsubscribe, want.ResourceNamesUnsubscribe) {
			t.Fatalf("decoded %+v, protobuf %v", r, &want)
		}
		if len(r.initial)+len(want.InitialResourceVersions) > 0 && !maps.Equal(r.initial, want.InitialResourceVersions) {
			t.Fatalf("decoded initial versions %v, protobuf %v", r.initial, want.InitialResourceVersions)
		}
		if r.hasNode != (want.Node != nil) || r.hasError != (want.ErrorDetail != nil) {
			t.Fatalf("node %v error %v, protobuf %v %v", r.hasNode, r.hasError, want.Node != nil, want.ErrorDetail != nil)
		}
	})
}
