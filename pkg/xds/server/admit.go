package server

import (
	"bytes"
	"errors"
	"slices"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A stream's first requests: the proxy's admission, its class and the
// watch of each type it asks for. They run on the stream's handler, the
// only goroutine that changes the node, the classes and the watches, and
// call out (the hooks: a proxy's admission, class, a new class's fill) without
// the stream's lock.

// request applies what every request may carry, its node, and returns the
// stream's watch of the request's type (nil for a type not served), made
// at the type's first request. It runs on the handler, and makes its
// calls out (the proxy's admission, readiness, its class and a new
// class's fill) without the stream's lock. fixed is the type of a
// single-type stream.
func (st *stream) request(hasNode bool, node, typeURL []byte, fixed string) (*watch, error) {
	if hasNode {
		if err := st.admit(node); err != nil {
			return nil, err
		}
	}
	return st.watchOf(typeURL, fixed)
}

// admit records the stream's node from its encoding, as the hooks
// admit it (Hooks.OnNode); a node that names another proxy than the stream's first is
// refused.
func (st *stream) admit(b []byte) error {
	if st.node != nil && (bytes.Equal(b, st.nodeRaw) || sameID(b, st.node.GetId())) {
		// Envoy sends its node with every request; its metadata, a
		// map, may be encoded in another order each time. A stream's
		// proxy is classified once, from its first node.
		return nil
	}
	if len(b) > st.srv.cfg.MaxNodeBytes {
		st.srv.m.limited.WithLabelValues(limitNode).Inc()
		return status.Errorf(codes.InvalidArgument, "shardpilot: a node of %d bytes; at most %d are taken", len(b), st.srv.cfg.MaxNodeBytes)
	}
	n := &core.Node{}
	if err := proto.Unmarshal(b, n); err != nil {
		return status.Errorf(codes.InvalidArgument, "shardpilot: node: %v", err)
	}
	if st.node != nil && n.GetId() != st.node.GetId() {
		return status.Errorf(codes.InvalidArgument, "shardpilot: the node changed from %q to %q on one stream", st.node.GetId(), n.GetId())
	}
	admitted, err := st.srv.cfg.Hooks.OnNode(st.ctx, n)
	if err != nil {
		st.srv.cfg.Log.Warn("proxy refused", "proxy", n.GetId(), "err", err)
		return err
	}
	n = admitted
	st.mu.Lock()
	defer st.mu.Unlock()
	st.node, st.nodeRaw = n, append(st.nodeRaw[:0], b...)
	return nil
}

// watchOf returns the stream's watch of a type, making it (and
// classifying the proxy) at the type's first request. An unserved type
// is answered with nothing: nil and no error.
func (st *stream) watchOf(requested []byte, fixed string) (*watch, error) {
	if len(requested) == 0 && fixed == "" {
		return nil, status.Error(codes.InvalidArgument, "shardpilot: a request without type_url on an aggregated stream")
	}
	for _, w := range st.watches {
		if len(requested) == 0 || string(requested) == w.typeURL {
			return w, nil
		}
	}
	typeURL := fixed
	if len(requested) > 0 {
		typeURL = string(requested)
	}
	if st.node == nil {
		return nil, status.Error(codes.InvalidArgument, "shardpilot: the first request of a stream must carry a node")
	}
	if typeURL == resource.SecretType && st.srv.secrets != nil {
		return st.secretWatch(typeURL)
	}
	if !st.srv.cfg.Hooks.OnReady() {
		return nil, errNotReady
	}
	if typeURL == resource.EndpointType && st.srv.localities != nil {
		if w, err := st.localityWatch(typeURL); w != nil || err != nil {
			return w, err
		}
	}
	var t *cache.Table
	var err error
	if st.class == "" {
		class := st.srv.cfg.Hooks.OnClassify(st.node)
		t, err = st.srv.join(class, st.tableType(class, typeURL))
		st.mu.Lock()
		st.class = class // counted in its class, left when the stream ends
		st.responseLimit = st.srv.cfg.Hooks.OnResponseLimit(class)
		st.mu.Unlock()
	} else {
		t, err = st.srv.table(st.class, st.tableType(st.class, typeURL))
	}
	if errors.Is(err, cache.ErrNotServed) {
		st.srv.cfg.Log.Debug("request for a type not served; ignored", "proxy", st.node.GetId(), "type", typeURL)
		return nil, nil
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "shardpilot: %v", err)
	}
	return st.addWatch(typeURL, t)
}

// tableType returns the key of the table a type is served from to the
// stream: a Delta stream of a class whose proxies take their route
// configurations' virtual hosts apart (Hooks.OnVirtualHosts) is sent its
// route configurations without them (cache.VHDSRoutesType), and the
// virtual hosts on their own type.
func (st *stream) tableType(class cache.Class, typeURL string) string {
	if typeURL == resource.RouteType && st.delta && st.srv.cfg.Hooks.OnVirtualHosts(class) {
		return cache.VHDSRoutesType
	}
	return typeURL
}

// localityWatch makes the stream's watch of the load assignments of its
// proxy's locality; nil when it has none, or when there are too many.
func (st *stream) localityWatch(typeURL string) (*watch, error) {
	locality := st.srv.cfg.Localities.Class(st.node)
	if locality == "" {
		return nil, nil
	}
	// Localities are the proxies' word: bounded, so that made-up ones
	// cannot grow the server's tables without end.
	t, ok, err := st.srv.localities.join(locality, typeURL, st.srv.cfg.MaxLocalities)
	if !ok {
		st.srv.m.limited.WithLabelValues(limitLocality).Inc()
		st.srv.cfg.Log.Warn("locality classes at their limit; serving the mesh-wide load assignments", "proxy", st.node.GetId(), "locality", locality, "limit", st.srv.cfg.MaxLocalities)
		return nil, nil
	}
	st.mu.Lock()
	st.locality = locality
	st.mu.Unlock()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "shardpilot: %v", err)
	}
	return st.addWatch(typeURL, t)
}

// addWatch adds the stream's watch of a type's table.
func (st *stream) addWatch(typeURL string, t *cache.Table) (*watch, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return nil, errClosed
	}
	return st.addWatchLocked(typeURL, t), nil
}

// addWatchLocked adds the stream's watch of a type's table, in push order.
func (st *stream) addWatchLocked(typeURL string, t *cache.Table) *watch {
	w := &watch{st: st, typeURL: typeURL, short: shortType(typeURL), table: t, owed: t.NewOwed()}
	i, _ := slices.BinarySearchFunc(st.watches, rank(typeURL), func(w *watch, r int) int { return rank(w.typeURL) - r })
	st.watches = slices.Insert(st.watches, i, w)
	return w
}

// secretWatch makes the stream's watch of its identity's secrets; a
// stream without an identity is served none.
func (st *stream) secretWatch(typeURL string) (*watch, error) {
	class := st.srv.cfg.Secrets.Class(st.ctx)
	if class == "" {
		if !st.noSecrets {
			st.noSecrets = true
			st.srv.cfg.Log.Warn("secrets requested by a proxy without an identity (no client certificate); none served", "proxy", st.node.GetId())
		}
		return nil, nil
	}
	t, _, err := st.srv.secrets.join(class, typeURL, 0)
	st.mu.Lock()
	st.secrets = class
	st.mu.Unlock()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "shardpilot: %v", err)
	}
	return st.addWatch(typeURL, t)
}
