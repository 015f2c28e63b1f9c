package bus_test

import (
	"context"

	"errors"
	"fmt"
	"github.com/nats-io/nats.go"
	"slices"
	"testing"

	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/model"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

func put(rev int64) *meshv1.ChangeEvent {
	return &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/services/ns/a", Revision: rev, Count: 1}
}

func TestPublishDeduplicatesByRevision(t *testing.T) {
	_, nc := testutil.NATS(t)
	ctx := testutil.Context(t)
	b, err := ensured(ctx, nc, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, true, false} {
		dup, err := b.Publish(ctx, put(int64(5+i/2)))
		if err != nil || dup != want {
			t.Fatalf("publish %d: duplicate=%v err=%v, want duplicate=%v", i, dup, err, want)
		}
	}
	last, seq, err := b.Last(ctx)
	if err != nil || seq != 2 || last.Revision != 6 {
		t.Fatalf("last = %v at %d (%v), want revision 6 at sequence 2", last, seq, err)
	}
	if got := bus.Subject(put(1)); got != "mesh.v1.services.ns" {
		t.Errorf("subject %q", got)
	}
}

func TestConsumeReportsAGapPastRetention(t *testing.T) {
	_, nc := testutil.NATS(t)
	ctx := testutil.Context(t)
	b, err := ensured(ctx, nc, bus.Config{MaxMsgs: 3})
	if err != nil {
		t.Fatal(err)
	}
	for rev := range int64(10) {
		if _, err := b.Publish(ctx, put(rev+1)); err != nil {
			t.Fatal(err)
		}
	}
	// The stream keeps sequences 8-10; a consumer that needs 2 on has fallen behind.
	err = b.Consume(ctx, 2, func(uint64, *meshv1.ChangeEvent) error {
		t.Error("delivered an event after a gap")
		return nil
	})
	if !errors.Is(err, model.ErrGap) {
		t.Fatalf("consume: %v, want model.ErrGap", err)
	}
	// From a retained sequence, events arrive in order.
	var got []int64
	stop := errors.New("stop")
	err = b.Consume(ctx, 8, func(seq uint64, ev *meshv1.ChangeEvent) error {
		got = append(got, ev.Revision)
		if seq == 10 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || len(got) != 3 || got[0] != 8 || got[2] != 10 {
		t.Fatalf("consumed %v (%v), want revisions 8, 9, 10", got, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for name, c := range map[string]bus.Config{
		"dotted stream name":        {Stream: "a.b"},
		"duplicates beyond max age": {MaxAge: 1e9, Duplicates: 2e9},
		"negative max messages":     {MaxMsgs: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
}

// TestConsumeSubjects: a consumer of some namespaces' subjects gets their
// events alone, in order (the stream's sequence skipping the others'); it
// reports a gap when the stream no longer holds where it starts.
func TestConsumeSubjects(t *testing.T) {
	_, nc := testutil.NATS(t)
	ctx := testutil.Context(t)
	b, err := ensured(ctx, nc, bus.Config{MaxMsgs: 6})
	if err != nil {
		t.Fatal(err)
	}
	for i, key := range []string{"/mesh/v1/services/a/x", "/mesh/v1/services/b/x", "/mesh/v1/scopes/c/default",
		"/mesh/v1/routerules/a/y", "/mesh/v1/endpoints/b/x/yaml", "/mesh/v1/services/a/z"} {
		if _, err := b.Publish(ctx, &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: key, Revision: int64(i + 1), Count: 1}); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	stop := errors.New("stop")
	err = b.ConsumeSubjects(ctx, 1, bus.ScopeSubjects([]string{"a"}), func(seq uint64, ev *meshv1.ChangeEvent) error {
		got = append(got, fmt.Sprintf("%d %s", seq, ev.Key))
		if seq == 6 {
			return stop
		}
		return nil
	})
	want := []string{"1 /mesh/v1/services/a/x", "3 /mesh/v1/scopes/c/default", "4 /mesh/v1/routerules/a/y", "6 /mesh/v1/services/a/z"}
	if !errors.Is(err, stop) || !slices.Equal(got, want) {
		t.Fatalf("consumed %q (%v), want %q", got, err, want)
	}
	// Four more: the stream keeps sequences 5-10, not 2 on.
	for rev := range int64(4) {
		if _, err := b.Publish(ctx, put(rev+7)); err != nil {
			t.Fatal(err)
		}
	}
	err = b.ConsumeSubjects(ctx, 2, bus.ScopeSubjects([]string{"a"}), func(uint64, *meshv1.ChangeEvent) error {
		t.Error("delivered an event after a gap")
		return nil
	})
	if !errors.Is(err, model.ErrGap) {
		t.Fatalf("consume from 2: %v, want model.ErrGap", err)
	}
}

// ensured opens a bus and makes its stream, as the relay does.
func ensured(ctx context.Context, nc *nats.Conn, cfg bus.Config) (*bus.Bus, error) {
	b, err := bus.New(nc, cfg)
	if err != nil {
		return nil, err
	}
	return b, b.Ensure(ctx)
}
