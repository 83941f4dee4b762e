package main

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
)

// visitFunc sees one message of a resource. path says where it sits
// (field names, with <Type> where an Any was unpacked). root is true for the
// resource itself and for each message unpacked from an Any: the generated
// validators descend into plain sub-messages themselves but never into an
// Any, so ValidateAll has to be called on exactly these.
type visitFunc func(m proto.Message, path string, root bool)

// visit calls fn on m and on every message nested in it, unpacking Any
// fields. It returns the Anys it could not unpack: a type URL missing from
// the registry means an extension package is not linked into this binary
// (see extensions.go), or the server sent a type that does not exist.
func visit(m proto.Message, path string, fn visitFunc) []error {
	fn(m, path, true)
	return walkFields(m.ProtoReflect(), path, fn)
}

func walkFields(m protoreflect.Message, path string, fn visitFunc) []error {
	var errs []error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		field := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			list := v.List()
			for i := 0; i < list.Len(); i++ {
				errs = append(errs, visitNested(list.Get(i).Message(), fmt.Sprintf("%s[%d]", field, i), fn)...)
			}
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				errs = append(errs, visitNested(mv.Message(), fmt.Sprintf("%s[%v]", field, k.Interface()), fn)...)
				return true
			})
		default:
			errs = append(errs, visitNested(v.Message(), field, fn)...)
		}
		return true
	})
	return errs
}

func visitNested(m protoreflect.Message, path string, fn visitFunc) []error {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		fn(m.Interface(), path, false)
		return walkFields(m, path, fn)
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		return []error{fmt.Errorf("%s: cannot unpack Any %q: %w", path, a.GetTypeUrl(), err)}
	}
	return visit(inner, fmt.Sprintf("%s<%s>", path, inner.ProtoReflect().Descriptor().FullName()), fn)
}

// canonical returns a copy of m in which every Any holds the deterministic
// encoding of its (recursively canonical) content. proto.Equal compares an
// Any's bytes, and two encodings of one message may differ (map order), so
// states are compared in this form.
func canonical(m proto.Message) proto.Message {
	c := proto.Clone(m)
	canonicalize(c.ProtoReflect())
	return c
}

func canonicalize(m protoreflect.Message) {
	if a, ok := m.Interface().(*anypb.Any); ok {
		if inner, err := a.UnmarshalNew(); err == nil {
			canonicalize(inner.ProtoReflect())
			if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(inner); err == nil {
				a.Value = b
			}
		}
		return
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil {
			return true
		}
		switch {
		case fd.IsList():
			for i := 0; i < v.List().Len(); i++ {
				canonicalize(v.List().Get(i).Message())
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					canonicalize(mv.Message())
					return true
				})
			}
		default:
			canonicalize(v.Message())
		}
		return true
	})
}

// sameResource reports whether two resources are the same message.
func sameResource(a, b proto.Message) bool {
	return proto.Equal(canonical(a), canonical(b))
}
