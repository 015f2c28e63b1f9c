package cache

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"weak"

	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// validator checks resources against Envoy's schema (their Validate
// methods), as a proxy would, and encodes them. A route configuration is
// checked without its virtual hosts, then each virtual host not found
// valid before, whose encoding is kept; it is encoded from its own fields
// and its hosts' kept encodings. The generators hand over the same
// virtual host object for an unchanged service, so that a change to one
// service's routes among a thousand checks and encodes one virtual host,
// not a thousand (checking and encoding the whole configuration took two
// fifths of a generation at a thousand services).
type validator struct {
	mu sync.Mutex
	// hosts are the virtual hosts found valid with their encoding, held
	// weakly: one leaves the set when the garbage collector frees it.
	hosts map[weak.Pointer[route.VirtualHost]][]byte
	// objects are the resources the tables hold (of the cache, and of a
	// cache that reuses it: Config.Reuse), by object and name, with their
	// entry (but the object) and how many entries hold them: a table handed an
	// object another holds copies the entry rather than check and encode
	// it again. The classes of a mesh that gives each
	// namespace its own are handed the same objects for the services
	// they all see (20,000 services checked and encoded once per class
	// took a fifth of a pusher's CPU). An object leaves when no table
	// holds it.
	objects map[heldKey]*held
}

// heldKey is an object under one name: the same object under two names
// has two entries.
type heldKey struct {
	res  types.Resource
	name string
}

// held is an entry the cache's tables hold, and how many of them.
type held struct {
	e    entry
	refs int
}

func newValidator() *validator {
	return &validator{hosts: map[weak.Pointer[route.VirtualHost]][]byte{}, objects: map[heldKey]*held{}}
}

// object returns the entry of r under name when a table of the cache
// holds r, else nil.
func (v *validator) object(name string, r types.Resource) *entry {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	h := v.objects[heldKey{r, name}]
	v.mu.Unlock()
	if h == nil {
		return nil
	}
	cp := h.e
	cp.res, cp.changed = r, 0
	return &cp
}

// hold counts a table's entry: its object is held once more.
func (v *validator) hold(e *entry) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	k := heldKey{e.res, e.name}
	if h := v.objects[k]; h != nil {
		h.refs++
		return
	}
	h := &held{e: *e, refs: 1}
	h.e.res = nil
	v.objects[k] = h
}

// release undoes a hold of r under name.
func (v *validator) release(r types.Resource, name string) {
	if v == nil {
		return
	}
	k := heldKey{r, name}
	v.mu.Lock()
	defer v.mu.Unlock()
	if h := v.objects[k]; h != nil {
		if h.refs--; h.refs <= 0 {
			delete(v.objects, k)
		}
	}
}

// deterministic encodes as the tables do: the same content, the same bytes.
var deterministic = proto.MarshalOptions{Deterministic: true}

