package app

import (
	"context"
	"sync"
	"testing"

	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestCSDSConcurrency: past MaxConcurrent requests being answered, one
// more is refused at once, before anything is built (the dump is not even
// looked at); a slot freed is taken again.
func TestCSDSConcurrency(t *testing.T) {
	c := &CSDS{MaxConcurrent: 2}
	if first, second := c.enter(), c.enter(); !first || !second {
		t.Fatal("the two slots were not free")
	}
	_, err := c.FetchClientStatus(context.Background(), &statusv3.ClientStatusRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third request: %v, want ResourceExhausted", err)
	}
	c.leave()
	if !c.enter() {
		t.Error("a freed slot was not taken")
	}
	// Many at once never hold more than the slots.
	c = &CSDS{MaxConcurrent: 3}
	var mu sync.Mutex
	in, most := 0, 0
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if !c.enter() {
				return
			}
			mu.Lock()
			in++
			most = max(most, in)
			mu.Unlock()
			mu.Lock()
			in--
			mu.Unlock()
			c.leave()
		})
	}
	wg.Wait()
	if most > 3 {
		t.Errorf("%d requests answered at once, want at most 3", most)
	}
}
