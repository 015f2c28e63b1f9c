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
	excused.Store(false)

	// A watch sent a response in parts: its units are in the backlog and
	// hold nothing, until its last part.
	o.Add(&excused)
	o.Apart(true)
	o.Add(&excused)
	if o.Held() != 2 || c.Backlog() != 2 || c.Holding() != 0 {
		t.Fatalf("apart: held %d, backlog %d, holding %d; want 2, 2 and 0", o.Held(), c.Backlog(), c.Holding())
	}
	o.Apart(false)
	if c.Holding() != 2 {
		t.Fatalf("its last part sent: holding %d, want its 2 units", c.Holding())
	}
	o.Apart(true)
	o.Excuse()
	o.Apart(false)
	if o.Held() != 0 || c.Backlog() != 0 || c.Holding() != 0 {
		t.Fatalf("excused apart: held %d, backlog %d, holding %d; want 0", o.Held(), c.Backlog(), c.Holding())
	}

	// Many watches, each with its goroutines adding, dropping, being
	// excused and going apart at once (a table's notify, a sender, the
	// answer watcher).
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
		if i%3 == 0 {
			wg.Go(func() {
				for j := range 300 {
					owed[i].Apart(j%2 == 0)
				}
				owed[i].Apart(i%2 == 0)
			})
		}
	}
	wg.Wait()
	var held, holding int64
	for i, o := range owed {
		if o.Held() < 0 {
			t.Fatalf("a watch holds %d units", o.Held())
		}
		held += int64(o.Held())
		if i%3 != 0 || i%2 != 0 {
			holding += int64(o.Held()) // not left apart
		}
	}
	if c.Backlog() != held || c.Holding() != holding {
		t.Fatalf("backlog %d, holding %d; the watches hold %d, %d of them not apart", c.Backlog(), c.Holding(), held, holding)
	}
	for _, o := range owed {
		o.Excuse()
	}
	if c.Backlog() != 0 || c.Holding() != 0 {
		t.Errorf("backlog %d, holding %d once every watch is excused", c.Backlog(), c.Holding())
	}
}
