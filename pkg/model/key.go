package model

import (
	"errors"
	"fmt"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Prefix is the store prefix under which every normalized object lives.
const Prefix = "/mesh/v1/"

// Kind is the kind of a normalized object, as it appears in its key.
type Kind string

// The kinds of normalized objects.
const (
	KindService       Kind = "services"
	KindEndpoints     Kind = "endpoints"
	KindRouteRule     Kind = "routerules"
	KindTrafficPolicy Kind = "trafficpolicies"
	KindScope         Kind = "scopes"
	KindGateway       Kind = "gateways"
	KindAuthorization Kind = "authorizationpolicies"
	KindPeerAuth      Kind = "peerauthentications"
	KindRequestAuth   Kind = "requestauthentications"
	KindMeshConfig    Kind = "meshconfigs"
	KindTelemetry     Kind = "telemetries"
	KindEnvoyFilter   Kind = "envoyfilters"
)

// Kinds lists every kind, in the order a consumer should apply a full load
// and a writer should write: each kind before the kinds that refer to it
// (a route rule names hosts, and subsets its traffic policy defines).
// Deletions go in the reverse order.
var Kinds = []Kind{KindMeshConfig, KindService, KindEndpoints, KindTrafficPolicy, KindGateway, KindRouteRule, KindScope,
	KindAuthorization, KindPeerAuth, KindRequestAuth, KindTelemetry, KindEnvoyFilter}

// MeshWide reports whether every consumer holds all objects of a kind,
// whatever namespaces it serves: Sidecars and Gateways (which decide
// scopes and gateway classes) and the mesh's settings.
func MeshWide(k Kind) bool {
	return k == KindScope || k == KindGateway || k == KindMeshConfig
}

// ErrBadKey is returned for a key outside the /mesh/v1/ layout.
var ErrBadKey = errors.New("model: bad key")

// Object is a normalized mesh object: one of the messages of meshv1 that
// carries an Origin.
type Object interface {
	proto.Message
	GetOrigin() *meshv1.Origin
}

// New returns an empty object of the kind, or nil for an unknown kind.
func New(k Kind) Object {
	switch k {
	case KindService:
		return &meshv1.Service{}
	case KindEndpoints:
		return &meshv1.Endpoints{}
	case KindRouteRule:
		return &meshv1.RouteRule{}
	case KindTrafficPolicy:
		return &meshv1.TrafficPolicy{}
	case KindScope:
		return &meshv1.Scope{}
	case KindGateway:
		return &meshv1.Gateway{}
	case KindAuthorization:
		return &meshv1.AuthorizationPolicy{}
	case KindPeerAuth:
		return &meshv1.PeerAuthentication{}
	case KindRequestAuth:
		return &meshv1.RequestAuthentication{}
	case KindMeshConfig:
		return &meshv1.MeshConfig{}
	case KindTelemetry:
		return &meshv1.Telemetry{}
	case KindEnvoyFilter:
		return &meshv1.EnvoyFilter{}
	}
	return nil
}

// KindOf returns the kind of an object.
func KindOf(o Object) Kind {
	switch o.(type) {
	case *meshv1.Service:
		return KindService
	case *meshv1.Endpoints:
		return KindEndpoints
	case *meshv1.RouteRule:
		return KindRouteRule
	case *meshv1.TrafficPolicy:
		return KindTrafficPolicy
	case *meshv1.Scope:
		return KindScope
	case *meshv1.Gateway:
		return KindGateway
	case *meshv1.AuthorizationPolicy:
		return KindAuthorization
	case *meshv1.PeerAuthentication:
		return KindPeerAuth
	case *meshv1.RequestAuthentication:
		return KindRequestAuth
	case *meshv1.MeshConfig:
		return KindMeshConfig
	case *meshv1.Telemetry:
		return KindTelemetry
	case *meshv1.EnvoyFilter:
		return KindEnvoyFilter
	}
	return ""
}

// Key identifies one object.
type Key struct {
	Kind      Kind
	Namespace string
	// Name is the object's name; for Endpoints it is "<service>/<shard>".
	Name string
}

// EndpointsName is the key name of the endpoints one shard contributes to a service.
func EndpointsName(service, shard string) string { return service + "/" + shard }

// String returns the store key.
func (k Key) String() string {
	return Prefix + string(k.Kind) + "/" + k.Namespace + "/" + k.Name
}

// ParseKey parses a store key.
func ParseKey(s string) (Key, error) {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return Key{}, fmt.Errorf("%w: %q lacks prefix %s", ErrBadKey, s, Prefix)
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return Key{}, fmt.Errorf("%w: %q is not %s<kind>/<namespace>/<name>", ErrBadKey, s, Prefix)
	}
	k := Key{Kind: Kind(parts[0]), Namespace: parts[1], Name: parts[2]}
	if New(k.Kind) == nil {
		return Key{}, fmt.Errorf("%w: %q has unknown kind %q", ErrBadKey, s, parts[0])
	}
	if k.Kind == KindEndpoints && strings.Count(k.Name, "/") != 1 {
		return Key{}, fmt.Errorf("%w: %q: endpoints are named <service>/<shard>", ErrBadKey, s)
	}
	if k.Kind != KindEndpoints && strings.Contains(k.Name, "/") {
		return Key{}, fmt.Errorf("%w: %q: name has a slash", ErrBadKey, s)
	}
	return k, nil
}

