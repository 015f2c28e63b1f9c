package cache

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// TestOwed: the backlog is the sum of what the watches hold, whatever
// order their adds, drops and excuses come in, from any goroutine; an
// excused holder adds nothing, and one excused while it adds keeps
// nothing.
func TestOwed(t *testing.T) {
	c, err := New(Config{SharedTypes: []string{resource.EndpointType}})
	if err != nil {
		t.Fatal(err)
	}
	table, err := c.Table(Shared, resource.EndpointType)
	if err != nil {
		t.Fatal(err)
	}
	var excused atomic.Bool
	o := table.NewOwed()
	o.Add(&excused)
	o.Add(&excused)
	if o.Held() != 2 || c.Backlog() != 2 {
		t.Fatalf("held %d, backlog %d; want 2 and 2", o.Held(), c.Backlog())
	}
	o.Drop()
	o.Drop()
	o.Drop() // nothing held: nothing given back
	if o.Held() != 0 || c.Backlog() != 0 {
		t.Fatalf("after the drops: held %d, backlog %d; want 0 and 0", o.Held(), c.Backlog())
	}
	excused.Store(true)
	o.Add(&excused)
	if o.Held() != 0 || c.Backlog() != 0 {
		t.Fatalf("excused: held %d, backlog %d; want nothing added", o.Held(), c.Backlog())
	}

	// Many watches, each with its goroutines adding, dropping and being
	// excused at once (a table's notify, a sender, the answer watcher).
	excused.Store(false)
	owed := make([]*Owed, 64)
	behind := make([]atomic.Bool, len(owed))
	var wg sync.WaitGroup
	for i := range owed {
		owed[i] = table.NewOwed()
		wg.Go(func() {
			for range 2000 {
				owed[i].Add(&behind[i])
			}
		})
		wg.Go(func() {
			for range 1500 {
				owed[i].Drop()
			}
		})
		if i%4 == 0 {
			wg.Go(func() {
				for j := range 200 {
					behind[i].Store(j%2 == 0)
					owed[i].Excuse()
				}
				behind[i].Store(false)
			})
		}
	}
	wg.Wait()
	var held int64
	for _, o := range owed {
		if o.Held() < 0 {
			t.Fatalf("a watch holds %d units", o.Held())
		}
		held += int64(o.Held())
	}
	if c.Backlog() != held {
		t.Fatalf("backlog %d, the watches hold %d", c.Backlog(), held)
	}
	for _, o := range owed {
		o.Excuse()
	}
	if c.Backlog() != 0 {
		t.Errorf("backlog %d once every watch is excused", c.Backlog())
	}
}
