package cache

import (
	"slices"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// View is what a class may be served of a shared type, as of one version
// of the class's tables. A new View is made only when that changes, so two
// calls that return the same View saw the same thing.
type View struct {
	names  map[string]bool
	sorted []string
}

// Has reports whether the view holds name.
func (v *View) Has(name string) bool { return v.names[name] }

// Names returns every name the view holds, sorted; shared: do not modify.
func (v *View) Names() []string { return v.sorted }

func newView(names map[string]bool) *View {
	v := &View{names: names, sorted: make([]string, 0, len(names))}
	for n := range names {
		v.sorted = append(v.sorted, n)
	}
	slices.Sort(v.sorted)
	return v
}

// emptyView is the view of a class the cache does not hold.
var emptyView = newView(nil)

// Visible returns what a class may be served of a shared type, or nil when
// the type is not one a class's view limits. For load assignments it is
// what the class's EDS clusters name (their EDS service name, else their
// own): a proxy asking for another's, by name or by wildcard, is not
// served it. A class the cache does not hold sees nothing.
func (c *Cache) Visible(class Class, typeURL string) *View {
	if typeURL != resource.EndpointType {
		return nil
	}
	t, err := c.Table(class, resource.ClusterType)
	if err != nil {
		return emptyView
	}
	return t.edsView()
}

// edsView is what a cluster table's clusters name of load assignments,
// made once per version of the table and kept with it.
func (t *Table) edsView() *View {
	t.mu.RLock()
	v, fresh := t.view, t.view != nil && t.viewAt == t.version
	t.mu.RUnlock()
	if fresh {
		return v
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.view != nil && t.viewAt == t.version {
		return t.view
	}
	names := map[string]bool{}
	for name, e := range t.entries {
		cl, ok := e.res.(*cluster.Cluster)
		if !ok || cl.GetType() != cluster.Cluster_EDS {
			continue
		}
		if sn := cl.GetEdsClusterConfig().GetServiceName(); sn != "" {
			names[sn] = true
		} else {
			names[name] = true
		}
	}
	t.view, t.viewAt = newView(names), t.version
	return t.view
}
