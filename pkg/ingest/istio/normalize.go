package istio

import (
	"encoding/json"
	"errors"
	"fmt"
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
// SecurityGroup, of the security resources; TelemetryGroup, of Telemetry.
const (
	Group          = "networking.istio.io"
	SecurityGroup  = "security.istio.io"
	TelemetryGroup = "telemetry.istio.io"
)

// GroupOf returns the API group of a kind.
func GroupOf(kind string) string {
	switch kind {
	case KindAuthorizationPolicy, KindPeerAuthentication, KindRequestAuthentication:
		return SecurityGroup
	case KindTelemetry:
		return TelemetryGroup
	}
	return Group
}

// VersionsOf returns the API versions Istio serves a kind at, the one to
// watch first.
func VersionsOf(kind string) []string {
	switch kind {
	case KindEnvoyFilter:
		return []string{"v1alpha3"}
	case KindTelemetry:
		return []string{"v1", "v1alpha1"}
	case KindAuthorizationPolicy, KindPeerAuthentication, KindRequestAuthentication:
		return []string{"v1", "v1beta1"}
	}
	return []string{"v1", "v1beta1", "v1alpha3"}
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

	KindTelemetry     = "Telemetry"
	KindEnvoyFilter   = "EnvoyFilter"
	KindWorkloadGroup = "WorkloadGroup"
)

var kinds = []string{KindServiceEntry, KindWorkloadEntry, KindVirtualService, KindDestinationRule, KindSidecar, KindGateway,
	KindAuthorizationPolicy, KindPeerAuthentication, KindRequestAuthentication, KindTelemetry, KindEnvoyFilter, KindWorkloadGroup, KindConfigMap}

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
	// Registration says the source registers the workloads of its
	// WorkloadGroups (the Kubernetes source, given the bus): a group is
	// checked rather than warned of.
	Registration bool
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
		svc, entry := n.one(in)
		if svc != nil {
			services = append(services, svc)
		}
		if entry != nil {
			entries = append(entries, entry)
		}
	}
	for _, s := range services {
		n.endpoints(s, entries)
	}
	return n.objs, n.problems
}

// one normalizes one input by its kind. A ServiceEntry's service and a
// WorkloadEntry's endpoint are returned, to be joined once every input is
// read; the rest is emitted.
func (n *normalizer) one(in Input) (svc *decodedService, entry *decodedEntry) {
	switch in.Resource.Kind {
	case KindServiceEntry:
		withSpec(n, in, true, func(spec *serviceEntry) { svc = n.serviceEntry(in, spec) })
	case KindWorkloadEntry:
		withSpec(n, in, true, func(spec *workloadEntry) {
			if ep, ok := n.endpoint(in, "spec", spec); ok {
				entry = &decodedEntry{ns: in.Resource.Metadata.Namespace, ep: ep}
			}
		})
	case KindVirtualService:
		withSpec(n, in, true, func(spec *virtualService) { n.virtualService(in, spec) })
	case KindDestinationRule:
		withSpec(n, in, true, func(spec *destinationRule) { n.destinationRule(in, spec) })
	case KindSidecar:
		withSpec(n, in, true, func(spec *sidecar) { n.sidecar(in, spec) })
	case KindGateway:
		withSpec(n, in, true, func(spec *gateway) { n.gateway(in, spec) })
	case KindAuthorizationPolicy:
		withSpec(n, in, false, func(spec *authorizationPolicy) { n.authorizationPolicy(in, spec) })
	case KindPeerAuthentication:
		withSpec(n, in, false, func(spec *peerAuthentication) { n.peerAuthentication(in, spec) })
	case KindRequestAuthentication:
		withSpec(n, in, false, func(spec *requestAuthentication) { n.requestAuthentication(in, spec) })
	case KindTelemetry:
		withSpec(n, in, false, func(spec *telemetry) { n.telemetry(in, spec) })
	case KindEnvoyFilter:
		withSpec(n, in, false, func(spec *envoyFilter) { n.envoyFilter(in, spec) })
	case KindWorkloadGroup:
		withSpec(n, in, false, func(spec *workloadGroup) { n.workloadGroup(in, spec) })
	case KindConfigMap:
		n.meshConfig(in)
	}
	return svc, entry
}

// withSpec decodes an input's spec into a T and, when it decodes, hands it
// to fn; ignored says whether the fields shardpilot does not apply yet are
// reported first.
func withSpec[T any](n *normalizer, in Input, ignored bool, fn func(*T)) {
	var spec T
	if !n.decode(in, &spec) {
		return
	}
	if ignored {
		n.ignoredFields(in, &spec)
	}
	fn(&spec)
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
	case KindTelemetry:
		kind = model.KindTelemetry
	case KindEnvoyFilter:
		kind = model.KindEnvoyFilter
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
	case r.Kind != KindConfigMap && (group != GroupOf(r.Kind) || !slices.Contains(VersionsOf(r.Kind), version)):
		n.problem(in, "apiVersion", "%q is not %s/{%s}", r.APIVersion, GroupOf(r.Kind), strings.Join(VersionsOf(r.Kind), ","))
	case r.Metadata.Name == "":
		n.problem(in, "metadata.name", "a name is required")
	case !model.ValidHostname(r.Metadata.Name):
		n.problem(in, "metadata.name", "%q is not a DNS name", r.Metadata.Name)
	case strings.Contains(r.Metadata.Name, ".") && r.Kind != KindWorkloadEntry:
		// A WorkloadEntry names no key (auto-registered ones hold their
		// address: group-10.0.0.1).
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
	if len(strict) == 0 {
		return true
	}
	msgs := make([]string, len(strict))
	for i, e := range strict {
		msgs[i] = e.Error()
	}
	if failsClosed(in.Resource.Kind) {
		n.problem(in, "spec", "%s (not a field of %s %s; a field not understood could widen what it allows or changes, so the resource is refused)",
			strings.Join(msgs, "; "), in.Resource.Kind, in.Resource.APIVersion)
		return false
	}
	// A newer Istio's field, or a misspelled one: the rest applies, as
	// istiod applies what it knows.
	n.warn(in, "spec", "%s: ignored (not a field of %s %s; the rest applies)", strings.Join(msgs, "; "), in.Resource.Kind, in.Resource.APIVersion)
	return true
}

// failsClosed says whether a resource with a field the normalizer does not
// know is refused whole rather than applied without it: the security
// policies (an ignored field could widen what a policy allows) and
// EnvoyFilter (an ignored match field widens what a patch changes).
func failsClosed(kind string) bool {
	switch kind {
	case KindAuthorizationPolicy, KindPeerAuthentication, KindRequestAuthentication, KindEnvoyFilter:
		return true
	}
	return false
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
