package httplimit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

// slotEnv serves h behind a middleware with in-flight rules over store on
// a real server.
func slotEnv(t *testing.T, store sluice.Store, rules []Rule, opts *Options, h http.Handler) *env {
	t.Helper()
	m, err := New(store, rules, opts)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, store: store, srv: httptest.NewServer(m.Handler(h))}
	t.Cleanup(e.srv.Close)
	return e
}

// fakeSlots is a memory store on a fake clock: no hold ever runs out
// unless the test advances it.
func fakeSlots(t *testing.T) *memory.Store {
	store := memory.New(&memory.Options{Clock: storetest.NewClock(t0).Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	return store
}

// gate holds each request in its handler until the test lets it go.
type gate struct {
	entered chan struct{}
	leave   chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 16), leave: make(chan struct{})} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.entered <- struct{}{}
	<-g.leave
}

// background runs a request that the gate holds, returning its status
// once it ends.
func (e *env) background(header ...string) <-chan int {
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", e.srv.URL, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Add(header[i], header[i+1])
		}
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}

var oneAtATime = []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, time.Hour), Key: Global()}}

// A slot is released when the handler returns: the next request gets it.
func TestInFlightReleaseOnReturn(t *testing.T) {
	t.Parallel()
	g := newGate()
	e := slotEnv(t, fakeSlots(t), nil, &Options{InFlight: oneAtATime}, g)
	done := e.background()
	<-g.entered
	r := e.get("/")
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("second request while the first holds: %d, want 429", r.status)
	}
	var p Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Policy != "one" || p.RetryAfter < 1 || r.header.Get("Retry-After") == "" {
		t.Errorf("429 body %s (%v), Retry-After %q", r.body, err, r.header.Get("Retry-After"))
	}
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	g.leave <- struct{}{}
	if code := <-done; code != 200 {
		t.Fatalf("first request: %d", code)
	}
	done = e.background()
	<-g.entered
	close(g.leave)
	if code := <-done; code != 200 {
		t.Errorf("after the first returned: %d, want 200", code)
	}
}

// A panicking handler releases its slot, and the panic goes on.
func TestInFlightReleaseOnPanic(t *testing.T) {
	t.Parallel()
	m, err := New(fakeSlots(t), nil, &Options{InFlight: oneAtATime})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var panics []any
	inner := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic(http.ErrAbortHandler) // the server swallows it silently
		}
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				mu.Lock()
				panics = append(panics, v)
				mu.Unlock()
				panic(v)
			}
		}()
		inner.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	if _, err := srv.Client().Get(srv.URL + "/panic"); err == nil {
		t.Fatal("the aborted request got a response")
	}
	resp, err := srv.Client().Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("after the panic: %d, want 200 (slot released)", resp.StatusCode)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(panics) != 1 || panics[0] != http.ErrAbortHandler {
		t.Errorf("panics seen outside the middleware: %v, want the handler's one", panics)
	}
}

// A hijacked connection holds its slot until it is closed.
func TestInFlightHijackHoldsUntilClose(t *testing.T) {
	t.Parallel()
	closeConn := make(chan struct{})
	closed, returned := make(chan struct{}), make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/hijack" {
			return
		}
		defer close(returned)
		c, rw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
		rw.Flush()
		go func() { // the connection outlives the handler
			<-closeConn
			c.Close()
			close(closed)
		}()
	})
	e := slotEnv(t, fakeSlots(t), nil, &Options{InFlight: oneAtATime}, h)
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GET /hijack HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("hijack: %v %v", resp, err)
	}
	<-returned // the hijacked connection still holds
	if r := e.get("/"); r.status != http.StatusTooManyRequests {
		t.Errorf("while hijacked: %d, want 429", r.status)
	}
	close(closeConn)
	<-closed
	if r := e.get("/"); r.status != 200 {
		t.Errorf("after the hijacked connection closed: %d, want 200", r.status)
	}
}