// encode returns r's deterministic encoding. A route configuration's is
// its fields' with its hosts' kept encodings spliced in: field 1 (name)
// comes first, then virtual_hosts (2), then the rest, as the deterministic
// encoding orders fields by number. encoded, when it holds as many as it
// has hosts, is their encodings as check returned them (else they are
// looked up).
func (v *validator) encode(r types.Resource, encoded [][]byte) ([]byte, error) {
	rc, ok := r.(*route.RouteConfiguration)
	if !ok || v == nil || slices.Contains(rc.VirtualHosts, nil) {
		return deterministic.Marshal(r)
	}
	rest, err := deterministic.Marshal(withoutHosts(rc))
	if err != nil {
		return nil, err
	}
	var head []byte
	if num, typ, n := protowire.ConsumeTag(rest); n > 0 && num == 1 {
		m := protowire.ConsumeFieldValue(num, typ, rest[n:])
		if m < 0 {
			return deterministic.Marshal(r)
		}
		head, rest = rest[:n+m], rest[n+m:]
	}
	hosts := encoded
	if len(hosts) != len(rc.VirtualHosts) {
		hosts = v.encodedAll(rc.VirtualHosts)
	}
	size := len(head) + len(rest)
	for i, vh := range rc.VirtualHosts {
		if hosts[i] == nil {
			if hosts[i], err = deterministic.Marshal(vh); err != nil {
				return nil, err
			}
		}
		size += protowire.SizeTag(2) + protowire.SizeBytes(len(hosts[i]))
	}
	out := make([]byte, 0, size)
	out = append(out, head...)
	for _, b := range hosts {
		out = protowire.AppendTag(out, 2, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return append(out, rest...), nil
}

// check returns why r is invalid, or nil; and for a route configuration,
// its hosts' encodings (for encode), which it looks up once, under one
// lock.
func (v *validator) check(r types.Resource) ([][]byte, error) {
	rc, ok := r.(*route.RouteConfiguration)
	if !ok || v == nil {
		if x, ok := r.(interface{ Validate() error }); ok {
			return nil, x.Validate()
		}
		return nil, nil
	}
	if err := withoutHosts(rc).Validate(); err != nil {
		return nil, err
	}
	hosts := v.encodedAll(rc.VirtualHosts)
	for i, vh := range rc.VirtualHosts {
		if hosts[i] != nil || vh == nil {
			continue // valid, or (as the generated check) nothing to check
		}
		if err := vh.Validate(); err != nil {
			return nil, fmt.Errorf("invalid RouteConfiguration.VirtualHosts[%d]: embedded message failed validation | caused by: %w", i, err)
		}
		b, err := deterministic.Marshal(vh)
		if err != nil {
			return nil, fmt.Errorf("encode RouteConfiguration.VirtualHosts[%d]: %w", i, err)
		}
		if b == nil {
			b = []byte{}
		}
		v.remember(vh, b)
		hosts[i] = b
	}
	return hosts, nil
}

// withoutHosts returns a route configuration with rc's fields but its
// virtual hosts, sharing what it holds (rc is read, never changed: other
// generations may read it meanwhile).
func withoutHosts(rc *route.RouteConfiguration) *route.RouteConfiguration {
	out := &route.RouteConfiguration{}
	m := out.ProtoReflect()
	rc.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, val protoreflect.Value) bool {
		if fd.Name() != "virtual_hosts" {
			m.Set(fd, val)
		}
		return true
	})
	return out
}

func (v *validator) valid(vh *route.VirtualHost) bool { return v.encoded(vh) != nil }

// encoded returns a host's kept encoding: nil when it was not found valid.
func (v *validator) encoded(vh *route.VirtualHost) []byte {
	if vh == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.hosts[weak.Make(vh)]
}

// encodedAll returns the kept encodings of hosts (see encoded).
func (v *validator) encodedAll(hosts []*route.VirtualHost) [][]byte {
	keys := make([]weak.Pointer[route.VirtualHost], len(hosts))
	for i, vh := range hosts {
		if vh != nil {
			keys[i] = weak.Make(vh)
		}
	}
	out := make([][]byte, len(hosts))
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, k := range keys {
		if hosts[i] != nil {
			out[i] = v.hosts[k]
		}
	}
	return out
}

func (v *validator) remember(vh *route.VirtualHost, encoded []byte) {
	if encoded == nil {
		encoded = []byte{}
	}
	wp := weak.Make(vh)
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.hosts[wp]; ok {
		return
	}
	v.hosts[wp] = encoded
	runtime.AddCleanup(vh, v.forget, wp)
}

func (v *validator) forget(wp weak.Pointer[route.VirtualHost]) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.hosts, wp)
}

// size is how many virtual hosts the validator holds as valid.
func (v *validator) size() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.hosts)
}

// objectsHeld is how many objects, by name, the validator holds (see
// objects).
func (v *validator) objectsHeld() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.objects)
}
