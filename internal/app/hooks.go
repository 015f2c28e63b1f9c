package app

import (
	"cmp"
	"context"
	"strings"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/nodemeta"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// hooks are the xDS server's calls into the pusher and the policy. A call
// is screened and a stream admitted by the policy (when there is one); a
// proxy is admitted when its node matches its identity, when its namespace
// is served here, and, with byProxies, once what its namespace sees is
// loaded. The pusher names a proxy's class and fills it.
type hooks struct {
	pusher    *pusher.Pusher
	policy    *identity.Policy
	byProxies bool
	// announcer, when set, registers the workloads whose agents name a
	// WorkloadGroup (AUTO_REGISTER_GROUP).
	announcer *bus.Announcer
	// register registers the other services the ADS port serves (CSDS,
	// Istio's CA).
	register func(grpc.ServiceRegistrar)
}

var _ server.Hooks = hooks{}

// OnCall screens a call by its connection and headers, before anything
// it sends is read.
func (c hooks) OnCall(ctx context.Context, md metadata.MD) error {
	if c.policy == nil {
		return nil
	}
	return c.policy.Screen(ctx, md)
}

// OnStream admits a stream by its peer (a token's review).
func (c hooks) OnStream(ctx context.Context) (context.Context, error) {
	if c.policy == nil {
		return ctx, nil
	}
	return c.policy.Admit(ctx)
}

// OnIdentity is the identity a stream was admitted as: what it subscribes
// to counts against it.
func (c hooks) OnIdentity(ctx context.Context) string {
	if id, ok := identity.Admitted(ctx); ok {
		return id.String()
	}
	return ""
}

// OnReady says whether the pusher has loaded the mesh.
func (c hooks) OnReady() bool { return c.pusher.GeneratedRevision() > 0 }

func (c hooks) OnClassify(node *core.Node) cache.Class { return c.pusher.Classify(node) }

func (c hooks) OnNewClass(class cache.Class) { c.pusher.FillClass(class) }

func (c hooks) OnResponseLimit(class cache.Class) int { return c.pusher.ResponseLimit(class) }

func (c hooks) OnVirtualHosts(class cache.Class) bool { return c.pusher.VirtualHosts(class) }

func (c hooks) OnRegister(r grpc.ServiceRegistrar) { c.register(r) }

// OnNode checks a proxy's identity, then that this pusher serves its
// namespace, then (by proxies) loads what the namespace sees.
func (c hooks) OnNode(ctx context.Context, node *core.Node) (*core.Node, error) {
	if c.policy != nil {
		var err error
		if node, err = c.policy.Authorize(ctx, node); err != nil {
			return nil, err
		}
	}
	ns := nodemeta.Namespace(node)
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
	if err := c.announce(ctx, node); err != nil {
		if c.byProxies {
			c.pusher.Left(ns)
		}
		return nil, err
	}
	return node, nil
}

// register announces a workload whose agent names a WorkloadGroup, with
// the identity its stream was verified with, and refuses the stream when
// the ingesters refuse the registration, as istiod does. The node is the
// stream's key for OnClosed.
func (c hooks) announce(ctx context.Context, node *core.Node) error {
	meta := node.GetMetadata().GetFields()
	group := meta["AUTO_REGISTER_GROUP"].GetStringValue()
	if group == "" || c.announcer == nil {
		return nil
	}
	var id identity.ID
	ok := false
	if c.policy != nil {
		id, ok, _ = c.policy.Identify(ctx)
	}
	if !ok {
		return status.Error(codes.PermissionDenied, "shardpilot: registering a workload (AUTO_REGISTER_GROUP) needs a verified identity: a client certificate with a SPIFFE ID, or a service account token")
	}
	r := model.Registration{Group: group, Namespace: nodemeta.Namespace(node), Identity: id.String(), Proxy: node.GetId(),
		Address: workloadAddress(node), Network: meta["NETWORK"].GetStringValue(), ConnectedAt: time.Now()}
	if l := node.GetLocality(); l != nil {
		r.Locality = strings.TrimRight(l.GetRegion()+"/"+l.GetZone()+"/"+l.GetSubZone(), "/")
	}
	for k, v := range meta["LABELS"].GetStructValue().GetFields() {
		if r.Labels == nil {
			r.Labels = map[string]string{}
		}
		r.Labels[k] = v.GetStringValue()
	}
	if err := c.announcer.Connect(ctx, node, r); err != nil {
		return status.Errorf(codes.FailedPrecondition, "shardpilot: auto-registration of %s in WorkloadGroup %s/%s: %v", node.GetId(), r.Namespace, group, err)
	}
	return nil
}

// workloadAddress is a workload's first IP: of Istio's INSTANCE_IPS
// metadata, else of its node id (sidecar~10.1.2.3~...).
func workloadAddress(node *core.Node) string {
	if ips := node.GetMetadata().GetFields()["INSTANCE_IPS"].GetStringValue(); ips != "" {
		first, _, _ := strings.Cut(ips, ",")
		return first
	}
	if parts := strings.Split(node.GetId(), "~"); len(parts) == 4 {
		return parts[1]
	}
	return ""
}

// OnClosed releases, by proxies, what a proxy's namespace sees once its
// last proxy left, and announces the end of a registered workload's
// stream.
func (c hooks) OnClosed(node *core.Node) {
	if c.byProxies {
		c.pusher.Left(nodemeta.Namespace(node))
	}
	if c.announcer != nil {
		c.announcer.Disconnect(node)
	}
}

// OnConfirmed measures the convergence of the generations an ACK confirms.
func (c hooks) OnConfirmed(typeURL string, from, to int64) { c.pusher.Confirmed(typeURL, from, to) }
