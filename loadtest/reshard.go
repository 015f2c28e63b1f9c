package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/sim"
	"github.com/shardpilot/shardpilot/loadtest/track"
)

// placement is a sharded phase's placement, as the chart keeps it: each
// shard's namespaces in a file its pushers read (a ConfigMap), and each
// namespace's address (its Service), which the proxies dial at every
// connection.
type placement struct {
	dir        string
	namespaces int
	mu         sync.Mutex
	shards     [][]int  // namespaces by shard
	addrs      []string // ADS address by shard
}

// newPlacement places namespace ns on shard ns mod shards.
func newPlacement(dir string, shards, namespaces int) (*placement, error) {
	pl := &placement{dir: dir, namespaces: namespaces, shards: make([][]int, shards), addrs: make([]string, shards)}
	for ns := range namespaces {
		pl.shards[ns%shards] = append(pl.shards[ns%shards], ns)
	}
	for i := range shards {
		if err := pl.write(i); err != nil {
			return nil, err
		}
	}
	return pl, nil
}

// file is the namespaces file of a shard.
func (pl *placement) file(shard int) string {
	return filepath.Join(pl.dir, "shard-"+strconv.Itoa(shard))
}

// write writes a shard's namespaces file whole (renamed into place, as
// the kubelet swaps a ConfigMap volume's content).
func (pl *placement) write(shard int) error {
	pl.mu.Lock()
	var names []string
	for _, ns := range pl.shards[shard] {
		names = append(names, "ns-"+strconv.Itoa(ns))
	}
	pl.mu.Unlock()
	tmp := pl.file(shard) + ".tmp"
	if err := os.WriteFile(tmp, []byte("# shard "+strconv.Itoa(shard)+"\n"+strings.Join(names, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, pl.file(shard))
}

// addr is the address of a proxy's namespace's shard: where its Service leads.
func (pl *placement) addr(proxy int) string {
	ns := proxy % pl.namespaces
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i, nss := range pl.shards {
		if slices.Contains(nss, ns) {
			return pl.addrs[i]
		}
	}
	return ""
}

// setAddr records a shard's address.
func (pl *placement) setAddr(shard int, addr string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	pl.addrs[shard] = addr
}

// add adds a shard listing namespaces, which keep their addresses until
// the shards before it give them up (a namespace's address is its first
// shard's), writes its file, and returns its index.
func (pl *placement) add(namespaces []int) (int, error) {
	pl.mu.Lock()
	pl.shards = append(pl.shards, slices.Clone(namespaces))
	pl.addrs = append(pl.addrs, "")
	shard := len(pl.shards) - 1
	pl.mu.Unlock()
	return shard, pl.write(shard)
}

// move places namespaces on a shard, taking them from the others: their
// Services lead to it at once; the files are the caller's to write.
func (pl *placement) move(namespaces []int, to int) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for i := range pl.shards {
		pl.shards[i] = slices.DeleteFunc(pl.shards[i], func(ns int) bool { return slices.Contains(namespaces, ns) })
	}
	pl.shards[to] = append(pl.shards[to], namespaces...)
	slices.Sort(pl.shards[to])
}

// reshard adds a shard that takes a share of every shard's namespaces, and
// then removes it, as an operator changes the placement: each time, the
// proxies of the namespaces that move must reconnect to their new shard
// and the others keep their streams. start starts a pusher serving the
// namespaces of a file and returns it ready.
func reshard(ctx context.Context, sc Scenario, pl *placement, start func(shard int) (*proc, error),
	mesh *meshgen.Mesh, fleet *sim.Fleet, tracker *track.Tracker, prog *progress) ([]report.Move, error) {
	old := len(pl.shards)
	// The new shard takes the last 1/(old+1) of each shard's namespaces.
	var moved []int
	for _, nss := range pl.shards {
		k := max(1, len(nss)/(old+1))
		moved = append(moved, nss[len(nss)-k:]...)
	}
	slices.Sort(moved)
	before := make([][]int, old)
	for i, nss := range pl.shards {
		before[i] = slices.Clone(nss)
	}
	added, err := pl.add(moved)
	if err != nil {
		return nil, err
	}
	if _, err := start(added); err != nil {
		return nil, err
	}
	var moves []report.Move

	// Adding: the moved namespaces' Services lead to the new shard, then
	// the shards that gave them up read their files.
	m := measureMove(ctx, sc, fmt.Sprintf("a shard added, taking %d of %d namespaces", len(moved), sc.Namespaces), moved, pl, mesh, fleet, tracker, prog, func() error {
		pl.move(moved, added)
		for i := range old {
			if err := pl.write(i); err != nil {
				return err
			}
		}
		return nil
	})
	moves = append(moves, m)

	// Removing: the other shards are given their namespaces back and
	// their Services lead to them, then the added shard's file is emptied.
	m = measureMove(ctx, sc, fmt.Sprintf("the shard removed, giving back %d namespaces", len(moved)), moved, pl, mesh, fleet, tracker, prog, func() error {
		pl.mu.Lock()
		for i := range old {
			pl.shards[i] = slices.Clone(before[i])
		}
		pl.shards[added] = nil
		pl.mu.Unlock()
		for i := range old {
			if err := pl.write(i); err != nil {
				return err
			}
		}
		return pl.write(added)
	})
	moves = append(moves, m)
	return moves, nil
}

// measureMove makes a placement change (do) and, at that moment, a change
// in a moving namespace and one in the shared namespace (ns-0, which every
// proxy sees), and measures until every proxy holds a full config from the
// shard its namespace's Service leads to and both changes reached every
// proxy that sees them.
func measureMove(ctx context.Context, sc Scenario, name string, moving []int, pl *placement, mesh *meshgen.Mesh, fleet *sim.Fleet, tracker *track.Tracker, prog *progress, do func() error) report.Move {
	mv := report.Move{Name: name}
	errorsBefore := fleet.Stats().ErrorsOf
	began := time.Now()
	if err := do(); err != nil {
		mv.Problem = err.Error()
		return mv
	}
	var changes []meshgen.Change
	for _, svc := range []int{moving[0], 0} {
		c, err := mesh.Apply(meshgen.Endpoint, svc, func(c meshgen.Change) { tracker.Made(c, time.Now()) })
		if err != nil {
			mv.Problem = err.Error()
			return mv
		}
		changes = append(changes, c)
	}
	deadline := began.Add(sc.Settle + sc.connectTimeout)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		placed := fleet.Placed(pl.addr)
		if placed == sc.Proxies && mv.Placed == 0 {
			mv.Placed = time.Since(began).Seconds()
		}
		if mv.Placed > 0 && tracker.Pending() == 0 {
			break
		}
		prog.printf("%s: %d/%d proxies on their shard, %d changes pending", name, placed, sc.Proxies, tracker.Pending())
		time.Sleep(20 * time.Millisecond)
	}
	mv.Converged = time.Since(began).Seconds()
	if mv.Placed == 0 || tracker.Pending() > 0 {
		mv.Problem = fmt.Sprintf("%d of %d proxies on their shard, %d changes pending after %.0fs", fleet.Placed(pl.addr), sc.Proxies, tracker.Pending(), mv.Converged)
	}
	for _, r := range tracker.Results() {
		for _, c := range changes {
			if r.Change.N != c.N {
				continue
			}
			if r.Done {
				mv.ChangeConverged = max(mv.ChangeConverged, r.Converged.Seconds())
			} else if mv.Problem != "" {
				mv.Problem += fmt.Sprintf("; change %d (%s of service %d) reached %d proxies", c.N, c.Kind, c.Service, r.Proxies)
			}
		}
	}
	// The fleet runs every proxy here: its i-th is proxy i.
	for i, n := range fleet.Stats().ErrorsOf {
		if n == errorsBefore[i] {
			continue
		}
		if slices.Contains(moving, i%sc.Namespaces) {
			mv.Moved++
		} else {
			mv.Others++
		}
	}
	prog.done("%s: %d proxies moved, %d others reconnected; all on their shard after %.2fs, changes converged after %.2fs",
		name, mv.Moved, mv.Others, mv.Placed, mv.ChangeConverged)
	return mv
}