// Slots are acquired before rate units are taken: a request refused its
// slot takes no rate units, and a request the rate rule denies releases
// its slot.
func TestInFlightThenRate(t *testing.T) {
	t.Parallel()
	store := fakeSlots(t)
	obs := &middlewaretest.Slots{}
	g := newGate()
	rate := []Rule{{Name: "rate", Limit: sluice.PerHour(2), Key: Global()}}
	e := slotEnv(t, store, rate, &Options{InFlight: oneAtATime, Observer: obs}, g)
	done := e.background()
	<-g.entered
	// Refused its slot: no rate unit taken (the rate rule is never asked).
	if r := e.get("/"); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "in-flight") {
		t.Fatalf("while held: %d %s", r.status, r.body)
	}
	g.leave <- struct{}{}
	<-done
	// The second rate unit is still there.
	done = e.background()
	<-g.entered
	g.leave <- struct{}{}
	if code := <-done; code != 200 {
		t.Fatalf("second admitted request: %d", code)
	}
	if got := obs.Get("rate/allowed"); got != 2 {
		t.Errorf("rate decisions allowed = %d, want 2", got)
	}
	// Now the rate rule denies, after the slot was acquired: the denial
	// releases it.
	if r := e.get("/"); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "rate limit") {
		t.Fatalf("over the rate: %d %s", r.status, r.body)
	}
	if got, want := obs.Get("one/acquire/allowed"), 3; got != want {
		t.Errorf("slot acquires = %d, want %d", got, want)
	}
	if got, want := obs.Get("one/release/allowed"), 3; got != want {
		t.Errorf("slot releases = %d, want %d (the rate denial released its slot)", got, want)
	}
	slot, d, err := sluice.AcquireSlot(context.Background(), store, "httplimit:v3:one:*", oneAtATime[0].Limit, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("the slot is still held after the rate denial: %+v %v", d, err)
	}
	slot.Release(context.Background())
}

// A per-key in-flight refusal is 429 (the client's own doing); a shedding
// refusal is 503 (the service is busy), each with Retry-After.
func TestInFlight429Shed503(t *testing.T) {
	t.Parallel()
	g := newGate()
	opts := &Options{
		InFlight: []InFlightRule{{Name: "per-key", Limit: sluice.Concurrent(1, time.Minute), Key: Header("X-Key")}},
		Shed:     []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(2, 30*time.Second)}},
	}
	e := slotEnv(t, fakeSlots(t), nil, opts, g)
	a, b := e.background("X-Key", "a"), e.background("X-Key", "b")
	<-g.entered
	<-g.entered
	for _, tt := range []struct {
		key    string
		status int
		retry  string
		policy string
	}{
		{"a", http.StatusTooManyRequests, "60", "per-key"},  // a's one slot is held
		{"c", http.StatusServiceUnavailable, "30", "fleet"}, // the fleet's two are held
		{"", http.StatusServiceUnavailable, "30", "fleet"},  // no key: only the fleet applies
		{"a", http.StatusTooManyRequests, "60", "per-key"},  // per-key comes first
	} {
		var h []string
		if tt.key != "" {
			h = []string{"X-Key", tt.key}
		}
		r := e.get("/", h...)
		var p Problem
		json.Unmarshal([]byte(r.body), &p)
		if r.status != tt.status || r.header.Get("Retry-After") != tt.retry || p.Policy != tt.policy || p.Status != tt.status {
			t.Errorf("key %q: %d Retry-After %q %s; want %d, %s, %s", tt.key, r.status, r.header.Get("Retry-After"), r.body, tt.status, tt.retry, tt.policy)
		}
	}
	close(g.leave)
	<-a
	<-b
	if r := e.get("/", "X-Key", "a"); r.status != 200 {
		t.Errorf("after both returned: %d", r.status)
	}
}

// A priority header is believed only from a trusted proxy; from anyone
// else, and when it names no priority, the request is normal.
func TestPriorityFromUntrustedIgnored(t *testing.T) {
	t.Parallel()
	// Everything is reserved for critical requests: normal ones are shed.
	shed := []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(10, time.Minute), Reserve: sluice.Reserve{Critical: 1}}}
	for _, tt := range []struct {
		trusted []string
		value   string
		status  int
	}{
		{nil, "critical", http.StatusServiceUnavailable},
		{[]string{"10.0.0.0/8"}, "critical", http.StatusServiceUnavailable},
		{[]string{"127.0.0.1"}, "critical", http.StatusOK},
		{[]string{"127.0.0.0/8"}, "CRITICAL!", http.StatusServiceUnavailable},
		{[]string{"127.0.0.0/8"}, "", http.StatusServiceUnavailable},
		// A proxy that appends to the client's header: its value, the last, counts.
		{[]string{"127.0.0.1"}, "critical, sheddable", http.StatusServiceUnavailable},
		{[]string{"127.0.0.1"}, "sheddable,critical", http.StatusOK},
	} {
		prio, err := PriorityHeader("X-Priority", &PriorityOptions{TrustedProxies: tt.trusted})
		if err != nil {
			t.Fatal(err)
		}
		e := slotEnv(t, fakeSlots(t), nil, &Options{Shed: shed, Priority: prio}, okHandler)
		if r := e.get("/", "X-Priority", tt.value); r.status != tt.status {
			t.Errorf("trusted %v, X-Priority %q: %d, want %d", tt.trusted, tt.value, r.status, tt.status)
		}
	}
}

