package istio

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	kjson "sigs.k8s.io/json"
)

// Group is the API group of the networking resources this package reads;
// SecurityGroup, of the security resources.
const (
	Group         = "networking.istio.io"
	SecurityGroup = "security.istio.io"
)

// Versions are the API versions this package reads.
var Versions = []string{"v1", "v1beta1", "v1alpha3"}

// GroupOf returns the API group of a kind.
func GroupOf(kind string) string {
	switch kind {
	case KindAuthorizationPolicy, KindPeerAuthentication, KindRequestAuthentication:
		return SecurityGroup
	}
	return Group
}

// The kinds this package reads.
const (
	KindServiceEntry    = "ServiceEntry"
	KindWorkloadEntry   = "WorkloadEntry"
	KindVirtualService  = "VirtualService"
	KindDestinationRule = "DestinationRule"
	KindSidecar         = "Sidecar"
	KindGateway         = "Gateway"

	KindAuthorizationPolicy   = "AuthorizationPolicy"
	KindPeerAuthentication    = "PeerAuthentication"
	KindRequestAuthentication = "RequestAuthentication"
)

var kinds = []string{KindServiceEntry, KindWorkloadEntry, KindVirtualService, KindDestinationRule, KindSidecar, KindGateway,
	KindAuthorizationPolicy, KindPeerAuthentication, KindRequestAuthentication, KindConfigMap}

// Options configure normalization.
type Options struct {
	// DomainSuffix completes short host names: "reviews" in namespace "shop"
	// is "reviews.shop.svc.<DomainSuffix>". Default cluster.local.
	DomainSuffix string
	// DefaultNamespace is the namespace of a resource that names none. Default "default".
	DefaultNamespace string
	// Shard names the endpoint shard the endpoints belong to.
	Shard string
	// MeshNamespace is the namespace of the mesh's ConfigMap (see
	// MeshConfigName). Default istio-system.
	MeshNamespace string
}

func (o *Options) defaults() {
	if o.DomainSuffix == "" {
		o.DomainSuffix = "cluster.local"
	}
	if o.DefaultNamespace == "" {
		o.DefaultNamespace = "default"
	}
	if o.Shard == "" {
		o.Shard = "default"
	}
	if o.MeshNamespace == "" {
		o.MeshNamespace = "istio-system"
	}
}

// Input is one resource with where and when it was read.
type Input struct {
	Resource Resource
	// Location says where the resource is, for example "mesh/a.yaml document 2".
	Location      string
	SourceVersion string
	ObservedAt    time.Time
}

func (in Input) name() string {
	return in.Resource.Kind + " " + in.Resource.Metadata.Namespace + "/" + in.Resource.Metadata.Name
}

// Normalize turns a complete set of resources into model objects. Resources
// that cannot be normalized are returned as problems; the rest are not
// affected by them.
func Normalize(inputs []Input, opts Options) ([]ingest.Object, []ingest.Problem) {
	opts.defaults()
	n := &normalizer{opts: opts, seen: map[string]string{}}
	var entries []*decodedEntry
	var services []*decodedService
	for _, in := range inputs {
		if in.Resource.Metadata.Namespace == "" {
			in.Resource.Metadata.Namespace = opts.DefaultNamespace
		}
		if !n.admit(in) {
			continue
		}
		switch in.Resource.Kind {
		case KindServiceEntry:
			var spec serviceEntry
			if n.decode(in, &spec) {
				n.ignoredFields(in, &spec)
				if svc := n.serviceEntry(in, &spec); svc != nil {
					services = append(services, svc)
				}
			}
		case KindWorkloadEntry:
			var spec workloadEntry
			if n.decode(in, &spec) {
				n.ignoredFields(in, &spec)
				if ep, ok := n.endpoint(in, "spec", &spec); ok {
					entries = append(entries, &decodedEntry{ns: in.Resource.Metadata.Namespace, ep: ep})
				}
			}
		case KindVirtualService:
			var spec virtualService
			if n.decode(in, &spec) {
				n.ignoredFields(in, &spec)
				n.virtualService(in, &spec)
			}
		case KindDestinationRule:
			var spec destinationRule
			if n.decode(in, &spec) {
				n.ignoredFields(in, &spec)
				n.destinationRule(in, &spec)
			}
		case KindSidecar:
			var spec sidecar
			if n.decode(in, &spec) {
				n.ignoredFields(in, &spec)
				n.sidecar(in, &spec)
			}
		case KindGateway:
			var spec gateway
			if n.decode(in, &spec) {
				n.ignoredFields(in, &spec)
				n.gateway(in, &spec)
			}
		case KindAuthorizationPolicy:
			var spec authorizationPolicy
			if n.decode(in, &spec) {
				n.authorizationPolicy(in, &spec)
			}
		case KindPeerAuthentication:
			var spec peerAuthentication
			if n.decode(in, &spec) {
				n.peerAuthentication(in, &spec)
			}
		case KindRequestAuthentication:
			var spec requestAuthentication
			if n.decode(in, &spec) {
				n.requestAuthentication(in, &spec)
			}
		case KindConfigMap:
			n.meshConfig(in)
		}
	}
	for _, s := range services {
		n.endpoints(s, entries)
	}
	return n.objs, n.problems
}

type normalizer struct {
	opts     Options
	objs     []ingest.Object
	problems []ingest.Problem
	// seen maps a workload entry's "<namespace>/<name>" to the location that defined it.
	seen map[string]string
}

type decodedEntry struct {
	ns string
	ep *meshv1.Endpoint
}

type decodedService struct {
	in       Input
	svc      *meshv1.Service
	inline   []*meshv1.Endpoint
	selector map[string]string
}

func (n *normalizer) problem(in Input, field, format string, args ...any) {
	p := ingest.Problem{Location: in.Location, KeepLocation: in.Location, Field: field, Reason: fmt.Sprintf(format, args...)}
	if in.Resource.Kind != "" {
		p.Resource = in.name()
	}
	if k, ok := keyOf(in.Resource); ok {
		p.Keep = &k
	}
	n.problems = append(n.problems, p)
}

// warn records a warning about a field: the resource applies all the
// same.
func (n *normalizer) warn(in Input, field, format string, args ...any) {
	n.problems = append(n.problems, ingest.Problem{Location: in.Location, Resource: in.name(), Field: field,
		Reason: fmt.Sprintf(format, args...), Warning: true})
}

