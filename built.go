package sluice

import (
	"fmt"
	"reflect"
)

// BuildChecker is implemented by stores that can tell, without calling
// their backend, that they were not built (a zero value, a nil pointer, a
// nil client): CheckBuilt then returns an error wrapping ErrStoreNotBuilt,
// else nil. memory.Store, redisstore.Store, lease.Store, resilient.Store
// and resilient.MultiStore implement it, and so does redisstore.Membership,
// a fleet registry rather than a store, which resilient.NewFleet checks.
type BuildChecker interface {
	CheckBuilt() error
}

// CheckBuilt returns an error wrapping ErrStoreNotBuilt when store can
// never answer: nil, a nil pointer (unless it is a BuildChecker, which
// decides), or a BuildChecker that says it was not built. Constructors
// taking a store call it, so that such a store is refused up front rather
// than failing every call, or only once an outage reaches a fallback.
func CheckBuilt(store any) error {
	if c, ok := store.(BuildChecker); ok {
		if isNilValue(store) {
			// Its method may not take a nil receiver; ours do.
			if err := callCheck(c); err != nil {
				return err
			}
			return fmt.Errorf("%w: nil %T", ErrStoreNotBuilt, store)
		}
		return c.CheckBuilt()
	}
	if isNilValue(store) {
		return fmt.Errorf("%w: nil %T", ErrStoreNotBuilt, store)
	}
	return nil
}

// callCheck calls c.CheckBuilt, a panic (a method that needs its
// receiver) counting as not built.
func callCheck(c BuildChecker) (err error) {
	defer func() {
		if recover() != nil {
			err = fmt.Errorf("%w: nil %T", ErrStoreNotBuilt, c)
		}
	}()
	return c.CheckBuilt()
}

// isNilValue reports whether v is nil or a nil pointer, map, func, channel,
// slice or interface.
func isNilValue(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}