// Decode decodes a stored value of the key's kind.
func Decode(k Key, value []byte) (Object, error) {
	o := New(k.Kind)
	if o == nil {
		return nil, fmt.Errorf("%w: unknown kind %q", ErrBadKey, k.Kind)
	}
	if err := proto.Unmarshal(value, o); err != nil {
		return nil, fmt.Errorf("model: decode %s: %w", k, err)
	}
	return o, nil
}

// Encode encodes an object deterministically, so equal objects give equal bytes.
func Encode(o Object) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(o)
}

// SameContent reports whether two objects are equal apart from their Origin,
// which records when and where an input was seen, not what it says.
func SameContent(a, b Object) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return proto.Equal(withoutOrigin(a), withoutOrigin(b))
}

// withoutOrigin returns a shallow copy of o without its origin: its fields
// share o's values, so no field is copied (a sync compares every object
// it holds with the store's).
func withoutOrigin(o Object) proto.Message {
	src := o.ProtoReflect()
	dst := src.New()
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != "origin" {
			dst.Set(fd, v)
		}
		return true
	})
	return dst.Interface()
}

// ErrCompacted says a store revision is no longer available: a consumer
// reloads the whole mesh from the store.
var ErrCompacted = errors.New("model: store revision compacted")

// ErrGap says a change stream is missing events a consumer needs: the
// consumer reloads the whole mesh from the store.
var ErrGap = errors.New("model: gap in the change stream")

// ErrRefused says a change stream holds an event its publisher cannot have
// published there (a subject that is not its key's, a missing or wrong
// signature): its change is not applied, and a consumer reloads from the
// store.
var ErrRefused = errors.New("model: change event refused")

// ErrNotStored says the bus answered a publish and did not store the event
// (its stream refused the write, its server the message): unlike a bus out
// of reach, retrying the same publish may never succeed.
var ErrNotStored = errors.New("model: the bus did not store the event")

// Stored is one object as the store holds it.
type Stored struct {
	Key         Key
	Object      Object
	ModRevision int64
}

// ValidateKey checks a key's namespace and name before the key is made into
// a store key: a namespace is a DNS label, as Kubernetes has it, and a
// name's parts (an endpoints name has two, service and shard) hold no path
// step, wildcard or space. The field paths are the input's metadata.
func ValidateKey(k Key) error {
	if len(k.Namespace) > 63 || !dnsLabel.MatchString(k.Namespace) {
		return fieldErr("metadata.namespace", "%q is not a DNS label (lowercase letters, digits and '-', at most 63, starting and ending alphanumeric)", truncate(k.Namespace))
	}
	parts := []string{k.Name}
	if k.Kind == KindEndpoints {
		parts = strings.SplitN(k.Name, "/", 2)
	}
	for _, p := range parts {
		if p == "" || p == "." || p == ".." || len(p) > 253 || strings.ContainsFunc(p, badNameRune) {
			return fieldErr("metadata.name", "%q is not a name (at most 253 characters, none of them a slash, a wildcard or a control character, and not . or ..)", truncate(k.Name))
		}
	}
	return nil
}

func badNameRune(r rune) bool {
	return r == '/' || r == '*' || r < ' ' || r == 0x7f
}

// truncate shortens a value quoted in an error to what a log line can
// carry.
func truncate(s string) string {
	const most = 80
	if len(s) <= most {
		return s
	}
	return s[:most] + "…"
}