// keyOf returns the store key a resource normalizes to, for resources that
// normalize to one.
func keyOf(r Resource) (model.Key, bool) {
	var kind model.Kind
	switch r.Kind {
	case KindServiceEntry:
		kind = model.KindService
	case KindVirtualService:
		kind = model.KindRouteRule
	case KindDestinationRule:
		kind = model.KindTrafficPolicy
	case KindSidecar:
		kind = model.KindScope
	case KindGateway:
		kind = model.KindGateway
	case KindAuthorizationPolicy:
		kind = model.KindAuthorization
	case KindPeerAuthentication:
		kind = model.KindPeerAuth
	case KindRequestAuthentication:
		kind = model.KindRequestAuth
	case KindConfigMap:
		kind = model.KindMeshConfig
	default:
		return model.Key{}, false
	}
	if r.Metadata.Name == "" {
		return model.Key{}, false
	}
	return model.Key{Kind: kind, Namespace: r.Metadata.Namespace, Name: r.Metadata.Name}, true
}

// admit checks what every resource needs: a known group, version and kind,
// a name, and a name no other resource of its kind already took.
func (n *normalizer) admit(in Input) bool {
	r := in.Resource
	group, version, _ := strings.Cut(r.APIVersion, "/")
	switch {
	case r.Kind == "":
		n.problem(in, "kind", "the kind is missing")
	case !slices.Contains(kinds, r.Kind):
		n.problem(in, "kind", "unknown kind %q: want one of %s", r.Kind, strings.Join(kinds, ", "))
	case r.Kind == KindConfigMap && r.APIVersion != "v1":
		n.problem(in, "apiVersion", "%q is not v1", r.APIVersion)
	case r.Kind != KindConfigMap && (group != GroupOf(r.Kind) || !slices.Contains(Versions, version)):
		n.problem(in, "apiVersion", "%q is not %s/{%s}", r.APIVersion, GroupOf(r.Kind), strings.Join(Versions, ","))
	case r.Metadata.Name == "":
		n.problem(in, "metadata.name", "a name is required")
	case !model.ValidHostname(r.Metadata.Name) || strings.Contains(r.Metadata.Name, "."):
		n.problem(in, "metadata.name", "%q is not a DNS label", r.Metadata.Name)
	case r.Kind == KindWorkloadEntry:
		// Workload entries have no key of their own; objects with a key
		// are de-duplicated by the Syncer, which knows which one is in
		// effect.
		id := r.Metadata.Namespace + "/" + r.Metadata.Name
		if first, dup := n.seen[id]; dup {
			n.problems = append(n.problems, ingest.Problem{Location: in.Location, Resource: in.name(),
				Field: "metadata.name", Reason: "another WorkloadEntry with this name and namespace is defined at " + first + "; this one is ignored"})
			return false
		}
		n.seen[id] = in.Location
		return true
	default:
		return true
	}
	return false
}

// decode decodes the resource's spec strictly into spec.
func (n *normalizer) decode(in Input, spec any) bool {
	if len(in.Resource.Spec) == 0 || string(in.Resource.Spec) == "null" {
		n.problem(in, "spec", "the spec is missing")
		return false
	}
	strict, err := kjson.UnmarshalStrict(in.Resource.Spec, spec)
	if err != nil {
		field, reason := describeJSONError(err)
		n.problem(in, field, "%s", reason)
		return false
	}
	if len(strict) > 0 {
		msgs := make([]string, len(strict))
		for i, e := range strict {
			msgs[i] = e.Error()
		}
		n.problem(in, "spec", "%s (not a field of %s %s)", strings.Join(msgs, "; "), in.Resource.Kind, in.Resource.APIVersion)
		return false
	}
	return true
}

// describeJSONError turns a decoding error into the field it concerns and
// a reason in YAML's terms rather than Go's.
func describeJSONError(err error) (field, reason string) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return "spec." + te.Field, fmt.Sprintf("a %s where %s is expected", te.Value, yamlType(te.Type))
	}
	return "spec", err.Error()
}

func yamlType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "a mapping"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	}
	return t.String()
}

func (n *normalizer) origin(in Input) *meshv1.Origin {
	o := &meshv1.Origin{SourceVersion: in.SourceVersion, Location: in.Location}
	if !in.ObservedAt.IsZero() {
		o.ObservedAt = timestamppb.New(in.ObservedAt)
	}
	return o
}

func (n *normalizer) emit(in Input, o model.Object) {
	k, _ := keyOf(in.Resource)
	n.objs = append(n.objs, ingest.Object{Key: k, Object: o, Resource: in.name()})
}

// fqdn completes a short host name the way Istio does.
func (n *normalizer) fqdn(host, ns string) string {
	if host == "" || host == "*" || strings.Contains(host, ".") {
		return host
	}
	return host + "." + ns + ".svc." + n.opts.DomainSuffix
}

var protocols = map[string]meshv1.Protocol{
	"HTTP": meshv1.Protocol_PROTOCOL_HTTP, "HTTP2": meshv1.Protocol_PROTOCOL_HTTP2,
	"GRPC": meshv1.Protocol_PROTOCOL_GRPC, "GRPC-WEB": meshv1.Protocol_PROTOCOL_HTTP,
	"HTTPS": meshv1.Protocol_PROTOCOL_HTTPS, "TLS": meshv1.Protocol_PROTOCOL_TLS,
	"TCP": meshv1.Protocol_PROTOCOL_TCP, "MONGO": meshv1.Protocol_PROTOCOL_TCP,
	"MYSQL": meshv1.Protocol_PROTOCOL_TCP, "REDIS": meshv1.Protocol_PROTOCOL_TCP,
}

var resolutions = map[string]meshv1.Resolution{
	"": meshv1.Resolution_RESOLUTION_NONE, "NONE": meshv1.Resolution_RESOLUTION_NONE,
	"STATIC": meshv1.Resolution_RESOLUTION_STATIC, "DNS": meshv1.Resolution_RESOLUTION_DNS,
	"DNS_ROUND_ROBIN": meshv1.Resolution_RESOLUTION_DNS_ROUND_ROBIN,
}

