package httplimit_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
)

// Protect a handler: two requests per minute per client IP.
func Example() {
	store := memory.New(nil)
	defer store.Close()
	mw, err := httplimit.New(store, []httplimit.Rule{
		{Name: "per-ip", Limit: sluice.PerMinute(2), Key: httplimit.PeerIP()},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello\n") })
	handler := mw.Handler(hello)

	for range 3 {
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "per-ip";r=1;t=30
	// 200 "per-ip";r=0;t=60
	// 429 "per-ip";r=0;t=30
}

// Layered limits on a login endpoint behind a load balancer: per client IP
// (read from X-Forwarded-For only because the peer is a trusted proxy) and
// per account, checked all-or-nothing; a penalty blocks an IP that keeps
// trying.
func Example_layered() {
	store := memory.New(nil)
	defer store.Close()
	clientIP, err := httplimit.ClientIP(&httplimit.IPOptions{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	isLogin := func(r *http.Request) bool { return r.URL.Path == "/login" }
	mw, err := httplimit.New(store, []httplimit.Rule{
		{Name: "login-ip", Limit: sluice.PerMinute(3), Key: clientIP, Match: isLogin,
			Strategy: httplimit.Penalty, Penalty: 15 * time.Minute},
		{Name: "login-account", Limit: sluice.PerHour(20), Key: httplimit.Header("X-Account"), Match: isLogin},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	handler := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	for range 5 {
		req := httptest.NewRequest("POST", "/login", nil)
		req.RemoteAddr = "10.0.0.2:4321" // the load balancer
		req.Header.Set("X-Forwarded-For", "198.51.100.7")
		req.Header.Set("X-Account", "alice")
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "login-ip";r=2;t=20
	// 200 "login-ip";r=1;t=40
	// 200 "login-ip";r=0;t=60
	// 429 "login-ip";r=0;t=900
	// 429 "login-ip";r=0;t=900
}

func ExampleSetHeaders() {
	h := http.Header{}
	d := sluice.Decision{Limit: sluice.PerMinute(100), RetryAfter: 11500 * time.Millisecond, ResetAfter: time.Minute}
	httplimit.SetHeaders(h, "api", d, time.Unix(1_700_000_000, 0))
	for _, k := range []string{"Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit"} {
		fmt.Printf("%s: %s\n", k, h.Get(k))
	}
	// Output:
	// Retry-After: 12
	// X-RateLimit-Limit: 100
	// X-RateLimit-Remaining: 0
	// X-RateLimit-Reset: 1700000060
	// RateLimit-Policy: "api";q=100;w=60
	// RateLimit: "api";r=0;t=12
}

// Call a rate-limited third-party API without exceeding its quota: the
// client waits for quota before each request.
func ExampleTransport() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer upstream.Close()
	store := memory.New(nil)
	defer store.Close()
	quota, err := sluice.NewLimiter(store, sluice.PerSecond(50), nil)
	if err != nil {
		log.Fatal(err)
	}
	tr, err := httplimit.NewTransport(quota, nil)
	if err != nil {
		log.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	resp, err := client.Get(upstream.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	// Output: 200 ok
}
