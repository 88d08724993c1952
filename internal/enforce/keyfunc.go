package enforce

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/ipkey"
)

// The key functions every front end offers, written once over the request
// type R. pkg ("httplimit", "grpclimit") prefixes their errors.

// Global returns a KeyFunc putting every request under one key.
func Global[R any]() KeyFunc[R] {
	return func(R) (string, error) { return "*", nil }
}

// EscapeKey returns s, text taken from a request (a path or pattern, a
// header, a cookie, metadata), with '%', '{' and '}' written %25, %7B and
// %7D, injectively. A '{' the client chose would open a Redis Cluster hash
// tag, and a '}' would close the one redisstore wraps an untagged key in
// ("{key}:gcra") early: either way the client, or a mux pattern's
// wildcard, would pick its key's slot and so its master. Text without
// them comes back as it is. Keys the user's own KeyFunc or ContextValue
// returns are not escaped: a tag is theirs to choose.
func EscapeKey(s string) string {
	if !strings.ContainsAny(s, "%{}") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%':
			b.WriteString("%25")
		case '{':
			b.WriteString("%7B")
		case '}':
			b.WriteString("%7D")
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Compose returns a KeyFunc for the combination of fns. If any part fails
// (its no-key error included), so does the whole. Parts are
// length-prefixed, so no two different combinations produce one key.
func Compose[R any](pkg string, fns ...KeyFunc[R]) KeyFunc[R] {
	for _, f := range fns {
		if f == nil {
			return func(R) (string, error) {
				return "", fmt.Errorf("%s: Compose was given a nil KeyFunc", pkg)
			}
		}
	}
	return func(r R) (string, error) {
		var b strings.Builder
		for _, f := range fns {
			k, err := f(r)
			if err != nil {
				return "", err
			}
			b.WriteString(strconv.Itoa(len(k)))
			b.WriteByte(':')
			b.WriteString(k)
		}
		return b.String(), nil
	}
}

// ContextValue returns a KeyFunc for the value stored under key in the
// request's context (ctx reads it from a request). Strings (of any
// string type), fmt.Stringers and integers of any kind are accepted, an
// empty string being noKey; a missing (nil) value, a typed nil pointer,
// map, slice, func, channel or interface included, is noKey; any other type
// is an error. A String method that panics is an error, never a panic.
func ContextValue[R any](pkg string, noKey error, ctx func(R) context.Context, key any) KeyFunc[R] {
	return func(r R) (string, error) {
		v := ctx(r).Value(key)
		if isNil(v) {
			// An auth layer storing a nil *User for an anonymous caller:
			// calling its String method would panic.
			return "", noKey
		}
		var s string
		switch t := v.(type) {
		case string:
			s = t
		case fmt.Stringer:
			var err error
			if s, err = safeString(pkg, t); err != nil {
				return "", err
			}
		default:
			// Named string types (type accountID string) and every
			// integer kind, by kind.
			switch rv := reflect.ValueOf(v); rv.Kind() {
			case reflect.String:
				s = rv.String()
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				return strconv.FormatInt(rv.Int(), 10), nil
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
				return strconv.FormatUint(rv.Uint(), 10), nil
			default:
				return "", fmt.Errorf("%s: context value %T is not a string or an integer", pkg, v)
			}
		}
		if s == "" {
			return "", noKey
		}
		return s, nil
	}
}

// isNil reports whether v is nil or a typed nil of a kind that can be.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}

// safeString calls s.String, turning a panic into an error as fmt does: a
// key function must not take the server down.
func safeString(pkg string, s fmt.Stringer) (str string, err error) {
	defer func() {
		if p := recover(); p != nil {
			str, err = "", fmt.Errorf("%s: context value %T: String method panicked: %v", pkg, s, p)
		}
	}()
	return s.String(), nil
}

// ClientIP returns a KeyFunc for a request's client address (see
// ipkey.New for trusted, header and the prefix lengths): peer returns the
// direct peer's "host:port" (ok false when the request has none);
// hops(name) returns the reader of the forwarding header's lines, given the
// header's name (header, or its default). It fails on a bad CIDR or prefix
// length.
func ClientIP[R any](pkg string, trusted []string, header string, v4, v6 int, peer func(R) (addr string, ok bool), hops func(name string) func(R) []string) (KeyFunc[R], error) {
	res, err := ipkey.New(trusted, header, v4, v6)
	if err != nil {
		return nil, err // the caller wraps it in its own package's error
	}
	lines := hops(res.Header())
	return func(r R) (string, error) {
		addr, ok := peer(r)
		if !ok {
			return "", fmt.Errorf("%s: no peer address", pkg)
		}
		a, err := ipkey.ParsePeer(addr)
		if err != nil {
			return "", fmt.Errorf("%s: %w", pkg, err)
		}
		return res.Key(res.Client(a, lines(r))), nil
	}, nil
}
