package envoypatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// target returns an empty message of the type a kind of patch's value is.
func target(to meshv1.EnvoyPatch_ApplyTo) (proto.Message, error) {
	switch to {
	case meshv1.EnvoyPatch_APPLY_TO_LISTENER:
		return &listener.Listener{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_FILTER_CHAIN:
		return &listener.FilterChain{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_NETWORK_FILTER:
		return &listener.Filter{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_HTTP_FILTER:
		return &hcm.HttpFilter{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_ROUTE_CONFIGURATION:
		return &route.RouteConfiguration{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_VIRTUAL_HOST:
		return &route.VirtualHost{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_HTTP_ROUTE:
		return &route.Route{}, nil
	case meshv1.EnvoyPatch_APPLY_TO_CLUSTER:
		return &cluster.Cluster{}, nil
	}
	return nil, fmt.Errorf("%s patches are not applied (no extension configuration discovery is served)", to)
}

// Decode returns a patch's value as the Envoy message it patches with.
func Decode(p *meshv1.EnvoyPatch) (proto.Message, error) {
	m, err := target(p.ApplyTo)
	if err != nil {
		return nil, err
	}
	if p.Value == nil {
		return m, nil
	}
	// encoding/json, unlike protojson, writes the same bytes every time:
	// errors point at the same column.
	js, err := json.Marshal(p.Value.AsMap())
	if err != nil {
		return nil, err
	}
	if err := protojson.Unmarshal(js, m); err != nil {
		return nil, fmt.Errorf("not a valid %s: %s", m.ProtoReflect().Descriptor().FullName(), protoError(err))
	}
	return m, nil
}

// protoError is a protobuf error's text without its "proto:" prefix
// (followed by a space or, at random, a non-breaking one).
func protoError(err error) string {
	msg, ok := strings.CutPrefix(err.Error(), "proto:")
	if !ok {
		return msg
	}
	return strings.TrimLeft(msg, " \u00a0")
}

// Check reports a patch that could never apply: a value that is not the
// message its kind patches with, an extension type not known, or, for
// the operations that add a whole resource or filter, one that is not
// valid on its own.
func Check(p *meshv1.EnvoyPatch) error {
	m, err := Decode(p)
	if err != nil {
		return err
	}
	switch p.Operation {
	case meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_REMOVE:
		return WalkAny(m.ProtoReflect(), func(a *anypb.Any) error {
			_, err := a.UnmarshalNew()
			return err
		})
	}
	return Valid(m)
}

// Valid checks a message as Envoy would take it: its own constraints and
// those of every extension configuration (Any) it holds.
func Valid(m proto.Message) error {
	if v, ok := m.(interface{ Validate() error }); ok {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	return WalkAny(m.ProtoReflect(), func(a *anypb.Any) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %v", a.GetTypeUrl(), err)
		}
		return Valid(inner)
	})
}

// ValidPart checks a message that is part of a resource, as a MERGE's
// value is: each field it sets as Envoy would take it, and every extension
// configuration (Any) it holds whole; the fields it leaves out are not
// checked (the resource it merges into may hold them).
func ValidPart(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			all := []error{err}
			if multi, ok := err.(interface{ AllErrors() []error }); ok {
				all = multi.AllErrors()
			}
			var set []string
			for _, e := range all {
				if !leftOut(m.ProtoReflect(), e) {
					set = append(set, e.Error())
				}
			}
			if len(set) > 0 {
				return errors.New(strings.Join(set, "; "))
			}
		}
	}
	return WalkAny(m.ProtoReflect(), func(a *anypb.Any) error {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %v", a.GetTypeUrl(), err)
		}
		return Valid(inner)
	})
}

// leftOut reports whether every violation err names (a generated
// validator's, through the messages that hold it) is of a field, or a
// oneof, that m leaves out.
func leftOut(m protoreflect.Message, err error) bool {
	type multi interface{ AllErrors() []error }
	type violation interface {
		Field() string
		Cause() error
	}
	switch e := err.(type) {
	case multi:
		for _, x := range e.AllErrors() {
			if !leftOut(m, x) {
				return false
			}
		}
		return true
	case violation:
		name, index, indexed := strings.Cut(strings.TrimSuffix(e.Field(), "]"), "[")
		fd := byGoName(m.Descriptor().Fields(), name)
		if fd == nil {
			od := byGoName(m.Descriptor().Oneofs(), name)
			return od != nil && m.WhichOneof(od) == nil
		}
		if !m.Has(fd) {
			return true
		}
		if e.Cause() == nil || fd.Message() == nil || fd.IsMap() {
			return false
		}
		v := m.Get(fd)
		if !fd.IsList() {
			return leftOut(v.Message(), e.Cause())
		}
		i, err := strconv.Atoi(index)
		if !indexed || err != nil || i < 0 || i >= v.List().Len() {
			return false
		}
		return leftOut(v.List().Get(i).Message(), e.Cause())
	}
	return false
}

// byGoName finds a field or oneof by the name the generated Go code gives
// it ("connect_timeout" is ConnectTimeout).
func byGoName[D interface{ Name() protoreflect.Name }, L interface {
	Len() int
	Get(int) D
}](list L, goName string) D {
	var none D
	for i := range list.Len() {
		d := list.Get(i)
		if strings.EqualFold(strings.ReplaceAll(string(d.Name()), "_", ""), goName) {
			return d
		}
	}
	return none
}

// walkAny calls f with every Any that m holds, outermost first; it does
// not look inside them.
func WalkAny(m protoreflect.Message, f func(*anypb.Any) error) error {
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		visit := func(v protoreflect.Value) {
			if err != nil {
				return
			}
			msg := v.Message()
			if a, ok := msg.Interface().(*anypb.Any); ok {
				err = f(a)
				return
			}
			err = WalkAny(msg, f)
		}
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				visit(l.Get(i))
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(mv)
				return err == nil
			})
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap():
			visit(v)
		}
		return err == nil
	})
	return err
}