func (n *normalizer) serviceEntry(in Input, spec *serviceEntry) *decodedService {
	svc := &meshv1.Service{
		Origin:    n.origin(in),
		Hostnames: spec.Hosts,
		Labels:    in.Resource.Metadata.Labels,
		ExportTo:  spec.ExportTo,
	}
	res, ok := resolutions[strings.ToUpper(spec.Resolution)]
	if !ok {
		n.problem(in, "spec.resolution", "unknown resolution %q: want NONE, STATIC, DNS or DNS_ROUND_ROBIN", spec.Resolution)
		return nil
	}
	svc.Resolution = res
	switch strings.ToUpper(spec.Location) {
	case "", "MESH_EXTERNAL":
		svc.MeshExternal = true
	case "MESH_INTERNAL":
	default:
		n.problem(in, "spec.location", "unknown location %q: want MESH_EXTERNAL or MESH_INTERNAL", spec.Location)
		return nil
	}
	for i, a := range spec.Addresses {
		if _, err := netip.ParseAddr(a); err != nil {
			if _, cidr := netip.ParsePrefix(a); cidr == nil {
				n.warn(in, fmt.Sprintf("spec.addresses[%d]", i), "a range (%s) is not a virtual IP; only single addresses have an effect yet", a)
				continue
			}
			n.problem(in, fmt.Sprintf("spec.addresses[%d]", i), "%q is not an IP address", a)
			return nil
		}
		svc.Addresses = append(svc.Addresses, a)
	}
	for i, p := range spec.Ports {
		proto, ok := protocols[strings.ToUpper(p.Protocol)]
		if !ok {
			n.problem(in, fmt.Sprintf("spec.ports[%d].protocol", i), "unknown protocol %q", p.Protocol)
			return nil
		}
		svc.Ports = append(svc.Ports, &meshv1.Port{Name: p.Name, Number: p.Number, Protocol: proto, TargetPort: p.TargetPort})
	}
	d := &decodedService{in: in, svc: svc}
	for i := range spec.Endpoints {
		ep, ok := n.endpoint(in, fmt.Sprintf("spec.endpoints[%d]", i), &spec.Endpoints[i])
		if !ok {
			return nil
		}
		d.inline = append(d.inline, ep)
	}
	if spec.WorkloadSelector != nil {
		d.selector = spec.WorkloadSelector.Labels
		svc.WorkloadSelector = d.selector
	}
	n.emit(in, svc)
	return d
}

func (n *normalizer) endpoint(in Input, field string, we *workloadEntry) (*meshv1.Endpoint, bool) {
	ep := &meshv1.Endpoint{
		Address:        we.Address,
		Ports:          we.Ports,
		Labels:         we.Labels,
		Weight:         we.Weight,
		ServiceAccount: we.ServiceAccount,
		Health:         meshv1.Health_HEALTH_HEALTHY,
	}
	if we.Address == "" {
		n.problem(in, field+".address", "an address is required")
		return nil, false
	}
	if we.Locality != "" {
		parts := strings.Split(we.Locality, "/")
		if len(parts) > 3 {
			n.problem(in, field+".locality", "%q is not region/zone/subzone", we.Locality)
			return nil, false
		}
		parts = append(parts, "", "")
		ep.Locality = &meshv1.Locality{Region: parts[0], Zone: parts[1], Subzone: parts[2]}
	}
	return ep, true
}

// endpoints emits the endpoints of one service entry: its inline endpoints
// and the workload entries of its namespace that its selector selects.
func (n *normalizer) endpoints(s *decodedService, entries []*decodedEntry) {
	eps := s.inline
	if s.selector != nil {
		for _, e := range entries {
			if e.ns == s.in.Resource.Metadata.Namespace && model.Selects(s.selector, e.ep.Labels) {
				eps = append(eps, e.ep)
			}
		}
	}
	if len(eps) == 0 {
		return
	}
	name := s.in.Resource.Metadata.Name
	n.objs = append(n.objs, ingest.Object{
		Key: model.Key{Kind: model.KindEndpoints, Namespace: s.in.Resource.Metadata.Namespace, Name: model.EndpointsName(name, n.opts.Shard)},
		Object: &meshv1.Endpoints{
			Origin:    n.origin(s.in),
			Service:   name,
			Shard:     n.opts.Shard,
			Endpoints: eps,
		},
	})
}

func (n *normalizer) duration(in Input, field, s string) (*durationpb.Duration, bool) {
	if s == "" {
		return nil, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		n.problem(in, field, "%q is not a duration such as 1s or 250ms", s)
		return nil, false
	}
	return durationpb.New(d), true
}

func (n *normalizer) virtualService(in Input, spec *virtualService) {
	ns := in.Resource.Metadata.Namespace
	rr := &meshv1.RouteRule{Origin: n.origin(in), Gateways: spec.Gateways, ExportTo: spec.ExportTo}
	for _, h := range spec.Hosts {
		rr.Hosts = append(rr.Hosts, n.fqdn(h, ns))
	}
	for i, h := range spec.HTTP {
		f := fmt.Sprintf("spec.http[%d]", i)
		route := &meshv1.HTTPRoute{Name: h.Name}
		for _, m := range h.Match {
			route.Match = append(route.Match, httpMatch(&m))
		}
		for j, d := range h.Route {
			if d.Weight < 0 {
				n.problem(in, fmt.Sprintf("%s.route[%d].weight", f, j), "weight %d is negative", d.Weight)
				return
			}
			dst := &meshv1.Destination{Host: n.fqdn(d.Destination.Host, ns), Subset: d.Destination.Subset}
			if d.Destination.Port != nil {
				dst.Port = d.Destination.Port.Number
			}
			route.Route = append(route.Route, &meshv1.RouteDestination{Destination: dst, Weight: uint32(d.Weight), Headers: routeHeaders(d.Headers)})
		}
		var ok bool
		if route.Timeout, ok = n.duration(in, f+".timeout", h.Timeout); !ok {
			return
		}
		if r := h.Retries; r != nil {
			if route.Retries, ok = n.retries(in, f+".retries", r); !ok {
				return
			}
		}
		if !n.httpExtras(in, f, &h, route) {
			return
		}
		if d := h.Delegate; d != nil {
			if d.Name == "" {
				n.problem(in, f+".delegate.name", "the delegate VirtualService's name is required")
				return
			}
			route.Delegate = &meshv1.Delegate{Name: d.Name, Namespace: cmp.Or(d.Namespace, ns)}
		}
		if c := h.CorsPolicy; c != nil {
			if route.Cors, ok = n.cors(in, f+".corsPolicy", c); !ok {
				return
			}
		}
		if len(h.Match) > 0 && len(route.Match) == 0 {
			continue // no alternative left: the route never applies
		}
		rr.Http = append(rr.Http, route)
	}
	for _, section := range []struct {
		name   string
		routes []l4Route
		out    *[]*meshv1.L4Route
	}{{"tcp", spec.TCP, &rr.Tcp}, {"tls", spec.TLS, &rr.Tls}} {
		tls := section.name == "tls"
		for i, r := range section.routes {
			f := fmt.Sprintf("spec.%s[%d]", section.name, i)
			if tls && len(r.Match) == 0 {
				n.problem(in, f+".match", "a tls route needs a match with sniHosts")
				return
			}
			route := &meshv1.L4Route{}
			for j, m := range r.Match {
				mf := fmt.Sprintf("%s.match[%d]", f, j)
				switch {
				case tls && len(m.SniHosts) == 0:
					n.problem(in, mf+".sniHosts", "at least one SNI host is required")
					return
				case !tls && len(m.SniHosts) > 0:
					n.problem(in, mf+".sniHosts", "SNI hosts belong to tls routes, not tcp routes")
					return
				}
				if !n.l4Match(in, mf, m.DestinationSubnets) {
					continue
				}
				lm := &meshv1.L4Match{Port: m.Port, Gateways: m.Gateways, SourceLabels: m.SourceLabels, SourceNamespace: m.SourceNamespace}
				for _, h := range m.SniHosts {
					lm.SniHosts = append(lm.SniHosts, n.fqdn(h, ns))
				}
				route.Match = append(route.Match, lm)
			}
			if !n.l4Destinations(in, f, r.Route, route) {
				return
			}
			if len(r.Match) == 0 || len(route.Match) > 0 {
				*section.out = append(*section.out, route)
			}
		}
	}
	n.emit(in, rr)
}