// A shedding rule that sets neither Capacity nor Workers, or a bad
// Workers, is refused by New with an error that says so and names the
// rule by its place in Options.Shed. It said "in-flight rule 1 ... in-flight
// max 0" behind an in-flight rule: neither what the rule is nor what it
// lacks.
func TestShedConfigMessages(t *testing.T) {
	t.Parallel()
	store := fakeSlots(t)
	lim := sluice.Concurrent(10, time.Minute)
	inFlight := []InFlightRule{{Name: "per-key", Limit: lim, Key: Global()}}
	for _, tt := range []struct {
		name string
		opts Options
		want []string
	}{
		{"neither", Options{InFlight: inFlight, Shed: []ShedRule{{Name: "ok", Workers: 1}, {Name: "s"}}},
			[]string{`shed rule 1: `, `"s": neither Capacity (the fleet's) nor Workers (this process's) is set`}},
		{"both", Options{InFlight: inFlight, Shed: []ShedRule{{Name: "s", Capacity: lim, Workers: 4}}},
			[]string{`shed rule 0: `, `"s": set Capacity or Workers, not both`}},
		{"workers", Options{InFlight: inFlight, Shed: []ShedRule{{Name: "s", Workers: -1}}},
			[]string{`shed rule 0: `, `"s": sluice: invalid limit: Workers -1 outside 1..`}},
		{"in-flight", Options{InFlight: append(inFlight, InFlightRule{Name: "a", Key: Global()}), Shed: []ShedRule{{Name: "s", Workers: 1}}},
			[]string{`in-flight rule 1: `, `"a": sluice: invalid limit: in-flight max 0`}},
	} {
		_, err := New(store, nil, &tt.opts)
		if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrInvalidLimit) && tt.name != "both" {
			t.Errorf("%s: %v, want ErrInvalidConfig and sluice.ErrInvalidLimit", tt.name, err)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not say %q", tt.name, err, w)
			}
		}
	}
}

