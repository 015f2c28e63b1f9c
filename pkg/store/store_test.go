package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func service(observed time.Time, port uint32) *meshv1.Service {
	return &meshv1.Service{
		Origin:    &meshv1.Origin{Source: "test", ObservedAt: timestamppb.New(observed)},
		Hostnames: []string{"a.ns.svc.cluster.local"},
		Ports:     []*meshv1.Port{{Name: "http", Number: port, Protocol: meshv1.Protocol_PROTOCOL_HTTP}},
	}
}

func TestPutWritesOnlyOnChange(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	k := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}

	written, rev1, err := s.Put(ctx, k, service(time.Unix(1, 0), 80))
	if err != nil || !written {
		t.Fatalf("first put: written=%v err=%v", written, err)
	}
	// The same content observed later: no write, no new revision.
	written, rev2, err := s.Put(ctx, k, service(time.Unix(2, 0), 80))
	if err != nil || written {
		t.Fatalf("same content: written=%v err=%v", written, err)
	}
	if rev2 != rev1 {
		t.Errorf("store revision moved from %d to %d on an unchanged put", rev1, rev2)
	}
	written, rev3, err := s.Put(ctx, k, service(time.Unix(3, 0), 81))
	if err != nil || !written || rev3 != rev1+1 {
		t.Fatalf("changed content: written=%v rev=%d err=%v, want a write at %d", written, rev3, err, rev1+1)
	}

	items, rev, errs, err := s.List(ctx)
	if err != nil || len(errs) != 0 {
		t.Fatalf("list: %v %v", err, errs)
	}
	if rev != rev3 || len(items) != 1 || items[0].Key != k || items[0].ModRevision != rev3 {
		t.Fatalf("list = %+v at %d, want %s at %d", items, rev, k, rev3)
	}
	if got := items[0].Object.(*meshv1.Service).Ports[0].Number; got != 81 {
		t.Errorf("stored port %d, want 81", got)
	}

	deleted, _, err := s.Delete(ctx, k)
	if err != nil || !deleted {
		t.Fatalf("delete: %v %v", deleted, err)
	}
	deleted, _, err = s.Delete(ctx, k)
	if err != nil || deleted {
		t.Fatalf("second delete: %v %v, want nothing deleted", deleted, err)
	}
}

func TestPutRejectsWrongKind(t *testing.T) {
	_, cli := testutil.Etcd(t)
	k := model.Key{Kind: model.KindRouteRule, Namespace: "ns", Name: "a"}
	if _, _, err := store.New(cli).Put(context.Background(), k, service(time.Now(), 80)); err == nil {
		t.Fatal("want an error for a Service under a routerules key")
	}
}

func TestListSkipsUnreadableValues(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	good := model.Key{Kind: model.KindService, Namespace: "ns", Name: "good"}
	if _, _, err := s.Put(ctx, good, service(time.Now(), 80)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/mesh/v1/services/ns/bad", "\xff\xff not protobuf"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/mesh/v1/nonsense/ns/x", ""); err != nil {
		t.Fatal(err)
	}
	items, _, errs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 || items[0].Key != good || len(errs) != 2 {
		t.Fatalf("got %d items and errors %v; want the good one and two errors", len(items), errs)
	}
}

func TestWatchFromRevision(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	a := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}
	_, from, err := s.Put(ctx, a, service(time.Now(), 80))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Put(ctx, a, service(time.Now(), 81)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Delete(ctx, a); err != nil {
		t.Fatal(err)
	}
	// One transaction touching two keys is one revision of two events.
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut("/mesh/v1/services/ns/b", ""), clientv3.OpPut("/mesh/v1/services/ns/c", "")).Commit(); err != nil {
		t.Fatal(err)
	}

	var got [][]*meshv1.ChangeEvent
	stop := errors.New("enough")
	err = s.Watch(ctx, from, func(evs []*meshv1.ChangeEvent) error {
		got = append(got, evs)
		if len(got) == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("watch: %v", err)
	}
	if got[0][0].Type != meshv1.ChangeEvent_TYPE_PUT || got[0][0].Revision != from+1 {
		t.Errorf("first event %v, want the put at %d", got[0][0], from+1)
	}
	if got[1][0].Type != meshv1.ChangeEvent_TYPE_DELETE || got[1][0].Revision != from+2 {
		t.Errorf("second event %v, want the delete at %d", got[1][0], from+2)
	}
	if len(got[2]) != 2 || got[2][0].Revision != from+3 || got[2][1].Index != 1 || got[2][1].Count != 2 {
		t.Errorf("third batch %v, want two events of revision %d indexed 0 and 1 of 2", got[2], from+3)
	}
}

func TestWatchCompacted(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	k := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}
	var rev int64
	for p := range uint32(3) {
		_, r, err := s.Put(ctx, k, service(time.Now(), 80+p))
		if err != nil {
			t.Fatal(err)
		}
		rev = r
	}
	if _, err := cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	err := s.Watch(ctx, 1, func([]*meshv1.ChangeEvent) error { return nil })
	if !errors.Is(err, model.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %v, want model.ErrCompacted", err)
	}
}

