package track

import (
	"math"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
)

// A proxy that sees a newer change of a key has seen the older ones too;
// a change converges when every proxy has seen it.
func TestSupersededChangesCount(t *testing.T) {
	tr := New(2)
	t0 := time.Unix(100, 0)
	k := Key{meshgen.Endpoint, 7}
	tr.Made(meshgen.Change{N: 1, Kind: meshgen.Endpoint, Service: 7}, t0)
	tr.Made(meshgen.Change{N: 2, Kind: meshgen.Route, Service: 7}, t0)
	tr.Made(meshgen.Change{N: 3, Kind: meshgen.Endpoint, Service: 7}, t0.Add(time.Second))
	tr.Saw(0, k, 3, t0.Add(2*time.Second))
	tr.Saw(1, k, 1, t0.Add(3*time.Second))
	if tr.Pending() != 2 {
		t.Errorf("%d pending, want 2 (the route change, and change 3 at proxy 1)", tr.Pending())
	}
	tr.Saw(1, k, 3, t0.Add(4*time.Second))
	tr.Saw(1, k, 3, t0.Add(9*time.Second)) // seen again: changes nothing
	res := tr.Results()
	if !res[0].Done || res[0].Converged != 3*time.Second || !res[2].Done || res[2].Converged != 3*time.Second || res[1].Done {
		t.Errorf("results %+v", res)
	}
}

// A removal is reported as the latest change of its key.
func TestSawTheLatest(t *testing.T) {
	tr := New(1)
	k := Key{meshgen.RemoveService, 4}
	tr.Made(meshgen.Change{N: 9, Kind: meshgen.RemoveService, Service: 4}, time.Unix(0, 0))
	tr.Saw(0, k, math.MaxInt, time.Unix(1, 0))
	if tr.Pending() != 0 {
		t.Error("the removal did not converge")
	}
}

// Each proxy's convergence of each change is kept to 0.05 %.
func TestEachProxy(t *testing.T) {
	tr := New(4)
	t0 := time.Unix(100, 0)
	k := Key{meshgen.Endpoint, 1}
	tr.Made(meshgen.Change{N: 1, Kind: meshgen.Endpoint, Service: 1}, t0)
	for p, d := range []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond, 2 * time.Second} {
		tr.Saw(p, k, 1, t0.Add(d))
	}
	n, at := tr.EachProxy(0.5, 0.75, 1)
	want := []time.Duration{20 * time.Millisecond, 30 * time.Millisecond, 2 * time.Second}
	if n != 4 {
		t.Fatalf("n = %d, want 4", n)
	}
	for i := range want {
		if d := at[i] - want[i]; d < -want[i]/1000 || d > want[i]/1000 {
			t.Errorf("quantile %d: %v, want %v", i, at[i], want[i])
		}
	}
}

// TestExpect: a change expected by fewer proxies than the fleet is done
// once those have seen it.
func TestExpect(t *testing.T) {
	tr := New(10)
	tr.Expect(func(c meshgen.Change) int { return 2 })
	c := meshgen.Change{N: 1, Kind: meshgen.Endpoint, Service: 3}
	tr.Made(c, time.Now())
	tr.Saw(4, KeyOf(c), 1, time.Now())
	if tr.Done(1) || tr.Pending() != 1 {
		t.Fatal("done after one of its two proxies")
	}
	tr.Saw(8, KeyOf(c), 1, time.Now())
	if !tr.Done(1) || tr.Pending() != 0 || !tr.Results()[0].Done {
		t.Error("not done after both its proxies saw it")
	}
}

// TestBehind: the followed proxy is behind on a key it last saw as an
// older change than the newest made, even after it saw the newest (a
// store that went back sent it the older one again); changes it does not
// see and other kinds are left out.
func TestBehind(t *testing.T) {
	tr := New(2)
	tr.Follow(0)
	t0 := time.Unix(100, 0)
	ep, rt := Key{meshgen.Endpoint, 1}, Key{meshgen.Route, 2}
	tr.Made(meshgen.Change{N: 1, Kind: meshgen.Endpoint, Service: 1}, t0)
	tr.Made(meshgen.Change{N: 2, Kind: meshgen.Endpoint, Service: 1}, t0)
	tr.Made(meshgen.Change{N: 3, Kind: meshgen.Route, Service: 2}, t0)
	tr.Made(meshgen.Change{N: 4, Kind: meshgen.AddService, Service: 9}, t0)
	all := func(meshgen.Change) bool { return true }
	tr.Saw(0, ep, 2, t0)
	tr.Saw(0, rt, 3, t0)
	tr.Saw(1, ep, 1, t0) // another proxy's view does not count
	if got := tr.Behind(all); len(got) != 0 {
		t.Errorf("behind on %v, holding every newest change", got)
	}
	tr.Saw(0, ep, 1, t0.Add(time.Second)) // the store went back
	if got := tr.Behind(all); len(got) != 1 || got[0] != ep {
		t.Errorf("behind on %v, want the endpoints it holds an older change of", got)
	}
	if got := tr.Behind(func(c meshgen.Change) bool { return c.Kind != meshgen.Endpoint }); len(got) != 0 {
		t.Errorf("behind on %v, want nothing of changes it does not see", got)
	}
}
