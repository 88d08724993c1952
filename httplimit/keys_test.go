package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
)

// A spoofed X-Forwarded-For from an untrusted peer does not change the key;
// the same header from a trusted proxy does. End to end: the peer of an
// httptest server is 127.0.0.1.
func TestSpoofedForwardedFor(t *testing.T) {
	t.Parallel()
	untrusted, err := ClientIP(nil)
	if err != nil {
		t.Fatal(err)
	}
	trusted, err := ClientIP(&IPOptions{TrustedProxies: []string{"127.0.0.0/8", "::1"}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  KeyFunc
		want []int // statuses for the XFF values below, one request each
	}{
		// Every request counts against 127.0.0.1, whatever it claims.
		{"untrusted peer", untrusted, []int{200, 429, 429, 429}},
		// Each claimed client has its own quota; a repeat is denied.
		{"trusted proxy", trusted, []int{200, 200, 429, 200}},
	}
	xff := []string{"198.51.100.1", "198.51.100.2", "198.51.100.2", "6.6.6.6, 198.51.100.3"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, []Rule{{Name: "ip", Limit: sluice.PerHour(1), Key: tt.key}}, nil)
			for i, v := range xff {
				if r := e.get("/", "X-Forwarded-For", v); r.status != tt.want[i] {
					t.Errorf("X-Forwarded-For %q: %d, want %d", v, r.status, tt.want[i])
				}
			}
		})
	}
}

