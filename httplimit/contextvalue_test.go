package httplimit_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/middlewaretest"
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

type ctxUser struct{ id string }

func (u *ctxUser) String() string { return u.id }

type panicky struct{}

func (panicky) String() string { panic("boom") }

// A typed nil stored by an auth middleware (a nil *User for an anonymous
// caller) is ErrNoKey, so the rule does not apply; a String method that
// panics is a key error, never a panic in the server. Over a real listener.
func TestContextValueNilAndPanickingStringer(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	mw, err := httplimit.New(store, []httplimit.Rule{
		{Name: "per-user", Limit: sluice.PerMinute(1), Key: httplimit.ContextValue(acctKey{})},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stored atomic.Value
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			v := stored.Load().(*holder).v
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), acctKey{}, v)))
		})
	}
	srv := httptest.NewServer(auth(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))))
	t.Cleanup(srv.Close)
	get := func() int {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, v := range []any{(*ctxUser)(nil), map[string]int(nil), []byte(nil), (func())(nil), (chan int)(nil)} {
		stored.Store(&holder{v})
		for i := range 3 { // the limit is 1 a minute: the rule must not apply
			if code := get(); code != http.StatusOK {
				t.Errorf("%T(nil), request %d: %d, want 200 (rule skipped)", v, i, code)
			}
		}
	}
	stored.Store(&holder{panicky{}})
	if code := get(); code != http.StatusInternalServerError {
		t.Errorf("a panicking String method: %d, want 500", code)
	}
	f := httplimit.ContextValue(acctKey{})
	r := httptest.NewRequest("GET", "/", nil)
	if _, err := f(r.WithContext(context.WithValue(r.Context(), acctKey{}, panicky{}))); err == nil || errors.Is(err, httplimit.ErrNoKey) || !strings.Contains(err.Error(), "panicked") {
		t.Errorf("a panicking String method: %v, want an error saying so", err)
	}
}

type holder struct{ v any }
