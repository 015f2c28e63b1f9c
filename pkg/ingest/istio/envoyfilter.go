package istio

import (
	"encoding/json"
	"fmt"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/envoypatch"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/structpb"
)

// EnvoyFilter (networking.istio.io/v1alpha3).

type envoyFilter struct {
	WorkloadSelector *struct {
		Labels map[string]string `json:"labels"`
	} `json:"workloadSelector"`
	TargetRefs    json.RawMessage    `json:"targetRefs" field:"rejected: EnvoyFilters attached to gateways and waypoints are not supported yet"`
	ConfigPatches []envoyConfigPatch `json:"configPatches"`
	Priority      int32              `json:"priority"`
}

type envoyConfigPatch struct {
	ApplyTo string      `json:"applyTo" field:"supported: all but EXTENSION_CONFIG (rejected: no extension configuration discovery is served) and BOOTSTRAP (warned: the bootstrap is not the pushers')"`
	Match   *patchMatch `json:"match"`
	Patch   *struct {
		Operation   string          `json:"operation"`
		Value       map[string]any  `json:"value"`
		FilterClass json.RawMessage `json:"filterClass" field:"rejected: the filter's place is given by the operation alone"`
	} `json:"patch"`
}

// A match field that is not acted on would widen what a patch applies to:
// each is rejected, never ignored.
type patchMatch struct {
	Context string `json:"context"`
	Proxy   *struct {
		ProxyVersion string          `json:"proxyVersion"`
		Metadata     json.RawMessage `json:"metadata" field:"rejected: node metadata is not part of a class of proxies"`
	} `json:"proxy"`
	Listener *struct {
		PortNumber  uint32          `json:"portNumber"`
		PortName    json.RawMessage `json:"portName" field:"rejected: deprecated in Istio; match the port number"`
		FilterChain *struct {
			Name                 string          `json:"name"`
			Sni                  json.RawMessage `json:"sni" field:"rejected: not supported yet"`
			TransportProtocol    json.RawMessage `json:"transportProtocol" field:"rejected: not supported yet"`
			ApplicationProtocols json.RawMessage `json:"applicationProtocols" field:"rejected: not supported yet"`
			DestinationPort      json.RawMessage `json:"destinationPort" field:"rejected: not supported yet; on the inbound listener, portNumber matches the chain's port"`
			Filter               *struct {
				Name      string `json:"name"`
				SubFilter *struct {
					Name string `json:"name"`
				} `json:"subFilter"`
			} `json:"filter"`
		} `json:"filterChain"`
		Name           string          `json:"name"`
		ListenerFilter json.RawMessage `json:"listenerFilter" field:"rejected: not supported yet"`
	} `json:"listener"`
	RouteConfiguration *struct {
		PortNumber uint32          `json:"portNumber"`
		PortName   json.RawMessage `json:"portName" field:"rejected: not supported yet"`
		Gateway    json.RawMessage `json:"gateway" field:"rejected: not supported yet"`
		Vhost      *struct {
			Name       string          `json:"name"`
			DomainName json.RawMessage `json:"domainName" field:"rejected: not supported yet"`
			Route      *struct {
				Name   string `json:"name"`
				Action string `json:"action"`
			} `json:"route"`
		} `json:"vhost"`
		Name string `json:"name"`
	} `json:"routeConfiguration"`
	Cluster *struct {
		PortNumber uint32 `json:"portNumber"`
		Service    string `json:"service"`
		Subset     string `json:"subset"`
		Name       string `json:"name"`
	} `json:"cluster"`
}

var patchContexts = map[string]meshv1.EnvoyPatch_Context{
	"": meshv1.EnvoyPatch_CONTEXT_ANY, "ANY": meshv1.EnvoyPatch_CONTEXT_ANY,
	"SIDECAR_INBOUND": meshv1.EnvoyPatch_CONTEXT_SIDECAR_INBOUND, "SIDECAR_OUTBOUND": meshv1.EnvoyPatch_CONTEXT_SIDECAR_OUTBOUND,
	"GATEWAY": meshv1.EnvoyPatch_CONTEXT_GATEWAY,
}

// envoyFilter normalizes an EnvoyFilter. Every patch is checked as the
// pushers will apply it; one that cannot apply rejects the EnvoyFilter
// (its last valid version stays in effect).
func (n *normalizer) envoyFilter(in Input, spec *envoyFilter) {
	if len(spec.TargetRefs) > 0 {
		n.unsupported(in, "spec.targetRefs", "EnvoyFilters attached to gateways and waypoints")
		return
	}
	e := &meshv1.EnvoyFilter{Origin: n.origin(in), Priority: spec.Priority}
	if spec.WorkloadSelector != nil {
		e.Selector = spec.WorkloadSelector.Labels
	}
	for i, cp := range spec.ConfigPatches {
		f := fmt.Sprintf("spec.configPatches[%d]", i)
		p, ok := n.envoyPatch(in, f, cp)
		if !ok {
			return
		}
		if p == nil {
			continue
		}
		e.Patches = append(e.Patches, p)
	}
	if err := model.Validate(e); err != nil {
		fe, _ := err.(*model.FieldError)
		if fe != nil {
			n.problem(in, fe.Field, "%s", fe.Reason)
		} else {
			n.problem(in, "spec", "%v", err)
		}
		return
	}
	for _, p := range e.Patches {
		if err := envoypatch.Check(p); err != nil {
			n.problem(in, p.Location+".patch.value", "%v", err)
			return
		}
	}
	n.emit(in, e)
}

