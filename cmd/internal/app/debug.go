package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/protobuf/encoding/protojson"
)

// ConfigDump serves /debug/config_dump?proxy=<id>: every resource the
// pusher holds for a connected proxy's class, as JSON.
type ConfigDump struct {
	Status *server.Status
	cache  atomic.Pointer[cache.Cache]
	pusher atomic.Pointer[pusher.Pusher]
}

func (d *ConfigDump) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("proxy")
	if id == "" {
		http.Error(w, "config_dump: ?proxy=<node id> is required (see /debug/syncz for the connected proxies)", http.StatusBadRequest)
		return
	}
	node := d.Status.Node(id)
	if node == nil {
		http.Error(w, fmt.Sprintf("config_dump: proxy %q is not connected to this replica", id), http.StatusNotFound)
		return
	}
	c, ps := d.cache.Load(), d.pusher.Load()
	if c == nil || ps == nil {
		http.Error(w, "config_dump: the pusher is starting", http.StatusServiceUnavailable)
		return
	}
	class := ps.Classify(node)
	dump := map[string]any{"proxy": id, "class": class}
	resources := map[string][]json.RawMessage{}
	add := func(class, typeURL string) {
		held := c.Resources(class, typeURL)
		names := make([]string, 0, len(held))
		for n := range held {
			names = append(names, n)
		}
		slices.Sort(names)
		short := typeURL[strings.LastIndex(typeURL, ".")+1:]
		for _, n := range names {
			b, err := protojson.Marshal(held[n])
			if err != nil {
				continue
			}
			resources[short] = append(resources[short], b)
		}
	}
	for _, t := range pusher.ClassTypes {
		add(class, t)
	}
	for _, t := range pusher.SharedTypes {
		add(cache.Shared, t)
	}
	dump["resources"] = resources
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(dump)
}
