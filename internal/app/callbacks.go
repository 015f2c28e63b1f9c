package app

import (
	"cmp"
	"context"
	"strings"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/pkg/classify"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// callbacks are the xDS server's calls into the pusher. A proxy is
// admitted when its node matches its identity (with a policy), when its
// namespace is served here, and, with byProxies, once what its namespace
// sees is loaded.
type callbacks struct {
	pusher    *pusher.Pusher
	policy    *identity.Policy
	byProxies bool
}

var _ server.Callbacks = callbacks{}

// Ready says whether the pusher has loaded the mesh.
func (c callbacks) Ready() bool { return c.pusher.GeneratedRevision() > 0 }

// Admit checks a proxy's identity, then that this pusher serves its
// namespace, then (by proxies) loads what the namespace sees.
func (c callbacks) Admit(ctx context.Context, node *core.Node) (*core.Node, error) {
	if c.policy != nil {
		var err error
		if node, err = c.policy.Authorize(ctx, node); err != nil {
			return nil, err
		}
	}
	ns := classify.Namespace(node)
	if !c.pusher.Serves(ns) {
		served, _ := c.pusher.Placement()
		return nil, status.Errorf(codes.FailedPrecondition, "shardpilot: this pusher serves the proxies of namespaces %s, not of %q: connect to the pushers of its shard",
			cmp.Or(strings.Join(served, ","), "(none)"), ns)
	}
	if c.byProxies {
		// A namespace's view is loaded with its first proxy: the proxy
		// retries until it is.
		if err := c.pusher.Admit(ns); err != nil {
			c.pusher.Left(ns)
			return nil, status.Errorf(codes.Unavailable, "shardpilot: loading what namespace %q sees; retry", ns)
		}
	}
	return node, nil
}

// Closed releases, by proxies, what a proxy's namespace sees once its
// last proxy left.
func (c callbacks) Closed(node *core.Node) {
	if c.byProxies {
		c.pusher.Left(classify.Namespace(node))
	}
}

// Confirmed measures the convergence of the generations an ACK confirms.
func (c callbacks) Confirmed(typeURL string, from, to int64) { c.pusher.Confirmed(typeURL, from, to) }