func TestInFlightConfigErrors(t *testing.T) {
	t.Parallel()
	store := fakeSlots(t)
	lim := sluice.Concurrent(10, time.Minute)
	for _, tt := range []struct {
		name string
		opts Options
		also error
	}{
		{"no key", Options{InFlight: []InFlightRule{{Name: "a", Limit: lim}}}, nil},
		{"bad limit", Options{InFlight: []InFlightRule{{Name: "a", Limit: sluice.Concurrent(0, time.Minute), Key: Global()}}}, sluice.ErrInvalidLimit},
		{"zero hold", Options{InFlight: []InFlightRule{{Name: "a", Limit: sluice.Concurrent(1, 0), Key: Global()}}}, sluice.ErrInvalidLimit},
		{"bad reserve", Options{Shed: []ShedRule{{Name: "s", Capacity: lim, Reserve: sluice.Reserve{Critical: 0.7, Normal: 0.7}}}}, sluice.ErrInvalidPriority},
		{"both", Options{Shed: []ShedRule{{Name: "s", Capacity: lim, Workers: 4}}}, nil},
		{"neither", Options{Shed: []ShedRule{{Name: "s"}}}, sluice.ErrInvalidLimit},
		{"workers", Options{Shed: []ShedRule{{Name: "s", Workers: -1}}}, sluice.ErrInvalidLimit},
		{"same name", Options{InFlight: []InFlightRule{{Name: "a", Limit: lim, Key: Global()}}, Shed: []ShedRule{{Name: "a", Workers: 4}}}, nil},
	} {
		if _, err := New(store, nil, &tt.opts); !errors.Is(err, ErrInvalidConfig) || tt.also != nil && !errors.Is(err, tt.also) {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
	// A name taken by a rate rule.
	if _, err := New(store, []Rule{{Name: "a", Limit: sluice.PerMinute(1), Key: Global()}}, &Options{InFlight: []InFlightRule{{Name: "a", Limit: lim, Key: Global()}}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a name shared with a rate rule: %v", err)
	}
	// A store without slots.
	if _, err := New(noSlots{store}, nil, &Options{InFlight: []InFlightRule{{Name: "a", Limit: lim, Key: Global()}}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("a store without slots: %v", err)
	}
	// Worker rules need no slots on the store.
	if _, err := New(noSlots{store}, nil, &Options{Shed: []ShedRule{{Name: "w", Workers: 4}}}); err != nil {
		t.Errorf("worker rule on a store without slots: %v", err)
	}
	for _, def := range []string{"urgent", "Critical"} {
		if _, err := PriorityHeader("X-Priority", &PriorityOptions{Default: def}); !errors.Is(err, sluice.ErrInvalidPriority) {
			t.Errorf("default %q: %v", def, err)
		}
		if _, err := PriorityFrom(Global(), def); !errors.Is(err, sluice.ErrInvalidPriority) {
			t.Errorf("PriorityFrom default %q: %v", def, err)
		}
	}
	if _, err := PriorityHeader("X-Priority", &PriorityOptions{TrustedProxies: []string{"not an address"}}); err == nil {
		t.Error("a bad trusted proxy was accepted")
	}
}

// A weight out of range is a key error, answered 500, and frees nothing.
func TestInFlightBadWeight(t *testing.T) {
	t.Parallel()
	rules := []InFlightRule{{Name: "w", Limit: sluice.Concurrent(4, time.Minute), Key: Global(), Weight: func(*http.Request) int64 { return 5 }}}
	e := slotEnv(t, fakeSlots(t), nil, &Options{InFlight: rules}, okHandler)
	if r := e.get("/"); r.status != http.StatusInternalServerError {
		t.Errorf("weight 5 of 4: %d, want 500", r.status)
	}
}

// noSlots is a store that keeps no in-flight slots.
type noSlots struct{ sluice.Store }

// A client that goes away ends its request's context; the handler returns
// and the slot is released all the same: the release does not run on the
// cancelled context (on Redis it would fail, and the slot stay held for
// its hour).
func TestInFlightReleaseWhenClientGone(t *testing.T) {
	t.Parallel()
	stores := map[string]sluice.Store{"memory": fakeSlots(t)}
	stores["redis"] = middlewaretest.Redis(t, nil)
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			returned := make(chan struct{}, 1)
			entered := make(chan struct{}, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/wait" {
					entered <- struct{}{}
					<-r.Context().Done()
					returned <- struct{}{}
				}
			})
			e := slotEnv(t, store, nil, &Options{InFlight: oneAtATime}, h)
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/wait", nil)
			go func() {
				<-entered
				cancel()
			}()
			if _, err := e.srv.Client().Do(req); !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled request: %v", err)
			}
			<-returned
			// The release runs after the handler returns: give it a moment.
			var status int
			for range 100 {
				if status = e.get("/").status; status == 200 {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if status != 200 {
				t.Errorf("after the client went away: %d, want 200 (slot released)", status)
			}
		})
	}
}

// The shedding test: capacity 100 in flight, 20% reserved for
// critical requests and 30% for normal ones, every priority offering 3×
// the capacity with equal hold times. At every instant sheddable requests
// hold at most 50 and sheddable plus normal at most 80, and no critical
// request is refused while fewer than 100 are in use.
var (
	shedCapacity = int64(100)
	shedReserve  = sluice.Reserve{Critical: 0.2, Normal: 0.3}
)

const shedHold = 50 * time.Millisecond

func TestShedding(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	runShedding(t, 3, 3*time.Second, func() sluice.Store { return store }, []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(shedCapacity, time.Minute), Reserve: shedReserve}})
}

// Worker utilisation shedding: the same thresholds over one process's own
// count, no store.
func TestWorkerShedding(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	runShedding(t, 1, 3*time.Second, func() sluice.Store { return store }, []ShedRule{{Name: "workers", Workers: shedCapacity, Reserve: shedReserve}})
}

