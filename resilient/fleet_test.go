package resilient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// TestMain lets the test binary act as one more fleet member, in a process
// of its own: SLUICE_FLEET_MEMBER names the Redis address and prefix, and
// the member leaves when its standard input closes.
func TestMain(m *testing.M) {
	if spec := os.Getenv("SLUICE_FLEET_MEMBER"); spec != "" {
		os.Exit(fleetMember(spec))
	}
	os.Exit(m.Run())
}

func fleetMember(spec string) int {
	addr, prefix, _ := strings.Cut(spec, " ")
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	f, err := NewFleet(redisstore.New(client, &redisstore.Options{Prefix: prefix}).Membership(), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	fmt.Println(f.Member())
	io.Copy(io.Discard, os.Stdin)
	return 0
}

// script is a Membership that answers from a list.
type script struct {
	mu      sync.Mutex
	answers []int // a negative count fails
	member  string
	ttl     time.Duration
}

func (s *script) Heartbeat(_ context.Context, member string, ttl time.Duration) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.member, s.ttl = member, ttl
	if len(s.answers) == 0 {
		return 0, errors.New("script: no answer")
	}
	n := s.answers[0]
	s.answers = s.answers[1:]
	if n < 0 {
		return 0, errors.New("dial tcp: connection refused")
	}
	return n, nil
}

