package pusher

import (
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// Classify returns the class of a proxy (see package classify), from the
// last generation's index.
func (p *Pusher) Classify(node *core.Node) cache.Class { return p.index.Load().Classify(node) }
