package patch

import (
	"fmt"
	"slices"

	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// InboundListener is the name of a sidecar's inbound listener: its
// patches are SIDECAR_INBOUND's, the others' SIDECAR_OUTBOUND's.
const InboundListener = "virtualInbound"

const connectionManager = "envoy.filters.network.http_connection_manager"

// Listeners applies the LISTENER, FILTER_CHAIN, NETWORK_FILTER and
// HTTP_FILTER patches, and the route patches to the route configurations
// the listeners hold inline, to a class's listeners; those given are not
// modified.
func (s *Set) Listeners(in []*listener.Listener, router bool) []*listener.Listener {
	patches := s.of(meshv1.EnvoyPatch_APPLY_TO_LISTENER, meshv1.EnvoyPatch_APPLY_TO_FILTER_CHAIN,
		meshv1.EnvoyPatch_APPLY_TO_NETWORK_FILTER, meshv1.EnvoyPatch_APPLY_TO_HTTP_FILTER)
	routePatches := s.of(meshv1.EnvoyPatch_APPLY_TO_ROUTE_CONFIGURATION, meshv1.EnvoyPatch_APPLY_TO_VIRTUAL_HOST, meshv1.EnvoyPatch_APPLY_TO_HTTP_ROUTE)
	if len(patches) == 0 && len(routePatches) == 0 {
		return in
	}
	out := slices.Clone(in)
	for _, b := range patches {
		switch {
		case b.p.ApplyTo == meshv1.EnvoyPatch_APPLY_TO_LISTENER && b.p.Operation == meshv1.EnvoyPatch_OPERATION_ADD:
			out = added(s, b, "listener", out, router)
		case b.p.ApplyTo == meshv1.EnvoyPatch_APPLY_TO_LISTENER && b.p.Operation == meshv1.EnvoyPatch_OPERATION_REMOVE:
			out = slices.DeleteFunc(out, func(l *listener.Listener) bool { return listenerMatches(b.p, l, router) })
		default:
			for i, l := range out {
				if listenerMatches(b.p, l, router) {
					out[i] = patched(s, b, "listener "+l.Name, l, func(l *listener.Listener) error { return onListener(b, l) })
				}
			}
		}
	}
	if len(routePatches) > 0 {
		for i, l := range out {
			out[i] = s.inlineRoutes(routePatches, l, router)
		}
	}
	return out
}

func listenerMatches(p *meshv1.EnvoyPatch, l *listener.Listener, router bool) bool {
	inbound := !router && l.Name == InboundListener
	if !contextMatches(p.Context, router, inbound) {
		return false
	}
	m := p.Match
	if m.GetListenerName() != "" && m.GetListenerName() != l.Name {
		return false
	}
	if m.GetPort() != 0 {
		if inbound {
			// An inbound port is a filter chain's destination port.
			return slices.ContainsFunc(l.FilterChains, func(c *listener.FilterChain) bool { return chainPort(c) == m.GetPort() })
		}
		if l.GetAddress().GetSocketAddress().GetPortValue() != m.GetPort() {
			return false
		}
	}
	return true
}

func chainPort(c *listener.FilterChain) uint32 {
	return c.GetFilterChainMatch().GetDestinationPort().GetValue()
}

// chainMatches reports whether a filter chain is one a patch's match
// takes: by name, by destination port on the inbound listener, and by a
// filter it holds.
func chainMatches(m *meshv1.PatchMatch, l *listener.Listener, c *listener.FilterChain) bool {
	if m.GetFilterChainName() != "" && m.GetFilterChainName() != c.Name {
		return false
	}
	if m.GetPort() != 0 && l.Name == InboundListener && chainPort(c) != m.GetPort() {
		return false
	}
	return m.GetFilterName() == "" || slices.ContainsFunc(c.Filters, func(f *listener.Filter) bool { return f.Name == m.GetFilterName() })
}

// onListener applies a patch below the listener level, or a listener MERGE.
func onListener(b bound, l *listener.Listener) error {
	m := b.p.Match
	switch b.p.ApplyTo {
	case meshv1.EnvoyPatch_APPLY_TO_LISTENER:
		merge(l, b.value)
		return nil
	case meshv1.EnvoyPatch_APPLY_TO_FILTER_CHAIN:
		switch b.p.Operation {
		case meshv1.EnvoyPatch_OPERATION_ADD:
			l.FilterChains = append(l.FilterChains, proto.CloneOf(b.value.(*listener.FilterChain)))
		case meshv1.EnvoyPatch_OPERATION_REMOVE:
			l.FilterChains = slices.DeleteFunc(l.FilterChains, func(c *listener.FilterChain) bool { return chainMatches(m, l, c) })
		case meshv1.EnvoyPatch_OPERATION_MERGE:
			for _, c := range l.FilterChains {
				if chainMatches(m, l, c) {
					merge(c, b.value)
				}
			}
		}
		return nil
	}
	for _, c := range l.FilterChains {
		if !chainMatches(m, l, c) {
			continue
		}
		var err error
		if b.p.ApplyTo == meshv1.EnvoyPatch_APPLY_TO_NETWORK_FILTER {
			c.Filters, err = named(b, c.Filters, m.GetFilterName(), func(f *listener.Filter) string { return f.Name })
		} else {
			err = httpFilters(b, c)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// httpFilters applies an HTTP_FILTER patch to the connection managers of
// a filter chain.
func httpFilters(b bound, c *listener.FilterChain) error {
	for _, f := range c.Filters {
		if f.Name != connectionManager || f.GetTypedConfig() == nil {
			continue
		}
		manager := &hcm.HttpConnectionManager{}
		if err := f.GetTypedConfig().UnmarshalTo(manager); err != nil {
			return fmt.Errorf("%s: %v", f.Name, err)
		}
		var err error
		manager.HttpFilters, err = named(b, manager.HttpFilters, b.p.Match.GetSubFilterName(), func(f *hcm.HttpFilter) string { return f.Name })
		if err != nil {
			return err
		}
		a, err := anypb.New(manager)
		if err != nil {
			return err
		}
		f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: a}
	}
	return nil
}

// named applies a patch to a list of named filters: name selects the
// filter the operation is relative to ("" none).
func named[F proto.Message](b bound, list []F, name string, nameOf func(F) string) ([]F, error) {
	value := func() F { return proto.Clone(b.value).(F) }
	i := slices.IndexFunc(list, func(f F) bool { return nameOf(f) == name })
	switch b.p.Operation {
	case meshv1.EnvoyPatch_OPERATION_ADD:
		return append(list, value()), nil
	case meshv1.EnvoyPatch_OPERATION_INSERT_FIRST:
		return slices.Insert(list, 0, value()), nil
	case meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, meshv1.EnvoyPatch_OPERATION_INSERT_AFTER:
		return inserted(list, value(), i, name != "", b.p.Operation == meshv1.EnvoyPatch_OPERATION_INSERT_AFTER), nil
	}
	if name == "" {
		return list, nil // REMOVE, MERGE and REPLACE name a filter
	}
	switch b.p.Operation {
	case meshv1.EnvoyPatch_OPERATION_REMOVE:
		return slices.DeleteFunc(list, func(f F) bool { return nameOf(f) == name }), nil
	case meshv1.EnvoyPatch_OPERATION_REPLACE:
		if i >= 0 {
			list[i] = value()
		}
	case meshv1.EnvoyPatch_OPERATION_MERGE:
		for _, f := range list {
			if nameOf(f) == name {
				if err := mergeFilter(f, b.value); err != nil {
					return nil, err
				}
			}
		}
	}
	return list, nil
}

// inlineRoutes applies route patches to the route configurations the
// connection managers of a listener hold inline (a sidecar's inbound
// routes).
func (s *Set) inlineRoutes(patches []bound, l *listener.Listener, router bool) *listener.Listener {
	var out *listener.Listener
	for ci, c := range l.FilterChains {
		for fi, f := range c.Filters {
			if f.Name != connectionManager || f.GetTypedConfig() == nil {
				continue
			}
			manager := &hcm.HttpConnectionManager{}
			if f.GetTypedConfig().UnmarshalTo(manager) != nil || manager.GetRouteConfig() == nil {
				continue
			}
			rc := s.routeConfig(patches, manager.GetRouteConfig(), router)
			if rc == manager.GetRouteConfig() {
				continue
			}
			manager.RouteSpecifier = &hcm.HttpConnectionManager_RouteConfig{RouteConfig: rc}
			a, err := anypb.New(manager)
			if err != nil {
				continue
			}
			if out == nil {
				out = proto.CloneOf(l)
			}
			out.FilterChains[ci].Filters[fi].ConfigType = &listener.Filter_TypedConfig{TypedConfig: a}
		}
	}
	if out == nil {
		return l
	}
	return out
}