// The size grows at once, falls only after Shrink of smaller counts, and is
// kept while the registry is away (which restarts the wait); each change is
// one log line and one OnChange call.
func TestFleetSize(t *testing.T) {
	t.Parallel()
	const fail = -1
	steps := []struct {
		advance   time.Duration
		count     int
		wantSize  int
		wantReach bool
	}{
		{time.Second, 4, 4, true},                           // grows at once
		{time.Second, 3, 4, true},                           // 0s below
		{20 * time.Second, 2, 4, true},                      // 20s below
		{5 * time.Second, fail, 4, false},                   // kept while away; the wait restarts
		{time.Second, 3, 4, true},                           // 0s below
		{29 * time.Second, 2, 4, true},                      // 29s below
		{time.Second, 2, 3, true},                           // 30s: the largest count of the wait
		{10 * time.Second, 1, 3, true},                      // 0s below
		{10 * time.Second, 5, 5, true},                      // grows at once
		{60 * time.Second, fail, 5, false},                  // kept however long
		{60 * time.Second, fail, 5, false},                  //
		{time.Second, 2, 5, true},                           // back: the wait starts now
		{29*time.Second + 999*time.Millisecond, 2, 5, true}, //
		{time.Millisecond, 2, 2, true},                      //
	}
	reg := &script{answers: []int{2}}
	for _, st := range steps {
		reg.answers = append(reg.answers, st.count)
	}
	clk := storetest.NewClock(t0)
	log := &lines{}
	var events []FleetEvent
	f, err := NewFleet(reg, &FleetOptions{
		Member: "m1", Refresh: time.Hour, TTL: 2 * time.Hour, Shrink: 30 * time.Second, Clock: clk.Now, Logger: slog.New(log),
		OnChange: func(e FleetEvent) { events = append(events, e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if got, want := f.Size(), 2; got != want {
		t.Fatalf("size at start = %d, want %d", got, want)
	}
	for i, st := range steps {
		clk.Advance(st.advance)
		f.beat(clk.Now())
		if got := f.Size(); got != st.wantSize {
			t.Errorf("step %d (count %d): size %d, want %d", i, st.count, got, st.wantSize)
		}
		if got := f.reachable; got != st.wantReach {
			t.Errorf("step %d: reachable %v, want %v", i, got, st.wantReach)
		}
	}
	if reg.member != "m1" || reg.ttl != 2*time.Hour {
		t.Errorf("registered %q for %v", reg.member, reg.ttl)
	}
	wantLines := []string{
		"resilient: fleet size changed from=1 to=2 members=2", // the first count, in NewFleet
		"resilient: fleet size changed from=2 to=4 members=4",
		"resilient: fleet registry lost; keeping the fleet size size=4",
		"resilient: fleet registry back members=3",
		"resilient: fleet size changed from=4 to=3 members=2",
		"resilient: fleet size changed from=3 to=5 members=5",
		"resilient: fleet registry lost; keeping the fleet size size=5",
		"resilient: fleet registry back members=2",
		"resilient: fleet size changed from=5 to=2 members=2",
	}
	if got := log.all(); !equal(got, wantLines) {
		t.Errorf("log lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(wantLines, "\n"))
	}
	wantEvents := []FleetEvent{
		{2, 2, true, true}, {4, 4, true, true}, {4, 2, false, true}, {4, 3, true, true}, {3, 2, true, true}, {5, 5, true, true},
		{5, 5, false, true}, {5, 2, true, true}, {2, 2, true, true},
	}
	if !equal(events, wantEvents) {
		t.Errorf("events %v, want %v", events, wantEvents)
	}
}

// An explicit size wins over every count; the process still registers.
func TestFleetExplicitSize(t *testing.T) {
	t.Parallel()
	reg := &script{answers: []int{3, 9, 1}}
	f, err := NewFleet(reg, &FleetOptions{Size: 7, Refresh: time.Hour, TTL: 2 * time.Hour, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	for i := range 3 {
		if got, want := f.Size(), 7; got != want {
			t.Errorf("beat %d: size %d, want %d", i, got, want)
		}
		f.beat(t0)
	}
	if reg.member == "" {
		t.Error("the process did not register")
	}
}

// Unreachable at start: the explicit size, else Default, else 1, with a
// warning only when no explicit size says what to assume.
func TestFleetUnreachableAtStart(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		opts     FleetOptions
		want     int
		wantWarn bool
	}{
		{"default", FleetOptions{}, DefaultFleetSize, true},
		{"Default set", FleetOptions{Default: 4}, 4, true},
		{"explicit", FleetOptions{Size: 6, Default: 4}, 6, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			log := &lines{}
			o := tt.opts
			o.Refresh, o.TTL, o.Logger = time.Hour, 2*time.Hour, slog.New(log)
			f, err := NewFleet(&script{}, &o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			if got := f.Size(); got != tt.want {
				t.Errorf("size %d, want %d", got, tt.want)
			}
			warned := len(log.all()) == 1 && strings.HasPrefix(log.all()[0], "resilient: fleet registry unreachable at start")
			if warned != tt.wantWarn || len(log.all()) > 1 {
				t.Errorf("log %q, want a warning: %v", log.all(), tt.wantWarn)
			}
			// Not counted by anyone: no share without an explicit size.
			if got, want := f.Counted(), tt.opts.Size > 0; got != want {
				t.Errorf("counted before the registry answered: %v, want %v", got, want)
			}
			// Reached later: one line says so, and the count applies.
			f.reg.(*script).answers = []int{3}
			f.beat(time.Now())
			if !f.Counted() {
				t.Error("not counted once the registry answered")
			}
			if got, want := f.Size(), max(3, tt.want); tt.opts.Size == 0 && got != want {
				t.Errorf("size once reached %d, want %d", got, want)
			}
			if got := log.all(); !strings.HasPrefix(got[len(got)-1], "resilient: fleet ") || !slices.ContainsFunc(got, func(l string) bool {
				return strings.HasPrefix(l, "resilient: fleet registry back")
			}) {
				t.Errorf("log once reached %q, want a line saying so", got)
			}
		})
	}
}

func TestFleetOptions(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		reg  Membership
		opts *FleetOptions
	}{
		{"nil membership", nil, nil},
		{"negative size", &script{}, &FleetOptions{Size: -1}},
		{"negative default", &script{}, &FleetOptions{Default: -1}},
		{"negative refresh", &script{}, &FleetOptions{Refresh: -time.Second}},
		{"TTL not above refresh", &script{}, &FleetOptions{Refresh: time.Second, TTL: time.Second}},
	} {
		if _, err := NewFleet(tt.reg, tt.opts); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: %v, want ErrInvalidOptions", tt.name, err)
		}
	}
	if _, err := New(newFlaky(nil), &Options{Nodes: -1}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("negative Nodes: %v", err)
	}
	var zero Fleet
	if zero.Size() != 0 || zero.Close() != nil {
		t.Error("zero Fleet: want size 0 and a Close that does nothing")
	}
	s, err := New(newFlaky(nil), &Options{Fleet: &zero, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.fleetSize(); got != 1 {
		t.Errorf("a Store over a zero Fleet divides by %d, want 1", got)
	}
}

// Four members on one Redis count four; a fifth, in a process of its own,
// is counted by the others within 5s; a member under another prefix is
// not; with Redis stopped every size holds, and one line says so.
func TestFleetDiscoveryRedis(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	prefix := redistest.Prefix(t)
	newMember := func(prefix string, log *lines) *Fleet {
		client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		t.Cleanup(func() { client.Close() })
		f, err := NewFleet(redisstore.New(client, &redisstore.Options{Prefix: prefix}).Membership(),
			&FleetOptions{Logger: slog.New(log), Shrink: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	logs := make([]*lines, 4)
	fleet := make([]*Fleet, 4)
	for i := range fleet {
		logs[i] = &lines{}
		fleet[i] = newMember(prefix, logs[i])
	}
	other := newMember("other:"+prefix, &lines{})
	waitSizes := func(what string, want int, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			ok := true
			for _, f := range fleet {
				ok = ok && f.Size() == want
			}
			if ok {
				return time.Since(start)
			}
			if time.Since(start) > within {
				sizes := []int{}
				for _, f := range fleet {
					sizes = append(sizes, f.Size())
				}
				t.Fatalf("%s: sizes %v after %v, want all %d", what, sizes, within, want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitSizes("four members", 4, 5*time.Second)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "SLUICE_FLEET_MEMBER="+srv.Addr+" "+prefix)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	redistest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	took := waitSizes("a fifth member joins", 5, 5*time.Second)
	t.Logf("the fifth member counted by all four within %v", took)
	if got := other.Size(); got != 1 {
		t.Errorf("a member under another prefix counts %d, want 1", got)
	}

	srv.Stop()
	time.Sleep(4 * time.Second) // past the TTL, a few refreshes and Shrink
	waitSizes("Redis stopped", 5, 0)
	for i, l := range logs {
		lost := 0
		for _, line := range l.all() {
			if strings.HasPrefix(line, "resilient: fleet registry lost") {
				lost++
			}
		}
		if lost != 1 {
			t.Errorf("member %d logged the loss %d times: %q", i, lost, l.all())
		}
	}
}

var _ Membership = (*redisstore.Membership)(nil)

// A process cut off from the registry while the others are not is counted
// by them for TTL after its last heartbeat and for Shrink more: its
// fallback takes a share that long, measured from when that heartbeat was
// sent, and then refuses (as FailClosed) until the registry answers. One
// line each way, and an OnChange event.
func TestFleetCounted(t *testing.T) {
	t.Parallel()
	reg := &script{answers: []int{3}}
	clk := storetest.NewClock(t0)
	log := &lines{}
	var events []FleetEvent
	f, err := NewFleet(reg, &FleetOptions{
		Refresh: time.Hour, TTL: 2 * time.Hour, Shrink: time.Minute, Clock: clk.Now, Logger: slog.New(log),
		OnChange: func(e FleetEvent) { events = append(events, e) },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	s := newStore(t, storetest.Down{}, &Options{Fleet: f, Logger: discard, Clock: clk.Now})
	source := func() sluice.Source {
		t.Helper()
		d, err := s.Take(context.Background(), "k", sluice.PerSecond(30), 1)
		if err != nil {
			t.Fatal(err)
		}
		return d.Source
	}
	if !f.Counted() || source() != sluice.SourceFallback {
		t.Fatal("not counted, or no share, after an answered heartbeat")
	}
	// The registry stops answering; the counted time runs from t0, when
	// the last answered heartbeat was sent.
	clk.Advance(2*time.Hour + time.Minute - time.Microsecond)
	f.beat(clk.Now())
	if !f.Counted() || source() != sluice.SourceFallback {
		t.Fatal("not counted, or no share, just before TTL + Shrink")
	}
	clk.Advance(time.Microsecond)
	f.beat(clk.Now())
	if f.Counted() || source() != sluice.SourceFailClosed {
		t.Fatal("counted, or a share, at TTL + Shrink without a heartbeat")
	}
	reg.answers = []int{2}
	clk.Advance(time.Second)
	f.beat(clk.Now())
	if !f.Counted() || source() != sluice.SourceFallback {
		t.Fatal("not counted, or no share, once the registry answered again")
	}
	got := strings.Join(log.all(), "\n")
	for _, want := range []string{
		"resilient: fleet registry unreachable for longer than the others count this process; FallbackLocal takes no share (refuses) until it answers",
		"resilient: fleet counts this process again",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no line %q in:\n%s", want, got)
		}
	}
	if n := len(events); n < 2 || events[n-2].Counted || !events[n-1].Counted {
		t.Errorf("events %v: want the last two to say not counted, then counted", events)
	}
}

// A slot the fallback granted while this process was counted is not
// extended once the fleet no longer counts it: its share is the others'
// now. It is freed, and the holder told it is lost.
func TestFleetUncountedSlotNotExtended(t *testing.T) {
	t.Parallel()
	reg := &script{answers: []int{3}}
	clk := storetest.NewClock(t0)
	f, err := NewFleet(reg, &FleetOptions{Refresh: time.Hour, TTL: 2 * time.Hour, Shrink: time.Minute, Clock: clk.Now, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	b := newFlaky(clk.Now)
	b.mode.Store(1) // the backend is down
	s := newStore(t, b, &Options{Fleet: f, Logger: discard, Clock: clk.Now})
	ctx := context.Background()
	l := sluice.Concurrent(30, 10*time.Minute)
	if d, err := s.Acquire(ctx, "k", l, 10, "h"); err != nil || !d.Allowed || d.Source != sluice.SourceFallback {
		t.Fatalf("Acquire while counted = %+v, %v", d, err)
	}
	for clk.Now().Sub(t0) < 2*time.Hour {
		clk.Advance(5 * time.Minute)
		f.beat(clk.Now())
		if ok, err := s.Extend(ctx, "k", l, "h"); !ok || err != nil {
			t.Fatalf("Extend while counted, at %v = %v, %v", clk.Now().Sub(t0), ok, err)
		}
	}
	clk.Advance(5 * time.Minute) // past TTL + Shrink since the last answered heartbeat
	f.beat(clk.Now())
	if f.Counted() {
		t.Fatal("still counted")
	}
	if ok, err := s.Extend(ctx, "k", l, "h"); ok || err != nil {
		t.Fatalf("Extend once not counted = %v, %v; want false: no share", ok, err)
	}
	if ok, err := s.Release(ctx, "k", "h"); ok {
		t.Fatalf("Release after the refused extend = %v, %v; want not held", ok, err)
	}
}

// A member that leaves (Fleet.Leave) is dropped from the others' size at
// their next heartbeat; one that goes silent (Close) is kept for Shrink,
// and a later member's leaving does not drop the silent one early: the
// size stays what every member that may still run needs.
func TestFleetLeaveRedis(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	client := redistest.Client(t)
	prefix := redistest.Prefix(t)
	join := func() *Fleet {
		t.Helper()
		f, err := NewFleet(redisstore.New(client, &redisstore.Options{Prefix: prefix}).Membership(),
			&FleetOptions{Refresh: 50 * time.Millisecond, TTL: 200 * time.Millisecond, Shrink: time.Minute, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	await := func(f *Fleet, want int, within time.Duration) time.Duration {
		t.Helper()
		start := time.Now()
		for f.Size() != want {
			if time.Since(start) > within {
				t.Fatalf("size %d after %v, want %d", f.Size(), within, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	ctx := context.Background()
	a, b := join(), join()
	await(a, 2, time.Second)
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	took := await(a, 1, 500*time.Millisecond) // within a few heartbeats, not Shrink
	t.Logf("the size fell %v after the leave", took.Round(time.Millisecond))

	c := join()
	await(a, 2, time.Second)
	c.Close() // silent: it may still run, so it stays counted
	d := join()
	await(a, 3, time.Second)
	if err := d.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // c's registration has lapsed, d's withdrawal is seen
	if got := a.Size(); got != 2 {
		t.Errorf("size %d after one member left and one went silent, want 2: the silent one is kept for Shrink", got)
	}
}

// A member that leaves and restarts under the same name (FleetOptions.
// Member) is counted at every heartbeat of the others: its old withdrawal
// must not hide the new registration, even for one refresh, or the size
// would dip below the members running (n ≥ N). The heartbeats are driven
// by hand, so each one is checked.
func TestFleetRestartSameNameRedis(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	prefix := redistest.Prefix(t)
	join := func(name string) *Fleet {
		t.Helper()
		f, err := NewFleet(redisstore.New(client, &redisstore.Options{Prefix: prefix}).Membership(),
			&FleetOptions{Member: name, Refresh: time.Hour, TTL: 2 * time.Hour, Shrink: time.Minute, Logger: discard})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	ctx := context.Background()
	expect := func(f *Fleet, want int, when string) {
		t.Helper()
		f.beat(time.Now())
		if got := f.Size(); got != want {
			t.Errorf("%s: %s's size %d, want %d", when, f.Member(), got, want)
		}
	}
	a, b, r := join("A"), join("B"), join("R")
	expect(a, 3, "all three up")

	// R leaves and is back before A's next heartbeat.
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	r = join("R")
	for i := range 3 {
		expect(a, 3, fmt.Sprintf("R left and restarted, heartbeat %d", i))
	}

	// R leaves, A sees it gone, then R is back: counted again, and still
	// counted when another member leaves later.
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	expect(a, 2, "R left")
	r = join("R")
	expect(a, 3, "R restarted")
	if err := b.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	expect(a, 2, "B left, R running")
	expect(r, 2, "B left, seen by R")
}

// A Deferred Fleet registers at Start, not before; one closed before it
// starts never registers, and its Close and Leave return.
func TestFleetDeferred(t *testing.T) {
	t.Parallel()
	reg := &script{answers: []int{1, 1}}
	f, err := NewFleet(reg, &FleetOptions{Refresh: time.Hour, TTL: 2 * time.Hour, Deferred: true, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	reg.mu.Lock()
	if reg.member != "" {
		t.Error("registered before Start")
	}
	reg.mu.Unlock()
	if f.Counted() {
		t.Error("counted before Start")
	}
	f.Start()
	f.Start() // once
	reg.mu.Lock()
	if reg.member == "" || len(reg.answers) != 1 {
		t.Errorf("after Start: member %q, %d answers left; want one heartbeat", reg.member, len(reg.answers))
	}
	reg.mu.Unlock()
	if !f.Counted() {
		t.Error("not counted after an answered registration")
	}
	f.Close()

	never := &script{answers: []int{1}}
	g, err := NewFleet(never, &FleetOptions{Deferred: true, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.Start() // after Close: nothing
	never.mu.Lock()
	defer never.mu.Unlock()
	if never.member != "" {
		t.Error("a Fleet closed before Start registered")
	}
}

// A zero redisstore.Membership (no client) is refused by NewFleet: it
// used to be accepted and only warn "registry unreachable", forever. A
// nil *Fleet answers as a zero one, where Size panicked. A Membership of
// a real Redis is accepted.
func TestFleetUnbuiltMembershipAndNil(t *testing.T) {
	t.Parallel()
	for name, reg := range map[string]Membership{
		"zero redisstore.Membership": &redisstore.Membership{},
		"nil *redisstore.Membership": (*redisstore.Membership)(nil),
		"of a Store without client":  redisstore.New(nil, nil).Membership(),
	} {
		if f, err := NewFleet(reg, &FleetOptions{Logger: discard}); !errors.Is(err, ErrInvalidOptions) || !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("NewFleet(%s) = %v, %v; want ErrInvalidOptions and ErrNoClient", name, f, err)
		}
	}
	var f *Fleet
	if f.Size() != 0 || !f.Counted() || f.Member() != "" || f.Close() != nil || f.Leave(context.Background()) != nil {
		t.Error("nil *Fleet: want size 0, counted, no member, Close and Leave doing nothing")
	}
	f.Start()
	s, err := New(newFlaky(nil), &Options{Fleet: f, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.fleetSize(); got != 1 {
		t.Errorf("a Store over a nil *Fleet divides by %d, want 1", got)
	}
	client := redistest.Client(t)
	real, err := NewFleet(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}).Membership(), &FleetOptions{Logger: discard})
	if err != nil {
		t.Fatalf("NewFleet over real Redis: %v", err)
	}
	defer real.Close()
	if real.Size() != 1 {
		t.Errorf("a fleet of one on real Redis: size %d", real.Size())
	}
}

// Close with a heartbeat under way on a Redis that does not answer cuts
// it: Leave then keeps its own context's bound (sluice serve gives it 2 s)
// instead of waiting for the heartbeat's Timeout first.
func TestFleetCloseCutsHeartbeat(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer client.Close()
	f, err := NewFleet(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}).Membership(),
		&FleetOptions{Refresh: 50 * time.Millisecond, TTL: time.Minute, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	f.Start()
	srv.Pause(t)
	defer srv.Resume(t)
	time.Sleep(200 * time.Millisecond) // a heartbeat is waiting on Redis
	start := time.Now()
	f.Close()
	if d := time.Since(start); d > time.Second {
		t.Errorf("Close took %v with a heartbeat under way; want it cut at once", d)
	}
}
