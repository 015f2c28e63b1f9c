package cache

import (
	"slices"
	"sync"

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

// visibility memoizes each class's view, per version of its cluster table.
type visibility struct {
	mu      sync.Mutex
	classes map[Class]visibleNames
}

type visibleNames struct {
	table   *Table
	version uint64
	view    *View
}

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
	version := t.Version()
	c.visible.mu.Lock()
	defer c.visible.mu.Unlock()
	if v, ok := c.visible.classes[class]; ok && v.table == t && v.version == version {
		return v.view
	}
	names := map[string]bool{}
	for name, r := range t.Resources() {
		cl, ok := r.(*cluster.Cluster)
		if !ok || cl.GetType() != cluster.Cluster_EDS {
			continue
		}
		if sn := cl.GetEdsClusterConfig().GetServiceName(); sn != "" {
			names[sn] = true
		} else {
			names[name] = true
		}
	}
	if c.visible.classes == nil {
		c.visible.classes = map[Class]visibleNames{}
	}
	view := newView(names)
	c.visible.classes[class] = visibleNames{table: t, version: version, view: view}
	return view
}