// envoyPatch normalizes one patch; nil (with a warning) for a BOOTSTRAP
// patch, which a control plane cannot apply.
func (n *normalizer) envoyPatch(in Input, f string, cp envoyConfigPatch) (*meshv1.EnvoyPatch, bool) {
	applyTo := strings.ToUpper(cp.ApplyTo)
	if applyTo == "BOOTSTRAP" {
		n.warn(in, f+".applyTo", "BOOTSTRAP patches configure the proxy's bootstrap, which the pushers do not send; the patch is not applied")
		return nil, true
	}
	to, ok := meshv1.EnvoyPatch_ApplyTo_value["APPLY_TO_"+applyTo]
	if !ok || applyTo == "" || applyTo == "UNSPECIFIED" {
		n.problem(in, f+".applyTo", "%q is not one of LISTENER, FILTER_CHAIN, NETWORK_FILTER, HTTP_FILTER, ROUTE_CONFIGURATION, VIRTUAL_HOST, HTTP_ROUTE, CLUSTER, EXTENSION_CONFIG", cp.ApplyTo)
		return nil, false
	}
	if cp.Patch == nil {
		n.problem(in, f+".patch", "a patch is required")
		return nil, false
	}
	op, ok := meshv1.EnvoyPatch_Operation_value["OPERATION_"+strings.ToUpper(cp.Patch.Operation)]
	if !ok || cp.Patch.Operation == "" || strings.EqualFold(cp.Patch.Operation, "INVALID") {
		n.problem(in, f+".patch.operation", "%q is not one of MERGE, ADD, REMOVE, INSERT_BEFORE, INSERT_AFTER, INSERT_FIRST, REPLACE", cp.Patch.Operation)
		return nil, false
	}
	if len(cp.Patch.FilterClass) > 0 {
		n.unsupported(in, f+".patch.filterClass", "give the filter's place with INSERT_BEFORE or INSERT_AFTER")
		return nil, false
	}
	p := &meshv1.EnvoyPatch{ApplyTo: meshv1.EnvoyPatch_ApplyTo(to), Operation: meshv1.EnvoyPatch_Operation(op), Location: f, Match: &meshv1.PatchMatch{}}
	if cp.Patch.Value != nil {
		v, err := structpb.NewStruct(cp.Patch.Value)
		if err != nil {
			n.problem(in, f+".patch.value", "%v", err)
			return nil, false
		}
		p.Value = v
	}
	if !n.patchMatch(in, f+".match", cp.Match, p) {
		return nil, false
	}
	return p, true
}

// patchMatch reads a patch's match into p, refusing the fields not acted on.
func (n *normalizer) patchMatch(in Input, f string, m *patchMatch, p *meshv1.EnvoyPatch) bool {
	if m == nil {
		return true
	}
	ctx, ok := patchContexts[strings.ToUpper(m.Context)]
	if !ok {
		n.problem(in, f+".context", "%q is not one of ANY, SIDECAR_INBOUND, SIDECAR_OUTBOUND, GATEWAY", m.Context)
		return false
	}
	p.Context = ctx
	var rejected []string
	reject := func(field string, raw json.RawMessage) {
		if len(raw) > 0 && string(raw) != "null" {
			rejected = append(rejected, field)
		}
	}
	if x := m.Proxy; x != nil {
		p.ProxyVersion = x.ProxyVersion
		reject("proxy.metadata", x.Metadata)
	}
	if l := m.Listener; l != nil {
		p.Match.Port, p.Match.ListenerName = l.PortNumber, l.Name
		reject("listener.portName", l.PortName)
		reject("listener.listenerFilter", l.ListenerFilter)
		if c := l.FilterChain; c != nil {
			p.Match.FilterChainName = c.Name
			reject("listener.filterChain.sni", c.Sni)
			reject("listener.filterChain.transportProtocol", c.TransportProtocol)
			reject("listener.filterChain.applicationProtocols", c.ApplicationProtocols)
			reject("listener.filterChain.destinationPort", c.DestinationPort)
			if c.Filter != nil {
				p.Match.FilterName = c.Filter.Name
				if c.Filter.SubFilter != nil {
					p.Match.SubFilterName = c.Filter.SubFilter.Name
				}
			}
		}
	}
	if r := m.RouteConfiguration; r != nil {
		p.Match.Port, p.Match.RouteConfigName = r.PortNumber, r.Name
		reject("routeConfiguration.portName", r.PortName)
		reject("routeConfiguration.gateway", r.Gateway)
		if v := r.Vhost; v != nil {
			p.Match.VhostName = v.Name
			reject("routeConfiguration.vhost.domainName", v.DomainName)
			if v.Route != nil {
				p.Match.RouteName, p.Match.RouteAction = v.Route.Name, strings.ToUpper(v.Route.Action)
				if a := p.Match.RouteAction; a != "" && a != "ANY" && a != "ROUTE" && a != "REDIRECT" && a != "DIRECT_RESPONSE" {
					n.problem(in, f+".routeConfiguration.vhost.route.action", "%q is not one of ANY, ROUTE, REDIRECT, DIRECT_RESPONSE", v.Route.Action)
					return false
				}
				if p.Match.RouteAction == "ANY" {
					p.Match.RouteAction = ""
				}
			}
		}
	}
	if c := m.Cluster; c != nil {
		p.Match.ClusterPort, p.Match.ClusterService, p.Match.ClusterSubset, p.Match.ClusterName = c.PortNumber, c.Service, c.Subset, c.Name
	}
	if len(rejected) > 0 {
		n.unsupported(in, f+"."+rejected[0], "a patch must not reach resources its match does not name")
		return false
	}
	return true
}
