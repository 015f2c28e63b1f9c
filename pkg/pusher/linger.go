package pusher

import (
	"maps"
	"slices"
	"strings"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// linger keeps serving, per class, the clusters the class no longer has
// until the routes and listeners that stopped naming them have reached the
// proxies: make before break. Those go out in the same generation, after
// the clusters; a client told of the removal first would fail the requests
// its old routes still send there (grpc-go does, with "resource ... has
// been removed"). A removed cluster goes at the first later generation
// that starts with every push of the last wave written and answered, or
// after period at the latest.
type linger struct {
	period time.Duration                          // zero or less: clusters go at once
	last   classMemo[map[string]*cluster.Cluster] // name → cluster
	gone   classMemo[map[string]lingering]        // name → removed cluster
}

type lingering struct {
	c     *cluster.Cluster
	since time.Time
	gen   uint64 // the generation that removed it
}

// expire forgets the lingering clusters of a class that may go in
// generation gen: those removed by an earlier generation when the last
// wave of pushes had been written and answered as gen began (delivered),
// and those removed period ago. It runs before the class's print is
// taken, so that a generation that lets them go is not skipped as one
// that changes nothing.
func (l *linger) expire(class cache.Class, gen uint64, delivered bool, now time.Time) {
	gone, ok := l.gone.get(class)
	if !ok {
		return
	}
	for name, g := range gone {
		if delivered && g.gen < gen || now.Sub(g.since) >= l.period {
			delete(gone, name)
		}
	}
	if len(gone) == 0 {
		l.gone.forget(class)
	}
}

// apply returns the clusters to hand over for a class in generation gen,
// after expire: list, and those it no longer holds that may still be
// named by what the proxies hold. It also returns when the next lingering
// cluster goes at the latest (zero: none lingers).
func (l *linger) apply(class cache.Class, list []*cluster.Cluster, gen uint64, now time.Time) ([]*cluster.Cluster, time.Time) {
	if l.period <= 0 {
		return list, time.Time{}
	}
	current := make(map[string]*cluster.Cluster, len(list))
	for _, c := range list {
		current[c.Name] = c
	}
	gone, _ := l.gone.get(class)
	last, _ := l.last.get(class)
	for name, c := range last {
		if _, ok := current[name]; !ok {
			if _, already := gone[name]; !already {
				if gone == nil {
					gone = map[string]lingering{}
				}
				gone[name] = lingering{c, now, gen}
			}
		}
	}
	l.last.set(class, current)
	var next time.Time
	out := list
	for name, g := range gone {
		if current[name] != nil {
			delete(gone, name) // back
			continue
		}
		if len(out) == len(list) {
			out = slices.Clone(list)
		}
		out = append(out, g.c)
		if due := g.since.Add(l.period); next.IsZero() || due.Before(next) {
			next = due
		}
	}
	if len(gone) == 0 {
		l.gone.forget(class)
	} else {
		l.gone.set(class, gone)
	}
	return out, next
}

// next returns when the first lingering cluster of any class goes at the
// latest (zero: none lingers).
func (l *linger) next() time.Time {
	var next time.Time
	for _, gone := range l.gone.by {
		for _, g := range gone {
			if due := g.since.Add(l.period); next.IsZero() || due.Before(next) {
				next = due
			}
		}
	}
	return next
}

// key names the clusters a class still serves after their removal, for
// the class's print: when they go the class is generated again.
func (l *linger) key(class cache.Class) string {
	gone, _ := l.gone.get(class)
	return strings.Join(slices.Sorted(maps.Keys(gone)), ",")
}

// keep forgets the classes not listed (dropped by the tables).
func (l *linger) keep(classes []cache.Class) {
	l.last.keep(classes)
	l.gone.keep(classes)
}
