package server

import (
	"errors"
	"fmt"
	"sync"

	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// codec is gRPC's proto codec with two exceptions, both on the hot path:
// a response encoded by the cache is written as it is (its body shared by
// every stream that is sent it, the stream's nonce appended as one more
// field), and a SotW request is decoded without allocating, its resource
// names fingerprinted and kept as bytes until the stream finds they
// changed. Everything else (Delta requests, CSDS) goes to the proto codec.
type codec struct{ proto encoding.CodecV2 }

func newCodec() codec { return codec{encoding.GetCodecV2(proto.Name)} }

func (codec) Name() string { return proto.Name }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	if o, ok := v.(*outgoing); ok {
		return mem.BufferSlice{mem.SliceBuffer(o.body), mem.SliceBuffer(o.nonce)}, nil
	}
	return c.proto.Marshal(v)
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch r := v.(type) {
	// A request the server's own decoding refuses is kept with its
	// reason, for the stream to end with the right status: gRPC would
	// turn the error into an INTERNAL one.
	case *sotwRequest:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		r.refused = r.decode(buf.ReadOnlyData())
		return nil
	case *deltaRequest:
		buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
		defer buf.Free()
		r.refused = r.decode(buf.ReadOnlyData())
		return nil
	}
	return c.proto.Unmarshal(data, v)
}

// outgoing is a response as the cache encoded it, and the stream's nonce
// as an encoded field (DiscoveryResponse and DeltaDiscoveryResponse both
// number it 5): fields may come in any order on the wire.
type outgoing struct {
	body, nonce []byte
}

const nonceField = 5

func newOutgoing(body []byte, nonce string) *outgoing {
	f := protowire.AppendTag(make([]byte, 0, len(nonce)+2), nonceField, protowire.BytesType)
	return &outgoing{body: body, nonce: protowire.AppendString(f, nonce)}
}

// sotwRequest is a DiscoveryRequest as the server reads it: byte fields
// copied into buffers taken from a pool for the request and given back
// once it is applied (release), so that an idle stream holds none: an
// ACK of a proxy's endpoints names every cluster it has.
type sotwRequest struct {
	*sotwBufs
	hasNode, hasError bool
	fp                cache.Fingerprint
	// refused says why the request could not be read.
	refused error
}

type sotwBufs struct {
	version, node, typeURL, nonce, errorDetail []byte
	// names holds every resource name back to back; ends[i] is where
	// name i ends. fp is their fingerprint.
	names []byte
	ends  []int
}

var sotwPool = sync.Pool{New: func() any { return new(sotwBufs) }}

// maxPooled is the largest request buffer kept for the next request.
const maxPooled = 1 << 20

// release gives the request's buffers back to the pool.
func (r *sotwRequest) release() {
	b := r.sotwBufs
	if b == nil {
		return
	}
	r.sotwBufs = nil
	if cap(b.names) <= maxPooled && cap(b.node) <= maxPooled && cap(b.errorDetail) <= maxPooled {
		sotwPool.Put(b)
	}
}

// DiscoveryRequest field numbers.
const (
	reqVersion     = 1
	reqNode        = 2
	reqNames       = 3
	reqTypeURL     = 4
	reqNonce       = 5
	reqErrorDetail = 6
)

var errMalformed = errors.New("malformed request")

func (r *sotwRequest) decode(b []byte) error {
	if r.sotwBufs == nil {
		r.sotwBufs = sotwPool.Get().(*sotwBufs)
	}
	r.version, r.node, r.typeURL, r.nonce, r.errorDetail = r.version[:0], r.node[:0], r.typeURL[:0], r.nonce[:0], r.errorDetail[:0]
	r.hasNode, r.hasError = false, false
	r.names, r.ends, r.fp = r.names[:0], r.ends[:0], cache.Fingerprint{}
	if cap(r.names) < len(b) {
		// The names take at most the request: one allocation, not a
		// copy at every doubling of a request of thousands of names.
		r.names = make([]byte, 0, len(b))
	}
	for len(b) > 0 {
		num, v, rest, err := nextField(b)
		if err != nil {
			return err
		}
		b = rest
		if v == nil {
			continue
		}
		switch num {
		case reqVersion:
			r.version = append(r.version[:0], v...)
		case reqNode:
			r.node, r.hasNode = append(r.node, v...), true
		case reqNames:
			r.names = append(r.names, v...)
			r.ends = append(r.ends, len(r.names))
			r.fp.Add(v)
		case reqTypeURL:
			r.typeURL = append(r.typeURL[:0], v...)
		case reqNonce:
			r.nonce = append(r.nonce[:0], v...)
		case reqErrorDetail:
			r.errorDetail, r.hasError = append(r.errorDetail, v...), true
		}
	}
	return nil
}

// eachName yields the request's resource names as bytes, valid until the
// next request is decoded.
func (r *sotwRequest) eachName(yield func([]byte) bool) {
	start := 0
	for _, end := range r.ends {
		if !yield(r.names[start:end]) {
			return
		}
		start = end
	}
}

// nameList returns the request's resource names. They are copies: a
// subscription that keeps them holds the table's own strings of the
// resources it has instead (cache.Table.Subscribe), and a name no
// resource has costs its copy alone, not a handle in a process-wide
// interning map (which made-up names would fill, each with a weak pointer
// the collector sweeps).
func (r *sotwRequest) nameList() []string {
	out := make([]string, len(r.ends))
	start := 0
	for i, end := range r.ends {
		out[i] = string(r.names[start:end])
		start = end
	}
	return out
}