// httpMatch converts one match alternative of an http route.
func httpMatch(m *httpMatchRequest) *meshv1.HTTPMatch {
	hm := &meshv1.HTTPMatch{
		Name:            m.Name,
		Uri:             m.URI.model(),
		Method:          m.Method.model(),
		Headers:         headerMatches(m.Headers),
		Port:            m.Port,
		IgnoreUriCase:   m.IgnoreURICase,
		Gateways:        m.Gateways,
		QueryParams:     headerMatches(m.QueryParams),
		WithoutHeaders:  headerMatches(m.WithoutHeaders),
		SourceNamespace: m.SourceNamespace,
		SourceLabels:    m.SourceLabels,
	}
	// The authority and the scheme are pseudo-headers, as Istio
	// matches them.
	for name, sm := range map[string]*stringMatch{":authority": m.Authority, ":scheme": m.Scheme} {
		if sm != nil {
			if hm.Headers == nil {
				hm.Headers = map[string]*meshv1.StringMatch{}
			}
			hm.Headers[name] = sm.model()
		}
	}
	return hm
}

// retries reads an http route's retries (at f).
func (n *normalizer) retries(in Input, f string, r *httpRetry) (*meshv1.RetryPolicy, bool) {
	if r.Attempts < 0 {
		n.problem(in, f+".attempts", "%d is negative", r.Attempts)
		return nil, false
	}
	out := &meshv1.RetryPolicy{Attempts: uint32(r.Attempts), RetryOn: r.RetryOn,
		RetryIgnorePreviousHosts: r.RetryIgnorePreviousHosts, RetryRemoteLocalities: r.RetryRemoteLocalities}
	ok := n.durations(in, f, durationField{"perTryTimeout", r.PerTryTimeout, &out.PerTryTimeout}, durationField{"backoff", r.Backoff, &out.Backoff})
	return out, ok
}

// l4Match reports whether a tcp or tls match alternative can apply: one
// naming a condition not acted on yet never matches (warned).
func (n *normalizer) l4Match(in Input, f string, destinationSubnets json.RawMessage) bool {
	if t := bytes.TrimSpace(destinationSubnets); len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		n.warn(in, f, "never matches: it names destinationSubnets, not acted on yet")
		return false
	}
	return true
}

// l4Destinations reads a tcp or tls route's destinations.
func (n *normalizer) l4Destinations(in Input, f string, ds []l4Destination, route *meshv1.L4Route) bool {
	ns := in.Resource.Metadata.Namespace
	if len(ds) == 0 {
		n.problem(in, f+".route", "at least one destination is required")
		return false
	}
	for j, d := range ds {
		if d.Weight < 0 {
			n.problem(in, fmt.Sprintf("%s.route[%d].weight", f, j), "weight %d is negative", d.Weight)
			return false
		}
		dst := &meshv1.Destination{Host: n.fqdn(d.Destination.Host, ns), Subset: d.Destination.Subset}
		if d.Destination.Port != nil {
			dst.Port = d.Destination.Port.Number
		}
		route.Route = append(route.Route, &meshv1.RouteDestination{Destination: dst, Weight: uint32(d.Weight)})
	}
	return true
}

func (m *stringMatch) model() *meshv1.StringMatch {
	switch {
	case m == nil:
		return nil
	case m.Exact != nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: *m.Exact}}
	case m.Prefix != nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Prefix{Prefix: *m.Prefix}}
	case m.Regex != nil:
		return &meshv1.StringMatch{Kind: &meshv1.StringMatch_Regex{Regex: *m.Regex}}
	}
	return &meshv1.StringMatch{}
}

func headerMatches(h map[string]stringMatch) map[string]*meshv1.StringMatch {
	if len(h) == 0 {
		return nil
	}
	out := make(map[string]*meshv1.StringMatch, len(h))
	for _, k := range slices.Sorted(maps.Keys(h)) {
		m := h[k]
		out[k] = m.model()
	}
	return out
}

var loadBalancers = map[string]meshv1.LoadBalancer{
	"": meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED, "UNSPECIFIED": meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED,
	"ROUND_ROBIN": meshv1.LoadBalancer_LOAD_BALANCER_ROUND_ROBIN, "LEAST_REQUEST": meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST,
	"LEAST_CONN": meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST, "RANDOM": meshv1.LoadBalancer_LOAD_BALANCER_RANDOM,
	"PASSTHROUGH": meshv1.LoadBalancer_LOAD_BALANCER_PASSTHROUGH,
}

func (n *normalizer) loadBalancer(in Input, field string, tp *trafficPolicy) (meshv1.LoadBalancer, bool) {
	if tp == nil || tp.LoadBalancer == nil {
		return meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED, true
	}
	lb, ok := loadBalancers[strings.ToUpper(tp.LoadBalancer.Simple)]
	if !ok {
		n.problem(in, field+".loadBalancer.simple", "unknown load balancer %q", tp.LoadBalancer.Simple)
	}
	return lb, ok
}

