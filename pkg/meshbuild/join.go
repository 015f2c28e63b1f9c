package meshbuild

import (
	"cmp"
	"slices"
	"strconv"

	"google.golang.org/protobuf/proto"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// join joins everything.
func (b *Builder) join() {
	in := b.byKind()
	services := in.services
	// Services that share a host name (the same Service in several
	// clusters, a ServiceEntry beside a Service) share their endpoints.
	sharing := map[string][]id{}
	for svc, j := range services {
		for _, h := range j.svc.Spec.Hostnames {
			sharing[h] = append(sharing[h], svc)
		}
	}
	bindPolicies(services, sharing, in.policies)
	config := b.settings(in.settings)
	withLocalityLb(services, config.GetLocalityLb())
	b.joined, b.sharing = services, sharing
	b.peerModes, b.meshPeers = peerModes(in.security)
	b.peerSelectors = peerSelectors(in.security)
	list := make([]*generate.Service, 0, len(services))
	restricted := false
	for svc, j := range services {
		j.svc = b.withEndpoints(svc, j)
		list = append(list, j.svc)
		for _, ns := range j.svc.Spec.ExportTo {
			restricted = restricted || ns != "*"
		}
	}
	slices.SortFunc(in.gateways, func(a, b *generate.Gateway) int { return cmp.Compare(a.Key(), b.Key()) })
	m := generate.NewMesh(list, in.routes)
	m.Gateways = in.gateways
	slices.SortFunc(in.security, func(a, b *generate.Policy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Tag(), b.Tag()))
	})
	m.Policies = in.security
	m.Settings = generate.Settings{NoAutoMTLS: b.NoAutoMTLS || !config.GetEnableAutoMtls(), NoCertificates: b.NoAutoMTLS, TrustDomain: b.TrustDomain,
		AgentCertificates: b.AgentCertificates, Config: config, ConfigVersion: strconv.FormatInt(in.settingsRev, 10)}
	m.RegistryOnly = config.GetOutboundTrafficPolicy() == meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY
	b.last = &Built{Mesh: m, Scopes: in.scopes, Restricted: restricted, RootNamespace: b.RootNamespace, Settings: in.settings}
}

// routeOf returns the route rule under k as the generators take it; false
// when the object is no route rule.
func routeOf(k model.Key, e Entry) (*generate.Route, bool) {
	o, ok := e.Object.(*meshv1.RouteRule)
	if !ok {
		return nil, false
	}
	return &generate.Route{Namespace: k.Namespace, Name: k.Name, Rule: o, Version: strconv.FormatInt(e.ModRev, 10)}, true
}

// keyedPolicy is a DestinationRule's traffic policy, with its key and mod
// revision.
type keyedPolicy struct {
	key    model.Key
	policy *meshv1.TrafficPolicy
	modRev int64
}

// objects are the builder's objects of each kind a join reads.
type objects struct {
	services    map[id]*joined
	policies    []keyedPolicy
	routes      []*generate.Route
	scopes      []Scope
	gateways    []*generate.Gateway
	security    []*generate.Policy
	settings    *meshv1.MeshConfig
	settingsRev int64
}

// byKind sorts the builder's objects by kind, as the generators take them.
func (b *Builder) byKind() objects {
	in := objects{services: map[id]*joined{}}
	var settingsKey model.Key
	for k, e := range b.objs {
		switch o := e.Object.(type) {
		case *meshv1.MeshConfig:
			// One is expected; of several, the first by key.
			if in.settings == nil || k.String() < settingsKey.String() {
				in.settings, settingsKey, in.settingsRev = o, k, e.ModRev
			}
		case *meshv1.Service:
			in.services[id{k.Namespace, k.Name}] = &joined{svc: &generate.Service{Namespace: k.Namespace, Name: k.Name, Spec: o}, serviceRev: e.ModRev}
		case *meshv1.TrafficPolicy:
			in.policies = append(in.policies, keyedPolicy{k, o, e.ModRev})
		case *meshv1.Scope:
			in.scopes = append(in.scopes, Scope{Namespace: k.Namespace, Name: k.Name, Spec: o})
		case *meshv1.Gateway:
			in.gateways = append(in.gateways, &generate.Gateway{Namespace: k.Namespace, Name: k.Name, Spec: o})
		case *meshv1.RouteRule:
			r, _ := routeOf(k, e)
			in.routes = append(in.routes, r)
		case *meshv1.AuthorizationPolicy, *meshv1.PeerAuthentication, *meshv1.RequestAuthentication, *meshv1.Telemetry, *meshv1.EnvoyFilter:
			in.security = append(in.security, &generate.Policy{Namespace: k.Namespace, Name: k.Name, Spec: o.(generate.PolicySpec),
				Version: strconv.FormatInt(e.ModRev, 10), Root: k.Namespace == b.RootNamespace})
		}
	}
	return in
}

// bindPolicies gives each service the DestinationRule of its host: where
// two name one host, the first by namespace and name.
func bindPolicies(services map[id]*joined, sharing map[string][]id, policies []keyedPolicy) {
	slices.SortFunc(policies, func(a, b keyedPolicy) int { return cmp.Compare(a.key.String(), b.key.String()) })
	for _, p := range policies {
		for _, svc := range sharing[p.policy.Host] {
			if j := services[svc]; j.svc.Policy == nil {
				j.svc.Policy, j.svc.PolicyName, j.policyRev = p.policy, p.key.Namespace+"/"+p.key.Name, p.modRev
			}
		}
	}
}

// withLocalityLb makes the mesh's locality balancing (nil: none) each
// policy's that has none.
func withLocalityLb(services map[id]*joined, lb *meshv1.LocalityLb) {
	if lb == nil {
		return
	}
	for _, j := range services {
		if j.svc.Policy.GetLocalityLb() == nil {
			tp := &meshv1.TrafficPolicy{}
			if j.svc.Policy != nil {
				tp = proto.CloneOf(j.svc.Policy)
			}
			tp.LocalityLb = lb
			j.svc.Policy = tp
		}
	}
}
