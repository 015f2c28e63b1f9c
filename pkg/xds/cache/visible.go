package cache

import (
	"sync"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
)

// visibility memoizes, per class, the load assignments the class's
// clusters name, as of a version of its cluster table.
type visibility struct {
	mu      sync.Mutex
	classes map[string]visibleNames
}

type visibleNames struct {
	table   *Table
	version uint64
	names   map[string]bool
}

// Visible returns the names of a shared type a class may be served, or
// nil when the type is not one whose names a class's view limits. For load
// assignments they are those the class's EDS clusters name (their EDS
// service name, else their own): a proxy asking for another's, by name or
// by wildcard, is not served it. A class the cache does not hold sees
// none. The map is shared: read it, never write it.
func (c *Cache) Visible(class, typeURL string) map[string]bool {
	if typeURL != resource.EndpointType {
		return nil
	}
	t, err := c.Table(class, resource.ClusterType)
	if err != nil {
		return map[string]bool{}
	}
	version := t.Version()
	c.visible.mu.Lock()
	defer c.visible.mu.Unlock()
	if v, ok := c.visible.classes[class]; ok && v.table == t && v.version == version {
		return v.names
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
		c.visible.classes = map[string]visibleNames{}
	}
	c.visible.classes[class] = visibleNames{table: t, version: version, names: names}
	return names
}