// On real Redis, three middlewares (a fleet's processes, each with its
// own client) share the capacity.
func TestFleetSheddingRedis(t *testing.T) {
	race.SkipTiming(t) // 900 clients: a load test, run without the detector
	t.Parallel()
	prefix := redistest.Prefix(t)
	runShedding(t, 3, 2*time.Second, func() sluice.Store {
		return redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: prefix})
	}, []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(shedCapacity, time.Minute), Reserve: shedReserve}})
}

// shedRun is the handler and observer of a shedding test: it counts the
// requests of each priority in its handlers, under one lock so that every
// entry sees an exact snapshot, and the store's count at each critical
// refusal.
type shedRun struct {
	middlewaretest.Decisions
	mu       sync.Mutex
	in       [3]int64 // requests of each priority in a handler now
	max      [3]int64 // the most seen: sheddable; sheddable+normal; all
	bad      []string
	entries  int64
	served   [3]int64
	refused  [3]int64
	critMin  int64 // the least in use at a critical refusal
	critDeny int64
	failed   error
}

func (s *shedRun) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p, _ := sluice.ParsePriority(r.Header.Get("X-Priority"))
	s.mu.Lock()
	s.in[p]++
	s.entries++
	snap := [3]int64{s.in[2], s.in[2] + s.in[1], s.in[2] + s.in[1] + s.in[0]}
	for i, v := range snap {
		s.max[i] = max(s.max[i], v)
	}
	if snap[0] > 50 || snap[1] > 80 || snap[2] > shedCapacity {
		if len(s.bad) < 10 {
			s.bad = append(s.bad, fmt.Sprintf("entry %d: sheddable %d, +normal %d, all %d", s.entries, snap[0], snap[1], snap[2]))
		}
	}
	s.mu.Unlock()
	time.Sleep(shedHold)
	s.mu.Lock()
	s.in[p]--
	s.mu.Unlock()
}

func (s *shedRun) ObserveSlot(e sluice.SlotEvent) {
	if e.Op == sluice.SlotAcquire && e.Outcome == sluice.OutcomeShed && e.Priority == sluice.PriorityCritical {
		s.mu.Lock()
		s.critDeny++
		s.critMin = min(s.critMin, e.Decision.InUse)
		s.mu.Unlock()
	}
}

// more reports whether the clients go on: until the deadline, and past it
// (by at most 10s) until shedding has engaged, which a slow machine (or the
// race detector) may delay.
func (s *shedRun) more(deadline time.Time) bool {
	now := time.Now()
	if now.Before(deadline) {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[2] == 0 && now.Before(deadline.Add(10*time.Second))
}

// count records a client's answer, or its failure.
func (s *shedRun) count(p int, status int, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case err != nil:
		s.failed = err
	case status == http.StatusOK:
		s.served[p]++
	case status == http.StatusServiceUnavailable:
		s.refused[p]++
	default:
		s.failed = fmt.Errorf("status %d", status)
	}
}

// runShedding serves servers middlewares (each over the store newStore
// returns) and offers each priority 3× the capacity for run: 300 clients
// per priority, spread over the servers, each sending its next request
// when the last ends (or a hold after a refusal).
func runShedding(t *testing.T, servers int, run time.Duration, newStore func() sluice.Store, shed []ShedRule) {
	s := &shedRun{}
	s.critMin = 1 << 62
	prio, err := PriorityHeader("X-Priority", &PriorityOptions{TrustedProxies: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	urls := make([]string, servers)
	for i := range urls {
		m, err := New(newStore(), nil, &Options{Shed: shed, Priority: prio, Observer: s})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(m.Handler(s))
		t.Cleanup(srv.Close)
		urls[i] = srv.URL
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2000, MaxIdleConnsPerHost: 1000}}
	t.Cleanup(client.CloseIdleConnections)
	deadline := time.Now().Add(run)
	var wg sync.WaitGroup
	for p := range 3 {
		name := sluice.Priority(p).String()
		for c := range 3 * shedCapacity {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for s.more(deadline) {
					req, _ := http.NewRequest("GET", urls[int(c)%servers], nil)
					req.Header.Set("X-Priority", name)
					resp, err := client.Do(req)
					if err != nil {
						s.count(p, 0, err)
						return
					}
					resp.Body.Close()
					s.count(p, resp.StatusCode, nil)
					if resp.StatusCode != http.StatusOK {
						time.Sleep(shedHold)
					}
				}
			}()
		}
	}
	wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed != nil {
		t.Fatal(s.failed)
	}
	for _, b := range s.bad {
		t.Error(b)
	}
	// The store counts a refused critical request's own decision exactly;
	// the handlers' count lags it, hence the tolerance of 2 slots.
	if s.critDeny > 0 && s.critMin < shedCapacity-2 {
		t.Errorf("a critical request was refused with %d in use (< %d)", s.critMin, shedCapacity)
	}
	t.Logf("most in handlers: sheddable %d, sheddable+normal %d, all %d; served/refused critical %d/%d, normal %d/%d, sheddable %d/%d; critical refusals at in-use ≥ %d",
		s.max[0], s.max[1], s.max[2], s.served[0], s.refused[0], s.served[1], s.refused[1], s.served[2], s.refused[2], s.critMin)
	// Handlers see fewer than the store holds (a slot is taken before the
	// handler and given back after it), so whether shedding engaged is
	// the store's word: sheddable requests were refused.
	if s.refused[2] == 0 {
		t.Error("no sheddable request was refused: the load never reached the shedding regime, the test proved nothing")
	}
}