func (n *normalizer) destinationRule(in Input, spec *destinationRule) {
	if spec.WorkloadSelector != nil {
		// Applied to every proxy, a rule meant for some workloads would
		// change the traffic of the rest.
		n.unsupported(in, "spec.workloadSelector", "a rule for some workloads only")
		return
	}
	tp := &meshv1.TrafficPolicy{Origin: n.origin(in), Host: n.fqdn(spec.Host, in.Resource.Metadata.Namespace), ExportTo: spec.ExportTo}
	var ok bool
	if tp.LoadBalancer, ok = n.loadBalancer(in, "spec.trafficPolicy", spec.TrafficPolicy); !ok {
		return
	}
	if !n.policyExtras(in, "spec.trafficPolicy", spec.TrafficPolicy, tp) {
		return
	}
	if tp.PortLevelSettings, ok = n.portPolicies(in, "spec.trafficPolicy", spec.TrafficPolicy); !ok {
		return
	}
	for i, s := range spec.Subsets {
		f := fmt.Sprintf("spec.subsets[%d].trafficPolicy", i)
		sub := &meshv1.Subset{Name: s.Name, Labels: s.Labels}
		level := &meshv1.TrafficPolicy{}
		if level.LoadBalancer, ok = n.loadBalancer(in, f, s.TrafficPolicy); !ok || !n.policyExtras(in, f, s.TrafficPolicy, level) {
			return
		}
		sub.LoadBalancer, sub.ConsistentHash, sub.ConnectionPool, sub.OutlierDetection, sub.Tls, sub.LocalityLb =
			level.LoadBalancer, level.ConsistentHash, level.ConnectionPool, level.OutlierDetection, level.Tls, level.LocalityLb
		if sub.PortLevelSettings, ok = n.portPolicies(in, f, s.TrafficPolicy); !ok {
			return
		}
		tp.Subsets = append(tp.Subsets, sub)
	}
	n.emit(in, tp)
}

// portPolicies reads a traffic policy's portLevelSettings.
func (n *normalizer) portPolicies(in Input, f string, tp *trafficPolicy) ([]*meshv1.PortPolicy, bool) {
	if tp == nil {
		return nil, true
	}
	var out []*meshv1.PortPolicy
	seen := map[uint32]bool{}
	for i, ps := range tp.PortLevelSettings {
		pf := fmt.Sprintf("%s.portLevelSettings[%d]", f, i)
		if ps.Port == nil || ps.Port.Number == 0 {
			n.problem(in, pf+".port.number", "a port number is required")
			return nil, false
		}
		if seen[ps.Port.Number] {
			n.problem(in, pf+".port.number", "port %d has settings twice", ps.Port.Number)
			return nil, false
		}
		seen[ps.Port.Number] = true
		level := &meshv1.TrafficPolicy{}
		as := &trafficPolicy{LoadBalancer: ps.LoadBalancer, ConnectionPool: ps.ConnectionPool, OutlierDetection: ps.OutlierDetection, TLS: ps.TLS}
		var ok bool
		if level.LoadBalancer, ok = n.loadBalancer(in, pf, as); !ok || !n.policyExtras(in, pf, as, level) {
			return nil, false
		}
		out = append(out, &meshv1.PortPolicy{Port: ps.Port.Number, LoadBalancer: level.LoadBalancer, ConsistentHash: level.ConsistentHash,
			ConnectionPool: level.ConnectionPool, OutlierDetection: level.OutlierDetection, Tls: level.Tls, LocalityLb: level.LocalityLb})
	}
	return out, true
}

func (n *normalizer) sidecar(in Input, spec *sidecar) {
	sc := &meshv1.Scope{Origin: n.origin(in)}
	if p := spec.OutboundTrafficPolicy; p != nil {
		switch strings.ToUpper(p.Mode) {
		case "":
		case "ALLOW_ANY":
			sc.OutboundPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_ALLOW_ANY
		case "REGISTRY_ONLY":
			sc.OutboundPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY
		default:
			n.problem(in, "spec.outboundTrafficPolicy.mode", "%q is not ALLOW_ANY or REGISTRY_ONLY", p.Mode)
			return
		}
	}
	if spec.WorkloadSelector != nil {
		sc.WorkloadSelector = spec.WorkloadSelector.Labels
	}
	for i, il := range spec.Ingress {
		f := fmt.Sprintf("spec.ingress[%d]", i)
		proto, ok := n.listenerPort(in, f, il.Port)
		if !ok {
			return
		}
		if !validDefaultEndpoint(il.DefaultEndpoint) {
			n.problem(in, f+".defaultEndpoint", "%q is not 127.0.0.1:<port>, [::1]:<port>, 0.0.0.0:<port>, [::]:<port> or unix://<path>", il.DefaultEndpoint)
			return
		}
		sc.Ingress = append(sc.Ingress, &meshv1.IngressListener{Port: il.Port.Number, Protocol: proto, Name: il.Port.Name, DefaultEndpoint: il.DefaultEndpoint})
	}
	for _, e := range spec.Egress {
		el := &meshv1.EgressListener{Hosts: e.Hosts}
		if e.Port != nil {
			el.Port = e.Port.Number
		}
		sc.Egress = append(sc.Egress, el)
	}
	n.emit(in, sc)
}

