package pusher

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

// applyEvent decodes a PUT's value, as the follow goroutine does, and
// applies the event.
func applyEvent(t testing.TB, s *state, k model.Key, ev *meshv1.ChangeEvent) bool {
	t.Helper()
	var obj model.Object
	if ev.Type == meshv1.ChangeEvent_TYPE_PUT {
		var err error
		if obj, err = model.Decode(k, ev.Value); err != nil {
			t.Fatal(err)
		}
	}
	return s.apply(k, ev, obj)
}

func svcEvent(t *testing.T, typ meshv1.ChangeEvent_Type, name string, rev int64, port uint32) *meshv1.ChangeEvent {
	t.Helper()
	ev := &meshv1.ChangeEvent{Type: typ, Key: model.Key{Kind: model.KindService, Namespace: "ns", Name: name}.String(), Revision: rev}
	if typ == meshv1.ChangeEvent_TYPE_PUT {
		v, err := model.Encode(&meshv1.Service{Hostnames: []string{name + ".ns"}, Ports: []*meshv1.Port{{Number: port}}})
		if err != nil {
			t.Fatal(err)
		}
		ev.Value = v
	}
	return ev
}

func TestStateApply(t *testing.T) {
	put, del := meshv1.ChangeEvent_TYPE_PUT, meshv1.ChangeEvent_TYPE_DELETE
	type step struct {
		typ         meshv1.ChangeEvent_Type
		rev         int64
		port        uint32
		wantChanged bool
	}
	tests := map[string]struct {
		loadedPort uint32 // 0: the key is not in the load
		steps      []step
		wantPort   uint32 // 0: the key is absent at the end
	}{
		"events at or below the load revision are skipped": {
			loadedPort: 80,
			steps:      []step{{put, 9, 81, false}, {put, 10, 82, false}, {del, 10, 0, false}},
			wantPort:   80,
		},
		"newer events apply in order": {
			loadedPort: 80,
			steps:      []step{{put, 11, 81, true}, {put, 12, 82, true}},
			wantPort:   82,
		},
		"a replayed event applies once": {
			steps:    []step{{put, 11, 81, true}, {put, 11, 81, false}},
			wantPort: 81,
		},
		"an older event after a newer one is ignored": {
			steps:    []step{{put, 12, 82, true}, {put, 11, 81, false}},
			wantPort: 82,
		},
		"a replayed put does not resurrect a deleted key": {
			loadedPort: 80,
			steps:      []step{{put, 11, 81, true}, {del, 12, 0, true}, {put, 11, 81, false}},
		},
		"a put after a delete recreates the key": {
			loadedPort: 80,
			steps:      []step{{del, 11, 0, true}, {put, 12, 83, true}},
			wantPort:   83,
		},
		"deleting an absent key changes nothing": {
			steps: []step{{del, 11, 0, false}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := newState("", meshSettings{})
			k := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}
			var items []model.Stored
			if tc.loadedPort != 0 {
				items = []model.Stored{{Key: k, ModRevision: 5, Object: &meshv1.Service{Ports: []*meshv1.Port{{Number: tc.loadedPort}}}}}
			}
			s.reset(items, 10)
			for i, st := range tc.steps {
				changed := applyEvent(t, s, k, svcEvent(t, st.typ, "a", st.rev, st.port))
				if changed != st.wantChanged {
					t.Errorf("step %d (%s at %d): changed=%v, want %v", i, st.typ, st.rev, changed, st.wantChanged)
				}
			}
			e, ok := s.b.Get(k)
			switch {
			case tc.wantPort == 0 && ok:
				t.Errorf("key present with port %d, want it absent", e.Object.(*meshv1.Service).Ports[0].Number)
			case tc.wantPort != 0 && !ok:
				t.Errorf("key absent, want port %d", tc.wantPort)
			case ok && e.Object.(*meshv1.Service).Ports[0].Number != tc.wantPort:
				t.Errorf("port %d, want %d", e.Object.(*meshv1.Service).Ports[0].Number, tc.wantPort)
			}
		})
	}
}

func TestStateMergesEndpointShards(t *testing.T) {
	s := newState("", meshSettings{})
	svc := &meshv1.Service{Hostnames: []string{"a.ns.svc.cluster.local"}, Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}
	ep := func(addr string) *meshv1.Endpoint { return &meshv1.Endpoint{Address: addr} }
	s.reset([]model.Stored{
		{Key: model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}, Object: svc},
		{Key: model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: "a/k8s"}, Object: &meshv1.Endpoints{Service: "a", Shard: "k8s", Endpoints: []*meshv1.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}}},
		{Key: model.Key{Kind: model.KindEndpoints, Namespace: "ns", Name: "a/yaml"}, Object: &meshv1.Endpoints{Service: "a", Shard: "yaml", Endpoints: []*meshv1.Endpoint{ep("10.0.0.2"), ep("10.0.0.3")}}},
	}, 3)
	built, _, rev := s.mesh()
	m := built.Mesh
	if rev != 3 {
		t.Errorf("revision %d, want 3", rev)
	}
	got := m.Service("a.ns.svc.cluster.local")
	if got == nil {
		t.Fatal("service not in the mesh")
	}
	var addrs []string
	for _, e := range got.Endpoints {
		addrs = append(addrs, e.Address)
	}
	if want := "[10.0.0.1 10.0.0.2 10.0.0.3]"; fmtSlice(addrs) != want {
		t.Errorf("endpoints %v, want %s (one per workload, shards merged)", addrs, want)
	}
}

func fmtSlice(s []string) string {
	out := "["
	for i, v := range s {
		if i > 0 {
			out += " "
		}
		out += v
	}
	return out + "]"
}