// What holding slots costs a request served in process: a worker rule (a
// counter, no store) and a per-key rule on the memory store.
func BenchmarkInFlight(b *testing.B) {
	store := memory.New(nil)
	defer store.Close()
	for name, opts := range map[string]*Options{
		"worker":  {Shed: []ShedRule{{Name: "w", Workers: sluice.MaxInFlight}}},
		"per-key": {InFlight: []InFlightRule{{Name: "k", Limit: sluice.Concurrent(sluice.MaxInFlight, time.Minute), Key: Global()}}},
	} {
		b.Run(name, func(b *testing.B) {
			m, err := New(store, nil, opts)
			if err != nil {
				b.Fatal(err)
			}
			h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			w, r := httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
}

// One lease.Store serves a leased rate rule and an in-flight rule: the
// slots pass through it to the store underneath, unleased.
func TestInFlightOverLease(t *testing.T) {
	t.Parallel()
	mem := fakeSlots(t)
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Size: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ls.Close(context.Background()) })
	g := newGate()
	e := slotEnv(t, ls, []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}, &Options{InFlight: oneAtATime}, g)
	done := e.background()
	<-g.entered
	if r := e.get("/"); r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("second request while the first holds: %d, want 429 with Retry-After", r.status)
	}
	close(g.leave)
	if code := <-done; code != 200 {
		t.Fatalf("first request: %d", code)
	}
	done = e.background()
	if code := <-done; code != 200 {
		t.Errorf("after the first returned: %d, want 200", code)
	}
	if st := ls.Stats(); st.Grants == 0 {
		t.Errorf("lease stats %+v: the rate rule never asked for a grant", st)
	}
}

// A rule's own Match or Key that panics releases the slots the request had
// taken: a Workers count would otherwise be lost for the process's life,
// a store slot held for its Hold.
func TestInFlightRuleFuncPanics(t *testing.T) {
	store := memory.New(nil)
	defer store.Close()
	boom := func(r *http.Request) bool { return r.URL.Path == "/boom" }
	for _, tc := range []struct {
		name string
		opts *Options
		want int
	}{
		{"match", &Options{Shed: []ShedRule{
			{Name: "workers", Workers: 1},
			{Name: "fleet", Capacity: sluice.Concurrent(100, time.Minute), Match: func(r *http.Request) bool {
				if boom(r) {
					panic("bug in Match")
				}
				return true
			}},
		}}, http.StatusOK},
		{"key", &Options{InFlight: []InFlightRule{
			{Name: "one", Limit: sluice.Concurrent(1, time.Hour), Key: Global()},
			{Name: "two", Limit: sluice.Concurrent(10, time.Hour), Key: func(r *http.Request) (string, error) {
				if boom(r) {
					panic("bug in Key")
				}
				return "k", nil
			}},
		}}, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(store, nil, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			defer srv.Close()
			srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the panic's line
			if resp, err := srv.Client().Get(srv.URL + "/boom"); err == nil {
				resp.Body.Close()
			}
			for i := range 3 {
				resp, err := srv.Client().Get(srv.URL + "/")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != tc.want {
					t.Fatalf("request %d after the panic: %d, want %d", i, resp.StatusCode, tc.want)
				}
			}
		})
	}
}

type flushErrWriter struct{ *httptest.ResponseRecorder }

var errFlushGone = errors.New("client gone")

