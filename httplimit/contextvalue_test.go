package httplimit_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/httplimit"
)

type acctKey struct{}
type accountID string
type blank struct{}

func (blank) String() string { return "" }

// ContextValue takes strings of any string type and integers of any kind;
// an empty string, from a Stringer too, is ErrNoKey.
func TestContextValueKinds(t *testing.T) {
	f := httplimit.ContextValue(acctKey{})
	with := func(v any) (string, error) {
		r := httptest.NewRequest("GET", "/", nil)
		return f(r.WithContext(context.WithValue(r.Context(), acctKey{}, v)))
	}
	for v, want := range map[any]string{accountID("alice"): "alice", int16(-7): "-7", uint8(3): "3", "bob": "bob", 42: "42"} {
		if k, err := with(v); err != nil || k != want {
			t.Errorf("%T(%v): %q, %v; want %q", v, v, k, err, want)
		}
	}
	for _, v := range []any{blank{}, "", accountID("")} {
		if k, err := with(v); !errors.Is(err, httplimit.ErrNoKey) {
			t.Errorf("%T(%v): %q, %v; want ErrNoKey", v, v, k, err)
		}
	}
	if _, err := with(3.5); err == nil || errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf("a float: %v, want an error", err)
	}
}