func (n *normalizer) gateway(in Input, spec *gateway) {
	gw := &meshv1.Gateway{Origin: n.origin(in), Selector: spec.Selector}
	for i, s := range spec.Servers {
		f := fmt.Sprintf("spec.servers[%d]", i)
		proto, ok := n.listenerPort(in, f, s.Port)
		if !ok {
			return
		}
		srv := &meshv1.GatewayServer{Name: s.Name, Port: s.Port.Number, Protocol: proto, PortName: s.Port.Name, Hosts: s.Hosts}
		if t := s.TLS; t != nil {
			mode := strings.ToUpper(t.Mode)
			srv.Tls = &meshv1.GatewayTLS{Mode: mode, CredentialName: t.CredentialName, HttpsRedirect: t.HTTPSRedirect}
			if why := gatewayModeGap(proto, mode); why != "" {
				n.warn(in, f+".tls.mode", "%s", why)
			} else if !slices.Contains([]string{"", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL", "PASSTHROUGH", "AUTO_PASSTHROUGH", "OPTIONAL_MUTUAL"}, mode) {
				n.problem(in, f+".tls.mode", "unknown TLS mode %q: want SIMPLE, MUTUAL, ISTIO_MUTUAL, OPTIONAL_MUTUAL, PASSTHROUGH or AUTO_PASSTHROUGH", t.Mode)
				return
			}
		}
		gw.Servers = append(gw.Servers, srv)
	}
	n.emit(in, gw)
}

// cors reads a route's corsPolicy.
func (n *normalizer) cors(in Input, f string, c *corsPolicy) (*meshv1.Cors, bool) {
	out := &meshv1.Cors{AllowMethods: c.AllowMethods, AllowHeaders: c.AllowHeaders, ExposeHeaders: c.ExposeHeaders}
	for _, o := range c.AllowOrigin {
		out.AllowOrigins = append(out.AllowOrigins, &meshv1.StringMatch{Kind: &meshv1.StringMatch_Exact{Exact: o}})
	}
	for i := range c.AllowOrigins {
		out.AllowOrigins = append(out.AllowOrigins, c.AllowOrigins[i].model())
	}
	var ok bool
	if out.MaxAge, ok = n.duration(in, f+".maxAge", c.MaxAge); !ok {
		return nil, false
	}
	if c.AllowCredentials != nil {
		out.AllowCredentials = meshv1.Cors_CREDENTIALS_DENY
		if *c.AllowCredentials {
			out.AllowCredentials = meshv1.Cors_CREDENTIALS_ALLOW
		}
	}
	switch strings.ToUpper(c.UnmatchedPreflights) {
	case "", "UNSPECIFIED", "FORWARD":
	case "IGNORE":
		out.IgnoreUnmatchedPreflights = true
	default:
		n.problem(in, f+".unmatchedPreflights", "%q is not FORWARD or IGNORE", c.UnmatchedPreflights)
		return nil, false
	}
	return out, true
}

// listenerPort checks the port of a gateway server or a Sidecar ingress
// listener and returns its protocol.
func (n *normalizer) listenerPort(in Input, f string, p *servicePort) (meshv1.Protocol, bool) {
	if p == nil || p.Number == 0 || p.Number > 65535 {
		n.problem(in, f+".port.number", "a port number (1 to 65535) is required")
		return 0, false
	}
	proto, ok := protocols[strings.ToUpper(p.Protocol)]
	if !ok {
		n.problem(in, f+".port.protocol", "unknown protocol %q", p.Protocol)
	}
	return proto, ok
}

// validDefaultEndpoint reports whether a Sidecar ingress listener's
// defaultEndpoint is one Istio accepts (empty: the port itself).
func validDefaultEndpoint(e string) bool {
	if e == "" {
		return true
	}
	if path, ok := strings.CutPrefix(e, "unix://"); ok {
		return path != ""
	}
	ap, err := netip.ParseAddrPort(e)
	if err != nil || ap.Port() == 0 {
		return false
	}
	return ap.Addr().IsLoopback() || ap.Addr().IsUnspecified()
}

// gatewayModeGap says why a gateway server's TLS mode has no effect yet
// for its protocol ("" when it has one).
func gatewayModeGap(proto meshv1.Protocol, mode string) string {
	switch {
	case mode == "OPTIONAL_MUTUAL":
		return "OPTIONAL_MUTUAL has no effect yet: the server is not generated"
	case proto == meshv1.Protocol_PROTOCOL_TLS && (mode == "SIMPLE" || mode == "MUTUAL" || mode == "ISTIO_MUTUAL"):
		return "terminating TLS on a TLS server has no effect yet: the server is not generated (HTTPS servers terminate, TLS servers pass through)"
	case mode == "AUTO_PASSTHROUGH" && proto != meshv1.Protocol_PROTOCOL_TLS:
		return "AUTO_PASSTHROUGH applies to TLS servers: the server is not generated"
	case mode == "PASSTHROUGH" && proto != meshv1.Protocol_PROTOCOL_TLS && proto != meshv1.Protocol_PROTOCOL_HTTPS:
		return "PASSTHROUGH applies to TLS and HTTPS servers: the server is not generated"
	}
	return ""
}

// httpExtras converts a route's fault, rewrite, redirect, mirror and header
// operations.
func (n *normalizer) httpExtras(in Input, f string, h *httpRoute, route *meshv1.HTTPRoute) bool {
	ns := in.Resource.Metadata.Namespace
	if fl := h.Fault; fl != nil {
		route.Fault = &meshv1.Fault{}
		if d := fl.Delay; d != nil {
			fixed, ok := n.duration(in, f+".fault.delay.fixedDelay", d.FixedDelay)
			if !ok {
				return false
			}
			if fixed == nil {
				n.problem(in, f+".fault.delay.fixedDelay", "a fixed delay is required")
				return false
			}
			pct, ok := n.percentage(in, f+".fault.delay.percentage", d.Percentage, d.Percent)
			if !ok {
				return false
			}
			route.Fault.Delay = &meshv1.Fault_Delay{FixedDelay: fixed, Percentage: pct}
		}
		if a := fl.Abort; a != nil {
			pct, ok := n.percentage(in, f+".fault.abort.percentage", a.Percentage, 0)
			if !ok {
				return false
			}
			if a.HTTPStatus == 0 && a.GrpcStatus == "" {
				n.problem(in, f+".fault.abort", "an httpStatus or a grpcStatus is required")
				return false
			}
			if a.HTTPStatus != 0 && (a.HTTPStatus < 200 || a.HTTPStatus > 599) {
				n.problem(in, f+".fault.abort.httpStatus", "%d is not an HTTP status", a.HTTPStatus)
				return false
			}
			route.Fault.Abort = &meshv1.Fault_Abort{HttpStatus: uint32(a.HTTPStatus), GrpcStatus: a.GrpcStatus, Percentage: pct}
		}
	}
	if rw := h.Rewrite; rw != nil {
		route.Rewrite = &meshv1.Rewrite{Uri: rw.URI, Authority: rw.Authority}
	}
	if rd := h.Redirect; rd != nil {
		route.Redirect = &meshv1.Redirect{Uri: rd.URI, Authority: rd.Authority, RedirectCode: rd.RedirectCode, Scheme: rd.Scheme, Port: rd.Port}
	}
	if dr := h.DirectResponse; dr != nil {
		route.DirectResponse = &meshv1.DirectResponse{Status: dr.Status}
		if b := dr.Body; b != nil {
			if b.String != nil {
				route.DirectResponse.Body = *b.String
			} else {
				route.DirectResponse.Body = string(b.Bytes)
			}
		}
	}
	if m := h.Mirror; m != nil {
		dst := &meshv1.Destination{Host: n.fqdn(m.Host, ns), Subset: m.Subset}
		if m.Port != nil {
			dst.Port = m.Port.Number
		}
		pct := 100.0
		if h.MirrorPercentage != nil {
			pct = h.MirrorPercentage.Value
		}
		if pct < 0 || pct > 100 {
			n.problem(in, f+".mirrorPercentage.value", "%v is not a percentage", pct)
			return false
		}
		route.Mirror = &meshv1.Mirror{Destination: dst, Percentage: pct}
	}
	route.Headers = routeHeaders(h.Headers)
	return true
}

// routeHeaders converts a route's or a destination's header changes.
func routeHeaders(hd *headers) *meshv1.Headers {
	if hd == nil {
		return nil
	}
	return &meshv1.Headers{Request: headerOperations(hd.Request), Response: headerOperations(hd.Response)}
}

func headerOperations(h *headerOps) *meshv1.HeaderOperations {
	if h == nil {
		return nil
	}
	return &meshv1.HeaderOperations{Set: h.Set, Add: h.Add, Remove: h.Remove}
}

// percentage reads Istio's percentage (or its deprecated integer percent);
// unset means all requests.
func (n *normalizer) percentage(in Input, field string, p *percent, deprecated int32) (float64, bool) {
	v := 100.0
	switch {
	case p != nil:
		v = p.Value
	case deprecated != 0:
		v = float64(deprecated)
	}
	if v < 0 || v > 100 {
		n.problem(in, field, "%v is not a percentage", v)
		return 0, false
	}
	return v, true
}

var h2Upgrades = map[string]meshv1.ConnectionPool_H2Upgrade{
	"": meshv1.ConnectionPool_H2_UPGRADE_DEFAULT, "DEFAULT": meshv1.ConnectionPool_H2_UPGRADE_DEFAULT,
	"DO_NOT_UPGRADE": meshv1.ConnectionPool_H2_UPGRADE_DO_NOT_UPGRADE, "UPGRADE": meshv1.ConnectionPool_H2_UPGRADE_UPGRADE,
}

var tlsModes = map[string]meshv1.ClientTLS_Mode{
	"": meshv1.ClientTLS_MODE_UNSPECIFIED, "DISABLE": meshv1.ClientTLS_MODE_DISABLE, "SIMPLE": meshv1.ClientTLS_MODE_SIMPLE,
	"MUTUAL": meshv1.ClientTLS_MODE_MUTUAL, "ISTIO_MUTUAL": meshv1.ClientTLS_MODE_ISTIO_MUTUAL,
}

// policyExtras converts a traffic policy's consistent hash, connection
// pool, outlier detection and TLS.
// localityLb reads a localityLbSetting, refusing what Istio's validation
// refuses: distribute and failover together, shares of a locality that do
// not add up to 100, failover within a region or beyond one.
func (n *normalizer) localityLb(in Input, f string, s *localityLbSetting) (*meshv1.LocalityLb, bool) {
	out := &meshv1.LocalityLb{Disabled: s.Enabled != nil && !*s.Enabled}
	if len(s.Distribute) > 0 && len(s.Failover) > 0 {
		n.problem(in, f, "distribute and failover cannot both be set")
		return nil, false
	}
	from := map[string]bool{}
	for i, d := range s.Distribute {
		df := fmt.Sprintf("%s.distribute[%d]", f, i)
		if !n.localityPattern(in, df+".from", d.From) {
			return nil, false
		}
		if from[d.From] {
			n.problem(in, df+".from", "locality %q is distributed twice", d.From)
			return nil, false
		}
		from[d.From] = true
		var sum uint32
		for _, to := range slices.Sorted(maps.Keys(d.To)) {
			if !n.localityPattern(in, df+".to", to) {
				return nil, false
			}
			if d.To[to] == 0 || d.To[to] > 100 {
				n.problem(in, df+".to["+to+"]", "weight %d is not between 1 and 100", d.To[to])
				return nil, false
			}
			sum += d.To[to]
		}
		if sum != 100 {
			n.problem(in, df+".to", "the weights add up to %d, not 100", sum)
			return nil, false
		}
		out.Distribute = append(out.Distribute, &meshv1.LocalityLb_Distribute{From: d.From, To: d.To})
	}
	for i, fo := range s.Failover {
		ff := fmt.Sprintf("%s.failover[%d]", f, i)
		switch {
		case fo.From == "" || fo.To == "":
			n.problem(in, ff, "from and to are both required")
		case strings.Contains(fo.From, "/") || strings.Contains(fo.To, "/"):
			n.problem(in, ff, "failover is between regions: %q to %q names a zone", fo.From, fo.To)
		case fo.From == fo.To:
			n.problem(in, ff, "failover from region %q to itself", fo.From)
		default:
			out.Failover = append(out.Failover, &meshv1.LocalityLb_Failover{From: fo.From, To: fo.To})
			continue
		}
		return nil, false
	}
	return out, true
}

// localityPattern checks a locality pattern: region, region/zone or
// region/zone/subzone, where "*" may stand for the last part given.
func (n *normalizer) localityPattern(in Input, f, pattern string) bool {
	parts := strings.Split(pattern, "/")
	bad := pattern == "" || len(parts) > 3
	for i, part := range parts {
		if part == "" || (strings.Contains(part, "*") && (part != "*" || i != len(parts)-1)) {
			bad = true
		}
	}
	if bad {
		n.problem(in, f, "%q is not a locality: want region, region/zone or region/zone/subzone, with * only as the last part", pattern)
	}
	return !bad
}

func (n *normalizer) policyExtras(in Input, f string, tp *trafficPolicy, out *meshv1.TrafficPolicy) bool {
	if tp == nil {
		return true
	}
	if lb := tp.LoadBalancer; lb != nil && lb.ConsistentHash != nil {
		ch := lb.ConsistentHash
		out.ConsistentHash = &meshv1.ConsistentHash{MinimumRingSize: ch.MinimumRingSize}
		switch {
		case ch.HTTPHeaderName != "":
			out.ConsistentHash.Key = &meshv1.ConsistentHash_HttpHeaderName{HttpHeaderName: ch.HTTPHeaderName}
		case ch.HTTPCookie != nil:
			out.ConsistentHash.Key = &meshv1.ConsistentHash_HttpCookieName{HttpCookieName: ch.HTTPCookie.Name}
			ttl, ok := n.duration(in, f+".loadBalancer.consistentHash.httpCookie.ttl", ch.HTTPCookie.TTL)
			if !ok {
				return false
			}
			out.ConsistentHash.HttpCookieTtl = ttl
		case ch.UseSourceIP:
			out.ConsistentHash.Key = &meshv1.ConsistentHash_UseSourceIp{UseSourceIp: true}
		case ch.HTTPQueryParameterName != "":
			out.ConsistentHash.Key = &meshv1.ConsistentHash_HttpQueryParameterName{HttpQueryParameterName: ch.HTTPQueryParameterName}
		default:
			n.problem(in, f+".loadBalancer.consistentHash", "one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required")
			return false
		}
	}
	if lb := tp.LoadBalancer; lb != nil && lb.LocalityLbSetting != nil {
		var ok bool
		if out.LocalityLb, ok = n.localityLb(in, f+".loadBalancer.localityLbSetting", lb.LocalityLbSetting); !ok {
			return false
		}
	}
	var ok bool
	if cp := tp.ConnectionPool; cp != nil {
		if out.ConnectionPool, ok = n.connectionPool(in, f+".connectionPool", cp); !ok {
			return false
		}
	}
	if od := tp.OutlierDetection; od != nil {
		if out.OutlierDetection, ok = n.outlierDetection(in, f+".outlierDetection", od); !ok {
			return false
		}
	}
	if t := tp.TLS; t != nil {
		mode, ok := tlsModes[strings.ToUpper(t.Mode)]
		if !ok {
			n.problem(in, f+".tls.mode", "unknown TLS mode %q: want DISABLE, SIMPLE, MUTUAL or ISTIO_MUTUAL", t.Mode)
			return false
		}
		out.Tls = &meshv1.ClientTLS{Mode: mode, Sni: t.Sni, SubjectAltNames: t.SubjectAltNames, CredentialName: t.CredentialName}
	}
	return true
}

// connectionPool reads a traffic policy's connectionPool (at f).
func (n *normalizer) connectionPool(in Input, f string, cp *connectionPool) (*meshv1.ConnectionPool, bool) {
	out := &meshv1.ConnectionPool{}
	var ok bool
	if t := cp.TCP; t != nil {
		if t.MaxConnections < 0 {
			n.problem(in, f+".tcp.maxConnections", "%d is negative", t.MaxConnections)
			return nil, false
		}
		out.MaxConnections = uint32(t.MaxConnections)
		if !n.durations(in, f+".tcp", durationField{"connectTimeout", t.ConnectTimeout, &out.ConnectTimeout},
			durationField{"maxConnectionDuration", t.MaxConnectionDuration, &out.MaxConnectionDuration}, durationField{"idleTimeout", t.IdleTimeout, &out.IdleTimeout}) {
			return nil, false
		}
	}
	h := cp.HTTP
	if h == nil {
		return out, true
	}
	for _, v := range []struct {
		field string
		value int32
	}{{"http1MaxPendingRequests", h.HTTP1MaxPendingRequests}, {"http2MaxRequests", h.HTTP2MaxRequests},
		{"maxRequestsPerConnection", h.MaxRequestsPerConnection}, {"maxRetries", h.MaxRetries}, {"maxConcurrentStreams", h.MaxConcurrentStreams}} {
		if v.value < 0 {
			n.problem(in, f+".http."+v.field, "%d is negative", v.value)
			return nil, false
		}
	}
	out.MaxPendingRequests, out.MaxRequests = uint32(h.HTTP1MaxPendingRequests), uint32(h.HTTP2MaxRequests)
	out.MaxRequestsPerConnection, out.MaxRetries = uint32(h.MaxRequestsPerConnection), uint32(h.MaxRetries)
	out.MaxConcurrentStreams, out.UseClientProtocol = uint32(h.MaxConcurrentStreams), h.UseClientProtocol
	if out.H2UpgradePolicy, ok = h2Upgrades[strings.ToUpper(h.H2UpgradePolicy)]; !ok {
		n.problem(in, f+".http.h2UpgradePolicy", "unknown policy %q: want DEFAULT, DO_NOT_UPGRADE or UPGRADE", h.H2UpgradePolicy)
		return nil, false
	}
	// The HTTP idle timeout wins over the TCP one, as in Istio.
	if h.IdleTimeout != "" {
		if out.IdleTimeout, ok = n.duration(in, f+".http.idleTimeout", h.IdleTimeout); !ok {
			return nil, false
		}
	}
	return out, true
}

// durationField is a duration field of an input (field, under some path),
// its value and where it goes.
type durationField struct {
	field, value string
	into         **durationpb.Duration
}

// durations reads duration fields under f, each into its place, and
// reports whether all were durations (the first that is not is a problem).
func (n *normalizer) durations(in Input, f string, ds ...durationField) bool {
	for _, d := range ds {
		var ok bool
		if *d.into, ok = n.duration(in, f+"."+d.field, d.value); !ok {
			return false
		}
	}
	return true
}

// outlierDetection reads a traffic policy's outlierDetection (at f).
func (n *normalizer) outlierDetection(in Input, f string, od *outlierDetection) (*meshv1.OutlierDetection, bool) {
	for _, p := range []struct {
		field string
		value int32
	}{{"maxEjectionPercent", od.MaxEjectionPercent}, {"minHealthPercent", od.MinHealthPercent}} {
		if p.value < 0 || p.value > 100 {
			n.problem(in, f+"."+p.field, "%d is not a percentage", p.value)
			return nil, false
		}
	}
	out := &meshv1.OutlierDetection{
		Consecutive_5XxErrors: od.Consecutive5xxErrors, ConsecutiveGatewayErrors: od.ConsecutiveGatewayErrors,
		MaxEjectionPercent: uint32(od.MaxEjectionPercent), MinHealthPercent: uint32(od.MinHealthPercent),
		SplitExternalLocalOriginErrors: od.SplitExternalLocalOriginErrors, ConsecutiveLocalOriginFailures: od.ConsecutiveLocalOriginFailures,
	}
	ok := n.durations(in, f, durationField{"interval", od.Interval, &out.Interval}, durationField{"baseEjectionTime", od.BaseEjectionTime, &out.BaseEjectionTime})
	return out, ok
}