func (w flushErrWriter) FlushError() error { return errFlushGone }

// A handler holding slots learns of a failed flush, as without the
// middleware.
func TestInFlightFlushError(t *testing.T) {
	store := memory.New(nil)
	defer store.Close()
	m, err := New(store, nil, &Options{InFlight: []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, time.Minute), Key: Global()}}})
	if err != nil {
		t.Fatal(err)
	}
	var got error
	m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = http.NewResponseController(w).Flush()
	})).ServeHTTP(flushErrWriter{httptest.NewRecorder()}, httptest.NewRequest("GET", "/", nil))
	if !errors.Is(got, errFlushGone) {
		t.Errorf("Flush() = %v, want %v", got, errFlushGone)
	}
}

// sluice_inflight_held drops a request whose slot the store no longer
// holds (here its hold passed on the store's clock, between two extends)
// when an extend finds it lost, not when the request returns; the extend
// says "not held" and the next request is admitted.
func TestInFlightHeldGaugeLost(t *testing.T) {
	clk := storetest.NewClock(t0)
	store := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	defer store.Close()
	var mu sync.Mutex
	held := map[string]int64{}
	lost := make(chan struct{}, 1)
	obs := slotObserverFunc(func(e sluice.SlotEvent) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case e.Op == sluice.SlotAcquire && e.Outcome == sluice.OutcomeAllowed:
			held[e.Policy] += e.Weight
		case e.Op == sluice.SlotRelease, e.Op == sluice.SlotExpire:
			held[e.Policy] -= e.Weight
		case e.Op == sluice.SlotExtend && e.Outcome == sluice.OutcomeDenied:
			lost <- struct{}{}
		}
	})
	m, err := New(store, nil, &Options{Observer: obs,
		InFlight: []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, 150*time.Millisecond), Key: Global()}}})
	if err != nil {
		t.Fatal(err)
	}
	release, entered := make(chan struct{}), make(chan struct{}, 2)
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { entered <- struct{}{}; <-release })))
	defer srv.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release) // first: the handlers return
	get := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if resp, err := srv.Client().Get(srv.URL); err == nil {
				resp.Body.Close()
			}
		}()
	}
	get()
	<-entered
	time.Sleep(300 * time.Millisecond) // extended, on the store's clock too
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("past two holds: %d, want 429 (the slot extended)", resp.StatusCode)
	}
	clk.Advance(time.Second)
	select {
	case <-lost:
	case <-time.After(5 * time.Second):
		t.Fatal("no extend found the slot lost")
	}
	get() // admitted: the store holds the first no more
	<-entered
	mu.Lock()
	if held["one"] != 1 {
		t.Errorf("held %d on a limit of 1, the first slot lost, want 1", held["one"])
	}
	mu.Unlock()
	release <- struct{}{}
	release <- struct{}{}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if held["one"] != 0 {
		t.Errorf("held %d after both returned, want 0", held["one"])
	}
}

// slotObserverFunc is a sluice.Observer that hands its slot events to f.
type slotObserverFunc func(sluice.SlotEvent)

func (slotObserverFunc) ObserveDecision(sluice.DecisionEvent) {}
func (slotObserverFunc) ObserveStore(sluice.StoreEvent)       {}
func (slotObserverFunc) ObserveBreaker(sluice.BreakerEvent)   {}
func (f slotObserverFunc) ObserveSlot(e sluice.SlotEvent)     { f(e) }