// deltaRequest is a DeltaDiscoveryRequest as the server reads it. The
// first request of a reconnecting Delta stream carries every resource it
// holds with its version: decoded here into one map, sized once, instead
// of through protobuf's reflective map decoding.
// Its buffers, as a SotW request's, come from a pool for the request.
type deltaRequest struct {
	*deltaBufs
	hasNode, hasError bool
	initial           map[string]string
	// refused says why the request could not be read.
	refused error
	// maxInitial bounds the resource versions a request may list (0: any
	// number); more are refused before any is decoded.
	maxInitial int
}

// tooManyVersions refuses a Delta request listing more resource versions
// than a stream may subscribe to names.
type tooManyVersions struct{ n, max int }

func (e tooManyVersions) Error() string {
	return fmt.Sprintf("a request listing %d resource versions; at most %d are taken", e.n, e.max)
}

type deltaBufs struct {
	node, typeURL, nonce, errorDetail []byte
	subscribe, unsubscribe            []string
}

var deltaPool = sync.Pool{New: func() any { return new(deltaBufs) }}

// release gives the request's buffers back to the pool and drops what it
// held.
func (r *deltaRequest) release() {
	b := r.deltaBufs
	r.deltaBufs, r.initial = nil, nil
	if b == nil {
		return
	}
	clear(b.subscribe)
	clear(b.unsubscribe)
	if cap(b.node) <= maxPooled && cap(b.errorDetail) <= maxPooled && cap(b.subscribe) <= maxPooled/16 && cap(b.unsubscribe) <= maxPooled/16 {
		deltaPool.Put(b)
	}
}

// DeltaDiscoveryRequest field numbers.
const (
	deltaNode        = 1
	deltaTypeURL     = 2
	deltaSubscribe   = 3
	deltaUnsubscribe = 4
	deltaInitial     = 5
	deltaNonce       = 6
	deltaErrorDetail = 7
)

func (r *deltaRequest) decode(b []byte) error {
	bufs := r.deltaBufs
	if bufs == nil {
		bufs = deltaPool.Get().(*deltaBufs)
	}
	*r = deltaRequest{deltaBufs: bufs, maxInitial: r.maxInitial}
	r.node, r.typeURL, r.nonce, r.errorDetail = r.node[:0], r.typeURL[:0], r.nonce[:0], r.errorDetail[:0]
	r.subscribe, r.unsubscribe = r.subscribe[:0], r.unsubscribe[:0]
	entries := 0
	for rest := b; len(rest) > 0; {
		num, v, next, err := nextField(rest)
		if err != nil {
			return err
		}
		rest = next
		switch {
		case v == nil:
		case num == deltaNode:
			r.node, r.hasNode = append(r.node, v...), true
		case num == deltaTypeURL:
			r.typeURL = append(r.typeURL[:0], v...)
		case num == deltaSubscribe:
			r.subscribe = append(r.subscribe, string(v))
		case num == deltaUnsubscribe:
			r.unsubscribe = append(r.unsubscribe, string(v))
		case num == deltaInitial:
			entries++
		case num == deltaNonce:
			r.nonce = append(r.nonce[:0], v...)
		case num == deltaErrorDetail:
			r.errorDetail, r.hasError = append(r.errorDetail, v...), true
		}
	}
	if entries == 0 {
		return nil
	}
	if r.maxInitial > 0 && entries > r.maxInitial {
		return tooManyVersions{entries, r.maxInitial}
	}
	r.initial = make(map[string]string, entries)
	for rest := b; len(rest) > 0; {
		num, v, next, _ := nextField(rest) // read without error above
		rest = next
		if num != deltaInitial || v == nil {
			continue
		}
		var key, value []byte
		for len(v) > 0 {
			n, f, more, err := nextField(v)
			if err != nil {
				return err
			}
			v = more
			switch n {
			case 1:
				key = f
			case 2:
				value = f
			}
		}
		r.initial[string(key)] = string(value)
	}
	return nil
}

// nextField reads the first field of an encoded message: its number, its
// bytes when it is length-delimited (nil otherwise), and what follows it.
func nextField(b []byte) (protowire.Number, []byte, []byte, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return 0, nil, nil, fmt.Errorf("%w: %v", errMalformed, protowire.ParseError(n))
	}
	b = b[n:]
	if typ != protowire.BytesType {
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0, nil, nil, fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(n))
		}
		return num, nil, b[n:], nil
	}
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, nil, nil, fmt.Errorf("%w: field %d: %v", errMalformed, num, protowire.ParseError(n))
	}
	if v == nil {
		v = []byte{} // present but empty: still a field
	}
	return num, v, b[n:], nil
}

// sameID reports whether an encoded node's id is id, reading only that
// field; a node it cannot read is not.
func sameID(b []byte, id string) bool {
	for len(b) > 0 {
		num, v, rest, err := nextField(b)
		if err != nil {
			return false
		}
		if num == nodeIDField {
			return v != nil && string(v) == id
		}
		b = rest
	}
	return id == ""
}

// nodeIDField is the field number of envoy.config.core.v3.Node's id.
const nodeIDField = 1
