package server

import (
	"context"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Hooks are every call the server makes to the control plane around it;
// it reads tables from Config.Cache, Secrets and Localities, and reaches
// its embedder by no other way. The embedder tells the server of what
// changes by its methods (Reclassify, Shed, EndUntrusted).
//
// The server makes each call on the goroutine of the stream concerned and
// with none of its locks held: a hook may block (a proxy's admission may
// load what its namespace sees) but must not call back into the server.
// OnCall alone runs on the connection's reader, before any message of the
// call is read, and must do no I/O. Embed NoHooks to implement some of
// them.
type Hooks interface {
	// OnCall screens every new call (a stream or a unary call) from its
	// connection and headers: an error refuses it, so that what a refused
	// client sends is never buffered.
	OnCall(ctx context.Context, md metadata.MD) error
	// OnStream admits every stream when it starts, before its first
	// message is read (with the I/O OnCall may not do: a token's review):
	// an error ends the stream with it, and the context returned is the
	// stream's.
	OnStream(ctx context.Context) (context.Context, error)
	// OnIdentity names the identity a stream's subscriptions count against
	// (see NameBudget), from its context as OnStream returned it; ""
	// counts them against its connection alone.
	OnIdentity(ctx context.Context) string
	// OnReady says whether there is a config to serve (the pusher has
	// loaded the mesh): until there is, a new subscription is refused with
	// UNAVAILABLE, never answered with an empty config a proxy would apply.
	OnReady() bool
	// OnNode checks a stream's node against the stream's context (its
	// peer's certificate) when the node first arrives, and returns the
	// node to serve it as; an error ends the stream with it.
	OnNode(ctx context.Context, node *core.Node) (*core.Node, error)
	// OnClassify names the class a proxy is served from (see Reclassify).
	OnClassify(node *core.Node) cache.Class
	// OnNewClass fills the tables of a class seen for the first time,
	// before its first proxy is served.
	OnNewClass(class cache.Class)
	// OnResponseLimit bounds the encoded size of one response to a proxy
	// of a class (0: none): grpc-go refuses a message above 4 MiB, and the
	// stream with it. A response past it is not sent and is reported, and
	// the stream is ended with the reason (ResourceExhausted); the proxy
	// keeps what it has.
	OnResponseLimit(class cache.Class) int
	// OnVirtualHosts says whether the Delta streams of a class are sent
	// their route configurations' virtual hosts apart (Envoy's VHDS): the
	// route configurations from the class's cache.VHDSRoutesType table,
	// which name the ADS stream as their virtual hosts' source, and the
	// virtual hosts from its table of resource.VirtualHostType, so that a
	// route change sends a proxy the one virtual host it changed.
	OnVirtualHosts(class cache.Class) bool
	// OnConfirmed is told of the epochs (from, to] that an ACK of a type
	// newly confirms (see Cache.Epoch).
	OnConfirmed(typeURL string, from, to int64)
	// OnClosed is told of the end of every stream OnNode admitted.
	OnClosed(node *core.Node)
	// OnRegister registers more services on the xDS gRPC server (Envoy's
	// client status discovery service, for one).
	OnRegister(r grpc.ServiceRegistrar)
}

// NoHooks are hooks that do nothing: every call and stream let in, always
// ready, every proxy admitted as it comes and served from the class ""
// (embedders name the classes), no response limit, route configurations
// sent whole.
type NoHooks struct{}

func (NoHooks) OnCall(context.Context, metadata.MD) error { return nil }

func (NoHooks) OnStream(ctx context.Context) (context.Context, error) { return ctx, nil }

func (NoHooks) OnIdentity(context.Context) string { return "" }

func (NoHooks) OnReady() bool { return true }

func (NoHooks) OnNode(_ context.Context, node *core.Node) (*core.Node, error) { return node, nil }

func (NoHooks) OnClassify(*core.Node) cache.Class { return "" }

func (NoHooks) OnNewClass(cache.Class) {}

func (NoHooks) OnResponseLimit(cache.Class) int { return 0 }

func (NoHooks) OnVirtualHosts(cache.Class) bool { return false }

func (NoHooks) OnConfirmed(string, int64, int64) {}

func (NoHooks) OnClosed(*core.Node) {}

func (NoHooks) OnRegister(grpc.ServiceRegistrar) {}

var _ Hooks = NoHooks{}

// OneClass returns hooks that serve every proxy from one class, whose
// tables are filled by whoever fills the cache; the rest are NoHooks'.
func OneClass(class cache.Class) Hooks { return oneClass{class: class} }

type oneClass struct {
	NoHooks
	class cache.Class
}

func (o oneClass) OnClassify(*core.Node) cache.Class { return o.class }