// A request that outlives its hold keeps its slot, the middleware
// extending it while the handler runs, and so does a hijacked connection
// until it is closed. Two servers, each on its own resilient store over
// one Redis: A's request (or hijacked connection) holds the one slot for
// 2.5 holds, and B is refused all along; once it ends, B is admitted.
func TestInFlightExtendedPastHold(t *testing.T) {
	t.Parallel()
	const hold = 600 * time.Millisecond
	for _, hijack := range []bool{false, true} {
		name := map[bool]string{false: "slow handler", true: "hijacked connection"}[hijack]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			rules := []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, hold), Key: Global()}}
			serveOn := func(h http.Handler) *env {
				store, err := resilient.New(redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: prefix}), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { store.Close() })
				return slotEnv(t, store, nil, &Options{InFlight: rules}, h)
			}
			entered, leave, ended := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
			var once sync.Once
			letGo := func() { once.Do(func() { close(leave) }) }
			a := serveOn(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/hold" {
					return
				}
				if !hijack {
					entered <- struct{}{}
					<-leave
					close(ended)
					return
				}
				c, rw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
				rw.Flush()
				entered <- struct{}{}
				go func() { // the connection outlives the handler
					<-leave
					c.Close()
					close(ended)
				}()
			}))
			b := serveOn(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			conn, err := net.Dial("tcp", a.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			defer letGo() // also on a failure: the servers' cleanups wait for the handler
			conn.Write([]byte("GET /hold HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"))
			<-entered
			for end := time.Now().Add(hold * 5 / 2); time.Now().Before(end); time.Sleep(hold / 4) {
				if r := b.get("/"); r.status != http.StatusTooManyRequests {
					t.Fatalf("B while A holds: %d, want 429 (A's slot lost)", r.status)
				}
			}
			letGo()
			<-ended
			if hijack {
				bufio.NewReader(conn).ReadString('\n')
			}
			var status int
			for range 100 { // the release runs after the handler returns
				if status = b.get("/").status; status == http.StatusOK {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if status != http.StatusOK {
				t.Errorf("B after A ended: %d, want 200", status)
			}
		})
	}
}

// A release that fails (Redis down as the handler returns) is sent again
// in the background: once Redis is back, the slot frees within seconds,
// not at its 30s hold.
func TestInFlightFailedReleaseRetried(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always") // the slot survives a restart
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &middlewaretest.Slots{}
	entered, leave := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(leave) }) }
	defer letGo()
	e := slotEnv(t, store, nil, &Options{Observer: obs,
		InFlight: []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, 30*time.Second), Key: Global()}}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				entered <- struct{}{}
				<-leave
			}
		}))
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"))
	<-entered
	srv.Stop()
	letGo() // its release fails: Redis is down
	for end := time.Now().Add(5 * time.Second); obs.Get("one/release/error") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no failed release")
		}
	}
	time.Sleep(500 * time.Millisecond) // tries fail meanwhile
	srv.Start(t)
	back := time.Now()
	status := 0
	for time.Since(back) < 10*time.Second {
		if status = e.get("/").status; status == http.StatusOK {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status != http.StatusOK {
		t.Fatalf("10s after Redis came back: %d, want 200 (the failed release sent again)", status)
	}
	t.Logf("slot free %v after Redis came back", time.Since(back).Round(10*time.Millisecond))
	if n := obs.Get("one/release/allowed"); n != 2 {
		t.Errorf("%d releases reported freed, want 2 (the one sent again, the second request's)", n)
	}
}

// Requests held at once, each on its own key, are each extended while
// they run (a second request on a key is refused past the hold), no slot
// is reported expired, and no extend comes after the releases.
func TestInFlightExtendsWhileHeldOnly(t *testing.T) {
	t.Parallel()
	const hold, n = 300 * time.Millisecond, 20
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	obs := &middlewaretest.Slots{}
	m, err := New(store, nil, &Options{Observer: obs,
		InFlight: []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, hold), Key: Header("X-Client")}}})
	if err != nil {
		t.Fatal(err)
	}
	leave := make(chan struct{})
	var entered, done sync.WaitGroup
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { entered.Done(); <-leave }))
	serve := func(i int) int {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, newBenchRequest(fmt.Sprint(i)))
		return w.Code
	}
	entered.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			serve(i)
		}()
	}
	entered.Wait()
	func() {
		defer close(leave)
		time.Sleep(hold * 5 / 2)
		for i := range n {
			if code := serve(i); code != http.StatusTooManyRequests {
				t.Errorf("a second request on key %d 2.5 holds in: %d, want 429", i, code)
			}
		}
	}()
	done.Wait()
	extends := obs.Get("one/extend/allowed")
	if extends < 5*n {
		t.Errorf("%d extends of %d requests held 2.5 holds, want at least %d", extends, n, 5*n)
	}
	if e := obs.Get("one/expire/allowed"); e != 0 {
		t.Errorf("%d slots reported expired, extended all along", e)
	}
	time.Sleep(hold)
	if got := obs.Get("one/extend/allowed") + obs.Get("one/extend/denied") + obs.Get("one/extend/error"); got != extends {
		t.Errorf("%d extends after the releases", got-extends)
	}
	if r := obs.Get("one/release/allowed"); r != n {
		t.Errorf("%d releases, want %d", r, n)
	}
}