func TestWritesAtAStaleRevisionReadTheCurrentOne(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	k := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}

	// Expected absent, and it is: written.
	written, rev1, err := s.PutAt(ctx, k, service(time.Unix(1, 0), 80), 0)
	if err != nil || !written {
		t.Fatalf("create: written=%v err=%v", written, err)
	}
	// Expected absent, but present with the same content: nothing written,
	// the key's revision returned.
	written, rev, err := s.PutAt(ctx, k, service(time.Unix(2, 0), 80), 0)
	if err != nil || written || rev != rev1 {
		t.Fatalf("same content at a stale revision: written=%v rev=%d err=%v, want no write at %d", written, rev, err, rev1)
	}
	// Another writer moved the key: a write at the old revision still lands.
	if _, _, err := s.Put(ctx, k, service(time.Unix(3, 0), 81)); err != nil {
		t.Fatal(err)
	}
	written, rev, err = s.PutAt(ctx, k, service(time.Unix(4, 0), 82), rev1)
	if err != nil || !written || rev <= rev1 {
		t.Fatalf("write at a stale revision: written=%v rev=%d err=%v", written, rev, err)
	}
	deleted, _, err := s.DeleteAt(ctx, k, rev1)
	if err != nil || !deleted {
		t.Fatalf("delete at a stale revision: deleted=%v err=%v", deleted, err)
	}
	deleted, _, err = s.DeleteAt(ctx, k, 0)
	if err != nil || deleted {
		t.Fatalf("delete of an absent key: deleted=%v err=%v", deleted, err)
	}
	if items, _, _, _ := s.List(ctx); len(items) != 0 {
		t.Fatalf("store holds %v, want nothing", items)
	}
}

// TestAhead: the first mesh change after a revision that a filter keeps,
// up to the store's current revision, read from the store's history; none
// when only other keys (outside the mesh, or filtered out) changed;
// model.ErrCompacted when the history no longer reaches back.
func TestAhead(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	a := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}
	b := model.Key{Kind: model.KindService, Namespace: "other", Name: "b"}
	_, from, err := s.Put(ctx, a, service(time.Now(), 80))
	if err != nil {
		t.Fatal(err)
	}
	if first, current, err := s.Ahead(ctx, from, nil, 5*time.Second); err != nil || first != 0 || current != from {
		t.Errorf("nothing after %d: first %d, current %d, %v; want 0, %d", from, first, current, err, from)
	}
	// A write outside the mesh moves the revision, not the mesh.
	if _, err := cli.Put(ctx, "/shardpilot/leader/x", "1"); err != nil {
		t.Fatal(err)
	}
	_, atB, err := s.Put(ctx, b, service(time.Now(), 80))
	if err != nil {
		t.Fatal(err)
	}
	_, atA, err := s.Put(ctx, a, service(time.Now(), 81))
	if err != nil {
		t.Fatal(err)
	}
	onlyNS := func(key string) bool { return strings.HasPrefix(key, "/mesh/v1/services/ns/") }
	for name, tc := range map[string]struct {
		keep  func(string) bool
		after int64
		want  int64
	}{
		"any change":             {nil, from, atB},
		"the namespace's change": {onlyNS, from, atA},
		"none past the last":     {nil, atA, 0},
	} {
		first, current, err := s.Ahead(ctx, tc.after, tc.keep, 5*time.Second)
		if err != nil || first != tc.want || current != atA {
			t.Errorf("%s: first %d, current %d, %v; want %d, %d", name, first, current, err, tc.want, atA)
		}
	}
	if _, err := cli.Compact(ctx, atA); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Ahead(ctx, from, nil, 5*time.Second); !errors.Is(err, model.ErrCompacted) {
		t.Errorf("after a compaction: %v, want model.ErrCompacted", err)
	}
}

// TestWriteAllInOneTransaction: puts and deletes of keys as expected are
// written at one revision, each delete told whether its key existed; with
// one key not as expected, nothing is written.
func TestWriteAllInOneTransaction(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx := testutil.Context(t)
	s := store.New(cli)
	key := func(name string) model.Key { return model.Key{Kind: model.KindService, Namespace: "ns", Name: name} }
	_, revA, err := s.Put(ctx, key("a"), service(time.Unix(1, 0), 80))
	if err != nil {
		t.Fatal(err)
	}
	ok, rev, deleted, err := s.WriteAll(ctx, []model.Stored{
		{Key: key("b"), Object: service(time.Unix(1, 0), 80)},
		{Key: key("c"), Object: service(time.Unix(1, 0), 80)},
		{Key: key("a"), ModRevision: revA},
		{Key: key("gone")},
	})
	if err != nil || !ok || rev != revA+1 || !slices.Equal(deleted, []bool{false, false, true, false}) {
		t.Fatalf("WriteAll: ok %v at %d, deleted %v, %v: want written at %d, a deleted", ok, rev, deleted, err, revA+1)
	}
	ok, _, _, err = s.WriteAll(ctx, []model.Stored{
		{Key: key("d"), Object: service(time.Unix(1, 0), 80)},
		{Key: key("b"), Object: service(time.Unix(1, 0), 81)}, // b is at rev, not absent
	})
	if err != nil || ok {
		t.Fatalf("WriteAll with a key not as expected: ok %v, %v: want nothing written", ok, err)
	}
	items, _, _, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, it := range items {
		names = append(names, it.Key.Name)
		if it.ModRevision != rev {
			t.Errorf("%s at %d, want %d", it.Key, it.ModRevision, rev)
		}
	}
	if !slices.Equal(names, []string{"b", "c"}) {
		t.Errorf("store holds %v, want b and c", names)
	}
}
