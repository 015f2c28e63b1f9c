package identity

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestStreamLimit: an identity holds at most max streams; a stream that
// ends gives its place back; other identities are not held to the first's.
func TestStreamLimit(t *testing.T) {
	l, err := NewStreamLimit(2, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := ID{TrustDomain: "cluster.local", Namespace: "shop", ServiceAccount: "api"}
	b := ID{TrustDomain: "cluster.local", Namespace: "payments", ServiceAccount: "api"}
	ctx1, end1 := context.WithCancel(context.Background())
	ctx2, end2 := context.WithCancel(context.Background())
	defer end2()
	for _, ctx := range []context.Context{ctx1, ctx2} {
		if err := l.admit(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.admit(context.Background(), a); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third stream of %s: %v, want ResourceExhausted", a, err)
	}
	if err := l.admit(ctx2, b); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	end1()
	// The place comes back once the ended stream's context says so.
	testutil.Eventually(t, 5*time.Second, "the ended stream's place is given back", func() (bool, string) {
		return l.Held(a) == 1, fmt.Sprint(l.Held(a))
	})
	if err := l.admit(ctx2, a); err != nil {
		t.Fatalf("after a stream ended: %v", err)
	}
	if _, err := NewStreamLimit(0, nil); err == nil {
		t.Error("a limit of 0 taken")
	}
}