// A trusted proxy appends its element to the client's Forwarded line; a
// quote the client leaves open must not swallow that element and so key
// the client as the proxy (a fresh budget). End to end over a real
// listener whose peer, 127.0.0.1, is the trusted proxy.
func TestForwardedClientQuoteKeepsProxyElement(t *testing.T) {
	t.Parallel()
	key, err := ClientIP(&IPOptions{TrustedProxies: []string{"127.0.0.0/8", "::1"}, Header: "Forwarded"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, []Rule{{Name: "ip", Limit: sluice.PerHour(1), Key: key}}, nil)
	const proxy = "for=203.0.113.9"
	if r := e.get("/", "Forwarded", proxy); r.status != 200 {
		t.Fatalf("first request: %d, want 200", r.status)
	}
	for _, client := range []string{`for="`, `for=6.6.6.6;host="`, `host="a\"`, `for=198.51.100.1;by="x`} {
		if r := e.get("/", "Forwarded", client+", "+proxy); r.status != 429 {
			t.Errorf("client sent %q: %d, want 429 (keyed 203.0.113.9, whose hour is spent)", client, r.status)
		}
	}
}

func TestKeyFuncs(t *testing.T) {
	t.Parallel()
	type userID int
	req := func(f func(r *http.Request)) *http.Request {
		r := httptest.NewRequest("POST", "/items/42?x=1", nil)
		r.RemoteAddr = "[2001:db8:1:2:3:4:5:6]:5555"
		if f != nil {
			f(r)
		}
		return r
	}
	withCtx := func(v any) func(r *http.Request) {
		return func(r *http.Request) { *r = *r.WithContext(context.WithValue(r.Context(), ctxKey{}, v)) }
	}
	tests := []struct {
		name    string
		fn      KeyFunc
		f       func(r *http.Request)
		want    string
		wantErr error // ErrNoKey, or errAny for any other error
	}{
		{"peer ip /64", PeerIP(), nil, "2001:db8:1:2::/64", nil},
		{"peer ipv4", PeerIP(), func(r *http.Request) { r.RemoteAddr = "192.0.2.1:80" }, "192.0.2.1", nil},
		{"bad peer", PeerIP(), func(r *http.Request) { r.RemoteAddr = "@" }, "", errAny},
		{"header", Header("x-api-key"), func(r *http.Request) { r.Header.Set("X-API-Key", "k1") }, "k1", nil},
		{"missing header", Header("X-API-Key"), nil, "", ErrNoKey},
		{"empty header", Header("X-API-Key"), func(r *http.Request) { r.Header.Set("X-API-Key", "") }, "", ErrNoKey},
		{"cookie", Cookie("sid"), func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "sid", Value: "s1"}) }, "s1", nil},
		{"missing cookie", Cookie("sid"), nil, "", ErrNoKey},
		{"malformed cookie header", Cookie("sid"), func(r *http.Request) { r.Header.Set("Cookie", "===;;;") }, "", ErrNoKey},
		{"context string", ContextValue(ctxKey{}), withCtx("alice"), "alice", nil},
		{"context int", ContextValue(ctxKey{}), withCtx(42), "42", nil},
		{"context int64", ContextValue(ctxKey{}), withCtx(int64(-7)), "-7", nil},
		{"context uint64", ContextValue(ctxKey{}), withCtx(uint64(1) << 63), "9223372036854775808", nil},
		{"context empty", ContextValue(ctxKey{}), withCtx(""), "", ErrNoKey},
		{"context missing", ContextValue(ctxKey{}), nil, "", ErrNoKey},
		{"context named integer", ContextValue(ctxKey{}), withCtx(userID(1)), "1", nil},
		{"context wrong type", ContextValue(ctxKey{}), withCtx(1.5), "", errAny},
		{"route from plain path", Route(), nil, "POST /items/42", nil},
		{"header braces", Header("X-API-Key"), func(r *http.Request) { r.Header.Set("X-API-Key", "{t}50%") }, "%7Bt%7D50%25", nil},
		{"cookie braces", Cookie("sid"), func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "sid", Value: "{s}"}) }, "%7Bs%7D", nil},
		{"context braces kept", ContextValue(ctxKey{}), withCtx("{tenant42}:alice"), "{tenant42}:alice", nil},
		// A pattern's wildcard would be a Cluster hash tag.
		{"route from pattern", Route(), func(r *http.Request) { r.Pattern = "POST /items/{id}" }, "POST /items/%7Bid%7D", nil},
		{"route from path", Route(), func(r *http.Request) { r.URL.Path = "/{x}/%" }, "POST /%7Bx%7D/%25", nil},
		{"route from hostless pattern", Route(), func(r *http.Request) { r.Pattern = "/items/" }, "POST /items/", nil},
		{"global", Global(), nil, "*", nil},
		{"compose", Compose(Header("X-API-Key"), Route()), func(r *http.Request) { r.Header.Set("X-API-Key", "k1") }, "2:k114:POST /items/42", nil},
		{"compose missing part", Compose(Header("X-API-Key"), Route()), nil, "", ErrNoKey},
		{"compose nil", Compose(nil), nil, "", errAny},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.fn(req(tt.f))
			switch {
			case tt.wantErr == errAny:
				if err == nil || errors.Is(err, ErrNoKey) {
					t.Errorf("err = %v, want an error other than ErrNoKey", err)
				}
			case !errors.Is(err, tt.wantErr):
				t.Errorf("err = %v, want %v", err, tt.wantErr)
			case got != tt.want:
				t.Errorf("key = %q, want %q", got, tt.want)
			}
		})
	}
}

var errAny = errors.New("any error")

// Compositions are unambiguous: ("a:b", "c") and ("a", "b:c") differ.
func TestComposeUnambiguous(t *testing.T) {
	t.Parallel()
	k := Compose(Header("A"), Header("B"))
	r1 := httptest.NewRequest("GET", "/", nil)
	r1.Header.Set("A", "x:1")
	r1.Header.Set("B", "y")
	r2 := httptest.NewRequest("GET", "/", nil)
	r2.Header.Set("A", "x")
	r2.Header.Set("B", "1:y")
	k1, _ := k(r1)
	k2, _ := k(r2)
	if k1 == k2 {
		t.Errorf("both compose to %q", k1)
	}
}

// A key function error is answered by the error handler, not the next
// handler.
func TestKeyErrorHandled(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	m, err := New(store, []Rule{{Name: "p", Limit: sluice.PerMinute(1), Key: PeerIP()}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "not-an-address"
	rec := httptest.NewRecorder()
	m.Handler(okHandler).ServeHTTP(rec, r)
	if rec.Code != 500 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("bad peer: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
	}
}
