package patch

import (
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// merge merges src into dst as Istio merges a patch: as proto.Merge does,
// except that a duration, and an extension configuration (Any), is
// replaced whole.
func merge(dst, src proto.Message) { mergeMessage(dst.ProtoReflect(), src.ProtoReflect()) }

// replaced are the messages a merge replaces instead of merging their fields.
var replaced = map[protoreflect.FullName]bool{
	(&durationpb.Duration{}).ProtoReflect().Descriptor().FullName(): true,
	(&anypb.Any{}).ProtoReflect().Descriptor().FullName():           true,
}

func mergeMessage(dst, src protoreflect.Message) {
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			l := dst.Mutable(fd).List()
			sl := v.List()
			for i := range sl.Len() {
				if fd.Message() != nil {
					l.Append(protoreflect.ValueOfMessage(proto.Clone(sl.Get(i).Message().Interface()).ProtoReflect()))
				} else {
					l.Append(sl.Get(i))
				}
			}
		case fd.IsMap():
			mp := dst.Mutable(fd).Map()
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if fd.MapValue().Message() != nil {
					mv = protoreflect.ValueOfMessage(proto.Clone(mv.Message().Interface()).ProtoReflect())
				}
				mp.Set(k, mv)
				return true
			})
		case fd.Message() != nil && (!dst.Has(fd) || replaced[fd.Message().FullName()]):
			dst.Set(fd, protoreflect.ValueOfMessage(proto.Clone(v.Message().Interface()).ProtoReflect()))
		case fd.Message() != nil:
			mergeMessage(dst.Mutable(fd).Message(), v.Message())
		default:
			dst.Set(fd, v)
		}
		return true
	})
}

// mergeFilter merges a patch into a filter (network or HTTP) as Istio
// does: its configuration, where the patch's is of the same type, field by
// field; the rest as merge does.
func mergeFilter(dst, src proto.Message) error {
	type typed interface{ GetTypedConfig() *anypb.Any }
	d, _ := dst.(typed)
	s, _ := src.(typed)
	da, sa := d.GetTypedConfig(), s.GetTypedConfig()
	if da == nil || sa == nil || da.GetTypeUrl() != sa.GetTypeUrl() {
		merge(dst, src)
		return nil
	}
	dc, err := da.UnmarshalNew()
	if err != nil {
		return err
	}
	sc, err := sa.UnmarshalNew()
	if err != nil {
		return err
	}
	merge(dc, sc)
	a, err := anypb.New(dc)
	if err != nil {
		return err
	}
	rest := proto.Clone(src)
	switch f := rest.(type) {
	case *listener.Filter:
		f.ConfigType = nil
	case *hcm.HttpFilter:
		f.ConfigType = nil
	}
	merge(dst, rest)
	switch f := dst.(type) {
	case *listener.Filter:
		f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: a}
	case *hcm.HttpFilter:
		f.ConfigType = &hcm.HttpFilter_TypedConfig{TypedConfig: a}
	}
	return nil
}
