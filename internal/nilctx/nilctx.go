// Package nilctx helps tests that every call takes a nil context for
// context.Background(), as the library promises, rather than panicking.
package nilctx

import "testing"

// Call runs fn, a call given a nil context, and fails t, naming the call,
// when it panics or returns an error.
func Call(t testing.TB, name string, fn func() error) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("%s with a nil context panicked: %v", name, p)
		}
	}()
	if err := fn(); err != nil {
		t.Errorf("%s with a nil context: %v", name, err)
	}
}
