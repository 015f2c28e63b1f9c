package sim

import (
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protocodec "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// response is a discovery response, SotW or Delta, read only as far as a
// simulated proxy needs: its type, version and nonce, each resource's
// name, version and encoded body, and the names removed. The bodies are
// sub-slices of the received message, valid until release: decoding every
// resource into Go structs and copying each body, as the generated types
// do, was the load test's largest cost after the system calls.
type response struct {
	delta bool // set before receiving: which message is expected

	buf                     mem.Buffer
	version, typeURL, nonce string
	resources               []body
	removed                 []string
}

// body is one resource of a response: for SotW, the Any's value (no name
// or version); for Delta, the Resource's name, version and Any's value
// (nil when the Resource carries no body).
type body struct {
	name, version string
	value         []byte
}

// size is the resources' encoded bytes.
func (r *response) size() int64 {
	var n int64
	for _, b := range r.resources {
		n += int64(len(b.value))
	}
	return n
}

// release returns the message's buffer; the bodies are invalid afterwards.
func (r *response) release() {
	if r.buf != nil {
		r.buf.Free()
		r.buf = nil
	}
	clear(r.resources)
	r.resources, r.removed = r.resources[:0], r.removed[:0]
}

var errTruncated = errors.New("truncated message")

// fields calls fn with each field of a message; fn returns how much of
// b it consumed (negative: an error), or 0 to skip the field.
func fields(b []byte, fn func(num protowire.Number, typ protowire.Type, b []byte) int) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		m := fn(num, typ, b)
		if m == 0 {
			m = protowire.ConsumeFieldValue(num, typ, b)
		}
		if m < 0 {
			return errTruncated
		}
		b = b[m:]
	}
	return nil
}

// bytesField reads a length-delimited field into *v.
func bytesField(typ protowire.Type, b []byte, v *[]byte) int {
	if typ != protowire.BytesType {
		return 0
	}
	s, n := protowire.ConsumeBytes(b)
	*v = s
	return n
}

// stringField reads a length-delimited field into *v, copied.
func stringField(typ protowire.Type, b []byte, v *string) int {
	var s []byte
	n := bytesField(typ, b, &s)
	if n > 0 {
		*v = string(s)
	}
	return n
}

// anyValue returns the value (field 2) of an encoded google.protobuf.Any.
func anyValue(b []byte) ([]byte, error) {
	var v []byte
	err := fields(b, func(num protowire.Number, typ protowire.Type, b []byte) int {
		if num == 2 {
			return bytesField(typ, b, &v)
		}
		return 0
	})
	return v, err
}

// decode reads a DiscoveryResponse or, with r.delta, a
// DeltaDiscoveryResponse.
func (r *response) decode(b []byte) error {
	r.version, r.typeURL, r.nonce = "", "", ""
	return fields(b, func(num protowire.Number, typ protowire.Type, b []byte) int {
		switch num {
		case 1: // version_info, system_version_info
			return stringField(typ, b, &r.version)
		case 4:
			return stringField(typ, b, &r.typeURL)
		case 5:
			return stringField(typ, b, &r.nonce)
		case 2: // resources: Any (SotW), Resource (Delta)
			var v []byte
			n := bytesField(typ, b, &v)
			if n <= 0 {
				return n
			}
			if !r.delta {
				value, err := anyValue(v)
				if err != nil {
					return -1
				}
				r.resources = append(r.resources, body{value: value})
				return n
			}
			var res body
			err := fields(v, func(num protowire.Number, typ protowire.Type, b []byte) int {
				switch num {
				case 1:
					return stringField(typ, b, &res.version)
				case 3:
					return stringField(typ, b, &res.name)
				case 2:
					var a []byte
					m := bytesField(typ, b, &a)
					if m > 0 {
						value, err := anyValue(a)
						if err != nil {
							return -1
						}
						res.value = value
						if res.value == nil {
							res.value = []byte{} // a body that is empty, not absent
						}
					}
					return m
				}
				return 0
			})
			if err != nil {
				return -1
			}
			r.resources = append(r.resources, res)
			return n
		case 6: // removed_resources (Delta)
			if !r.delta {
				return 0
			}
			var name string
			n := stringField(typ, b, &name)
			if n > 0 {
				r.removed = append(r.removed, name)
			}
			return n
		}
		return 0
	})
}

// rawCodec encodes requests as the proto codec does and decodes responses
// into a response, keeping the received buffer rather than copying it.
type rawCodec struct {
	pool  mem.BufferPool
	proto encoding.CodecV2
}

func newRawCodec(pool mem.BufferPool) *rawCodec {
	return &rawCodec{pool: pool, proto: encoding.GetCodecV2(protocodec.Name)}
}

// Name is the proto codec's: the servers see the content type they expect.
func (c *rawCodec) Name() string { return protocodec.Name }

func (c *rawCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c *rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*response)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	r.release()
	if len(data) == 1 {
		data[0].Ref()
		r.buf = data[0]
	} else {
		r.buf = data.MaterializeToBuffer(c.pool)
	}
	if err := r.decode(r.buf.ReadOnlyData()); err != nil {
		r.release()
		return fmt.Errorf("sim: discovery response: %w", err)
	}
	return nil
}

// The ADS methods, called with the raw codec.
var (
	sotwMethod  = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
	deltaMethod = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
	adsDesc     = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}
)
