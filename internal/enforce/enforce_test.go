package enforce

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

func TestClosest(t *testing.T) {
	t.Parallel()
	d := func(rem, capacity int64, reset time.Duration) sluice.Decision {
		return sluice.Decision{Allowed: true, Remaining: rem, Limit: sluice.PerMinute(capacity), ResetAfter: reset}
	}
	tests := []struct {
		name string
		ds   []sluice.Decision
		want int
	}{
		{"one", []sluice.Decision{d(5, 10, 0)}, 0},
		{"smaller share", []sluice.Decision{d(50, 100, 0), d(3, 10, 0)}, 1},
		{"equal share, fewer units", []sluice.Decision{d(10, 100, 0), d(1, 10, 0)}, 1},
		{"all equal, longer reset", []sluice.Decision{d(1, 10, time.Second), d(1, 10, time.Minute)}, 1},
		{"huge limits do not overflow", []sluice.Decision{d(999_999_999, 1_000_000_000, 0), d(1, 1_000_000_000, 0)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := closest(tt.ds); got != tt.want {
				t.Errorf("closest = %d, want %d", got, tt.want)
			}
		})
	}
}

type plain struct{ sluice.Store }

func TestEnforceNeedsMulti(t *testing.T) {
	t.Parallel()
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	r1 := &Rule{Name: "a", Limit: sluice.PerSecond(1)}
	r2 := &Rule{Name: "b", Limit: sluice.PerSecond(1)}
	checks := []Check{{Rule: r1, Key: "a", Cost: 1}, {Rule: r2, Key: "b", Cost: 1}}
	if _, err := New(plain{m}, nil).Enforce(context.Background(), checks); !errors.Is(err, ErrNeedMultiStore) {
		t.Errorf("Enforce on a plain store = %v, want ErrNeedMultiStore", err)
	}
	v, err := New(m, nil).Enforce(context.Background(), checks)
	if err != nil || !v.Allowed {
		t.Errorf("Enforce on a MultiStore = %+v, %v", v, err)
	}
	// Two checks of one counter are one Take: no MultiStore needed.
	r3 := &Rule{Name: "c", Limit: sluice.PerSecond(2)}
	same := []Check{{Rule: r3, Key: "s", Cost: 1}, {Rule: r3, Key: "s", Cost: 1}}
	if v, err := New(plain{m}, nil).Enforce(context.Background(), same); err != nil || !v.Allowed {
		t.Errorf("one counter twice on a plain store = %+v, %v", v, err)
	}
	v, err = New(m, nil).Enforce(context.Background(), nil)
	if err != nil || !v.Allowed || v.Report != -1 {
		t.Errorf("no checks = %+v, %v", v, err)
	}
}

func TestRuleValidate(t *testing.T) {
	t.Parallel()
	lim := sluice.PerSecond(1)
	for _, tt := range []struct {
		r  Rule
		ok bool
	}{
		{Rule{Name: "ok", Limit: lim}, true},
		{Rule{Name: "a.b-c_D9", Limit: lim, Strategy: Shadow}, true},
		{Rule{Name: "d", Limit: lim, Strategy: Delay, MaxDelay: time.Second}, true},
		{Rule{Name: "p", Limit: lim, Strategy: Penalty, Penalty: time.Hour}, true},
		{Rule{Name: "", Limit: lim}, false},
		{Rule{Name: strings.Repeat("x", MaxNameLen+1), Limit: lim}, false},
		// Every name a descriptor path makes: keys escape it, headers quote it.
		{Rule{Name: "a:b!c#d%e", Limit: lim}, true},
		{Rule{Name: `rl.path_/api/v1 "x"`, Limit: lim}, true},
		{Rule{Name: "a\nb", Limit: lim}, false},
		{Rule{Name: "a\x00b", Limit: lim}, false},
		{Rule{Name: "a\x7fb", Limit: lim}, false},
		{Rule{Name: "\xff", Limit: lim}, false},
		{Rule{Name: "bad-limit"}, false},
		{Rule{Name: "d", Limit: lim, Strategy: Delay}, false},
		{Rule{Name: "d", Limit: lim, Strategy: Delay, MaxDelay: time.Second, MaxWaiting: -1}, false},
		{Rule{Name: "p", Limit: lim, Strategy: Penalty}, false},
		{Rule{Name: "p", Limit: lim, Strategy: Penalty, Penalty: time.Microsecond}, false},
		{Rule{Name: "p", Limit: lim, Strategy: Penalty, Penalty: 400 * 24 * time.Hour}, false},
		{Rule{Name: "s", Limit: lim, Strategy: 9}, false},
		// A setting the strategy ignores: MaxDelay and Penalty belong to
		// Delay and Penalty; Shadow stands in for either.
		{Rule{Name: "r", Limit: lim, MaxDelay: time.Second}, false},
		{Rule{Name: "r", Limit: lim, Penalty: time.Hour}, false},
		{Rule{Name: "r", Limit: lim, MaxWaiting: 10}, false},
		{Rule{Name: "p", Limit: lim, Strategy: Penalty, Penalty: time.Hour, MaxWaiting: 10}, false},
		{Rule{Name: "s", Limit: lim, Strategy: Shadow, MaxWaiting: 10}, true},
		{Rule{Name: "d", Limit: lim, Strategy: Delay, MaxDelay: time.Second, Penalty: time.Hour}, false},
		{Rule{Name: "p", Limit: lim, Strategy: Penalty, Penalty: time.Hour, MaxDelay: time.Second}, false},
		{Rule{Name: "s", Limit: lim, Strategy: Shadow, MaxDelay: time.Second, Penalty: time.Hour}, true},
	} {
		if err := tt.r.Validate(); (err == nil) != tt.ok {
			t.Errorf("Validate(%+v) = %v", tt.r, err)
		}
	}
	for in, want := range map[string]Strategy{"": Reject, "reject": Reject, "delay": Delay, "shadow": Shadow, "dry_run": Shadow, "penalty": Penalty} {
		if got, err := ParseStrategy(in); err != nil || got != want {
			t.Errorf("ParseStrategy(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseStrategy("queue"); !errors.Is(err, ErrInvalidRule) {
		t.Errorf("ParseStrategy(queue) = %v", err)
	}
}

func TestKeyer(t *testing.T) {
	t.Parallel()
	plainK := NewKeyer("p:", nil)
	base := plainK.LimitStem(plainK.Base("rule"), sluice.PerMinute(10))
	k, b := plainK.Keys(base, "1.2.3.4", true)
	if k != "p:v3:rule@01257885:1.2.3.4" || b != "p:v3:rule!:1.2.3.4" {
		t.Errorf("plain keys %q %q", k, b)
	}
	if _, b := plainK.Keys(base, "x", false); b != "" {
		t.Errorf("block key without penalty: %q", b)
	}
	long := strings.Repeat("k", sluice.MaxKeyLen)
	k, b = plainK.Keys(base, long, true)
	if len(k) > sluice.MaxKeyLen || len(b) > sluice.MaxKeyLen || !strings.HasPrefix(k, "p:v3:rule@01257885#") {
		t.Errorf("long id: %q, %q", k, b)
	}
	secret := NewKeyer("p:", []byte("s"))
	k, _ = secret.Keys(base, "1.2.3.4", false)
	if strings.Contains(k, "1.2.3.4") || !strings.HasPrefix(k, "p:v3:rule@01257885#") || len(k) != len("p:v3:rule@01257885#")+32 {
		t.Errorf("hashed key %q", k)
	}
	// In-flight keys carry no limit.
	if k, _ := plainK.Keys(plainK.Base("rule"), "*", false); k != "p:v3:rule:*" {
		t.Errorf("in-flight key %q", k)
	}
}

// A rule's name never gives its keys a Redis Cluster hash tag: the key's
// own tag (a user's, to keep layered rules on one slot) is the first.
func TestKeyerNameCarriesNoBrace(t *testing.T) {
	t.Parallel()
	k := NewKeyer("p:", nil)
	a, _ := k.Keys(k.LimitStem(k.Base("api{v1}"), sluice.PerMinute(10)), "{tenant42}:u", false)
	b, _ := k.Keys(k.LimitStem(k.Base("ip"), sluice.PerMinute(10)), "{tenant42}:u", false)
	for _, key := range []string{a, b} {
		if i := strings.IndexByte(key, '{'); i < 0 || !strings.HasPrefix(key[i:], "{tenant42}") {
			t.Errorf("key %q: its first tag is not the key's own {tenant42}", key)
		}
	}
	if k.Base("a{b") == k.Base("a%7Bb") {
		t.Errorf("names a{b and a%%7Bb share the stem %q", k.Base("a{b"))
	}
}

// A rule's keys belong to its limit: two limits of one rule (a reload, or
// a fleet mid-rollout) never share a counter, nor a block, while equal
// limits written differently do; the keys of both still name the rule.
func TestKeysBelongToTheLimit(t *testing.T) {
	t.Parallel()
	k := NewKeyer("p:", nil)
	base := k.Base("api")
	limits := []sluice.Limit{
		sluice.PerSecond(5), sluice.PerSecond(5).WithBurst(6), sluice.PerSecond(6),
		{Rate: 5, Period: 24 * time.Hour}, sluice.PerSecond(5).WithAlgorithm(sluice.FixedWindow),
		sluice.PerSecond(5).WithAlgorithm(sluice.SlidingWindowCounter),
		sluice.PerMinute(10).WithAlgorithm(sluice.FixedWindow), {Algorithm: sluice.FixedWindow, Rate: 10, Period: 10 * time.Minute},
	}
	seen := map[string]sluice.Limit{}
	for _, l := range limits {
		key, block := k.Keys(k.LimitStem(base, l), "alice", true)
		if prev, dup := seen[key]; dup {
			t.Errorf("%v and %v share %q", prev, l, key)
		}
		seen[key] = l
		// A block outlives a change of limit: every limit's is the rule's.
		if _, plain := k.Keys(base, "alice", true); block != plain {
			t.Errorf("%v: block key %q, want the rule's %q", l, block, plain)
		}
		if stem, ok := k.Stem(key); !ok || stem != base {
			t.Errorf("Stem(%q) = %q, %v; want %q", key, stem, ok, base)
		}
		if _, ok := k.Stem(block); ok {
			t.Errorf("Stem(block %q) is ok", block)
		}
		if stem, ok := k.RuleStem(block); !ok || stem != base {
			t.Errorf("RuleStem(block %q) = %q, %v; want %q", block, stem, ok, base)
		}
		if stem, ok := k.RuleStem(key); !ok || stem != base {
			t.Errorf("RuleStem(%q) = %q, %v; want %q", key, stem, ok, base)
		}
	}
	if a, b := k.LimitStem(base, sluice.PerSecond(5)), k.LimitStem(base, sluice.PerSecond(5).WithBurst(5)); a != b {
		t.Errorf("5/s and 5/s burst 5: %q, %q", a, b)
	}
}

// A Delay rule holds at most MaxWaiting requests at once; the next is
// rejected at once, and a slot frees when a held request ends.
func TestMaxWaiting(t *testing.T) {
	t.Parallel()
	m := memory.New(&memory.Options{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	rules := []Rule{
		{Name: "d", Limit: sluice.PerHour(1), Strategy: Delay, MaxDelay: 2 * time.Hour, MaxWaiting: 1},
		{Name: "r", Limit: sluice.PerHour(100)},
	}
	eng, _, err := Setup(m, rules, func(int) bool { return true }, "p:", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	checks := []Check{{Rule: &rules[0], Key: "d", Cost: 1}, {Rule: &rules[1], Key: "r", Cost: 1}}
	// Ended after a minute, but with no deadline: a deadline before the
	// hour's wait would refuse at once by itself, slot or no slot.
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(time.Minute, cancel).Stop()
	defer cancel()
	if v, err := eng.Enforce(ctx, checks); err != nil || !v.Allowed {
		t.Fatalf("first request: %+v, %v", v, err)
	}
	// hold starts a request that waits until its context ends.
	hold := func() (stop func()) {
		hctx, hcancel := context.WithCancel(ctx)
		done := make(chan Verdict)
		go func() {
			v, _ := eng.Enforce(hctx, checks)
			done <- v
		}()
		for rules[0].waiting.Load() != 1 {
			time.Sleep(time.Millisecond)
		}
		return func() {
			hcancel()
			if v := <-done; v.Allowed || v.Waited != 0 {
				t.Errorf("cancelled held request: %+v", v)
			}
		}
	}
	for round := range 2 {
		stop := hold()
		v, err := eng.Enforce(ctx, checks)
		if err != nil || v.Allowed || ctx.Err() != nil || v.Decision.RetryAfter <= time.Hour-time.Minute {
			t.Errorf("round %d: request past MaxWaiting = %+v, %v; want an immediate denial", round, v, err)
		}
		stop()
		if n := rules[0].waiting.Load(); n != 0 {
			t.Fatalf("round %d: %d slots still held", round, n)
		}
	}
	// Denied requests took nothing from the layered rule.
	if d, _ := m.Peek(ctx, "r", rules[1].Limit, 1); d.Remaining != 99 {
		t.Errorf("layered rule has %d remaining, want 99", d.Remaining)
	}
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var errDown = errors.New("backend down")

// failing is a memory store whose Take fails on key the next n times.
type failing struct {
	*memory.Store
	key string
	n   atomic.Int32
}

func (f *failing) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if key == f.key && f.n.Add(-1) >= 0 {
		return sluice.Decision{}, errDown
	}
	return f.Store.Take(ctx, key, l, cost)
}

// A denial that resilient's FailClosed made up is no violation: it starts
// no block, and a block Take that failed (or was made up) is not reported
// as a block.
func TestPenaltyIgnoresFailClosed(t *testing.T) {
	t.Parallel()
	const penalty = 15 * time.Minute
	for _, tt := range []struct {
		name    string
		failKey string // whose next Take fails
		used    int    // requests admitted before the one under test
		retry   time.Duration
	}{
		{"limit take fails", "k", 0, time.Second}, // resilient's ProbeInterval
		{"block take fails", "k!", 1, time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock(t0)
			m := &failing{Store: memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1}), key: tt.failKey}
			t.Cleanup(func() { m.Close() })
			s, err := resilient.New(m, &resilient.Options{Policy: resilient.FailClosed, Timeout: time.Minute, Clock: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			r := &Rule{Name: "p", Limit: sluice.PerMinute(1), Strategy: Penalty, Penalty: penalty}
			checks := []Check{{Rule: r, Key: "k", PenaltyKey: "k!", Cost: 1}}
			eng := New(s, nil)
			for range tt.used {
				if v, err := eng.Enforce(context.Background(), checks); err != nil || !v.Allowed {
					t.Fatalf("first request: %+v, %v", v, err)
				}
			}
			m.n.Store(1)
			v, err := eng.Enforce(context.Background(), checks)
			if err != nil || v.Allowed {
				t.Fatalf("request under test: %+v, %v; want a denial", v, err)
			}
			if v.Decision.RetryAfter != tt.retry {
				t.Errorf("RetryAfter = %v, want %v (not the penalty)", v.Decision.RetryAfter, tt.retry)
			}
			if d, _ := m.Store.Peek(context.Background(), "k!", r.PenaltyLimit(), 1); !d.Allowed {
				t.Errorf("block key written: %+v", d)
			}
		})
	}
}

// With several Penalty rules blocking, the longest block is reported.
func TestPenaltyLongestBlock(t *testing.T) {
	t.Parallel()
	m := memory.New(&memory.Options{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	short := &Rule{Name: "short", Limit: sluice.PerMinute(10), Strategy: Penalty, Penalty: time.Minute}
	long := &Rule{Name: "long", Limit: sluice.PerMinute(10), Strategy: Penalty, Penalty: time.Hour}
	checks := []Check{
		{Rule: short, Key: "s", PenaltyKey: "s!", Cost: 1},
		{Rule: long, Key: "l", PenaltyKey: "l!", Cost: 1},
	}
	for _, c := range checks {
		if _, err := m.Take(context.Background(), c.PenaltyKey, c.Rule.PenaltyLimit(), 1); err != nil {
			t.Fatal(err)
		}
	}
	v, err := New(m, nil).Enforce(context.Background(), checks)
	if err != nil || v.Allowed || v.Report != 1 || v.Decision.RetryAfter <= time.Hour-time.Minute {
		t.Errorf("Enforce = %+v, %v; want the 1h block of rule 1", v, err)
	}
}

// denyNow denies every Take with no RetryAfter, as a broken store might.
type denyNow struct {
	sluice.Store
	calls atomic.Int64
}

func (d *denyNow) Take(_ context.Context, _ string, l sluice.Limit, _ int64) (sluice.Decision, error) {
	d.calls.Add(1)
	return sluice.Decision{Limit: l}, nil
}

// A Delay rule facing denials with no RetryAfter waits a little between
// tries and gives up after MaxDelay, instead of spinning on the store.
func TestDelayZeroRetryAfter(t *testing.T) {
	t.Parallel()
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	s := &denyNow{Store: m}
	r := &Rule{Name: "d", Limit: sluice.PerSecond(1), Strategy: Delay, MaxDelay: 10 * time.Millisecond}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	v, err := New(s, nil).Enforce(ctx, []Check{{Rule: r, Key: "k", Cost: 1}})
	if err != nil || v.Allowed || ctx.Err() != nil {
		t.Errorf("Enforce = %+v, %v (context: %v); want a denial after MaxDelay", v, err, ctx.Err())
	}
	if n := s.calls.Load(); n > 11 {
		t.Errorf("store called %d times in a 10ms MaxDelay", n)
	}
}

// hangUp cancels the request's context as the limit key's Take returns,
// like a client disconnecting right after its violation, and fails calls
// whose context has ended.
type hangUp struct {
	*memory.Store
	cancel context.CancelFunc
}

func (h *hangUp) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	d, err := h.Store.Take(ctx, key, l, cost)
	if key == "k" {
		h.cancel()
	}
	return d, err
}

// A client that hangs up right after its violation is blocked all the same.
func TestPenaltyOutlivesRequest(t *testing.T) {
	t.Parallel()
	m := memory.New(&memory.Options{SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	r := &Rule{Name: "p", Limit: sluice.PerHour(1), Strategy: Penalty, Penalty: 2 * time.Hour}
	checks := []Check{{Rule: r, Key: "k", PenaltyKey: "k!", Cost: 1}}
	if _, err := m.Take(context.Background(), "k", r.Limit, 1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	v, err := New(&hangUp{Store: m, cancel: cancel}, nil).Enforce(ctx, checks)
	if err != nil || v.Allowed || v.Decision.RetryAfter != r.Penalty {
		t.Errorf("Enforce = %+v, %v; want the 2h penalty", v, err)
	}
	if d, _ := m.Peek(context.Background(), "k!", r.PenaltyLimit(), 1); d.Allowed {
		t.Error("no block after the client hung up")
	}
}

// No two distinct (rule, limit, key) triples share a store key, nor does
// a key a block key, nor a rate key an in-flight key, whatever bytes names
// and keys hold: names are escaped, the first separator after the tag ends
// them, and a fingerprint has a fixed length.
func TestKeyGrammarIsInjective(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", ":", "#", "!", "@", "%", "%3A", "%40", "3A", "v2:", "v3:", "@01257885", "|", "{", "}"}
	word := func(r *rand.Rand, minLen int) string {
		var b strings.Builder
		for n := minLen + r.IntN(4); n > 0; n-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	limits := []sluice.Limit{{}, sluice.PerMinute(10), sluice.PerMinute(11), sluice.PerMinute(10).WithAlgorithm(sluice.FixedWindow)}
	r := rand.New(rand.NewPCG(1, 2))
	for _, secret := range [][]byte{nil, []byte("s")} {
		k := NewKeyer("p:", secret)
		type triple struct {
			name, id, kind string
			limit          sluice.Limit
		}
		seen := map[string]triple{}
		add := func(key string, p triple) {
			if prev, dup := seen[key]; dup && prev != p {
				t.Fatalf("secret %q: %+v and %+v share the store key %q", secret, prev, p, key)
			}
			seen[key] = p
		}
		for range 20000 {
			name, id := word(r, 1), word(r, 0)
			if r.IntN(50) == 0 {
				name = strings.Repeat(name, 200)[:min(len(name)*200, MaxNameLen)] // a hashed name
			}
			if r.IntN(50) == 0 {
				id = strings.Repeat("x", sluice.MaxKeyLen) // hashed id
			}
			l := limits[r.IntN(len(limits))]
			base := k.Base(name)
			stem, kind := base, "in-flight" // the zero limit stands for an in-flight rule's
			if l != (sluice.Limit{}) {
				stem, kind = k.LimitStem(base, l), "key"
			}
			key, block := k.Keys(stem, id, true)
			if len(key) > sluice.MaxKeyLen || len(block) > sluice.MaxKeyLen {
				t.Fatalf("%q, %q: key of %d, block of %d bytes", name, id, len(key), len(block))
			}
			if !strings.HasPrefix(key, "p:"+KeyVersion) {
				t.Fatalf("key %q lacks the version tag", key)
			}
			// Stem finds the rule of every key, a long name's too, and no
			// rule for a block key.
			if got, ok := k.Stem(key); !ok || got != base {
				t.Fatalf("Stem(%q) = %q, %v; rule %q", key, got, ok, name)
			}
			if _, ok := k.Stem(block); ok {
				t.Fatalf("Stem(block %q) is ok", block)
			}
			add(key, triple{name, id, kind, l})
			add(block, triple{name, id, "block", sluice.Limit{}}) // a block names the rule, not its limit
		}
	}
}

// engineOn returns an engine on a fresh memory store with a fake clock.
func engineOn(t *testing.T, obs sluice.Observer) *Engine {
	t.Helper()
	clock := storetest.NewClock(time.Unix(1_700_000_000, 0))
	m := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	return New(m, obs)
}

type events []sluice.DecisionEvent

func (e *events) ObserveDecision(ev sluice.DecisionEvent) { *e = append(*e, ev) }
func (*events) ObserveStore(sluice.StoreEvent)            {}
func (*events) ObserveBreaker(sluice.BreakerEvent)        {}

func (e events) String() string {
	var b strings.Builder
	for _, ev := range e {
		b.WriteString(ev.Policy + "=" + ev.Outcome.String() + " ")
	}
	return strings.TrimSpace(b.String())
}

// A check of cost 0 only looks: never over, never counted, nothing taken.
func TestCheckOnly(t *testing.T) {
	t.Parallel()
	var obs events
	e := engineOn(t, &obs)
	r := &Rule{Name: "r", Limit: sluice.PerMinute(2)}
	ctx := context.Background()
	take := []Check{{Rule: r, Key: "k", Cost: 2}}
	if v, err := e.Enforce(ctx, take); err != nil || !v.Allowed {
		t.Fatalf("take 2: %+v, %v", v, err)
	}
	look := []Check{{Rule: r, Key: "k"}}
	v, err := e.EnforceAll(ctx, look)
	if err != nil || !v.Allowed || v.Report != -1 {
		t.Fatalf("look: %+v, %v", v, err)
	}
	if d := look[0].Decision; !d.Allowed || d.Remaining != 0 || d.Limit != r.Limit {
		t.Errorf("look decision %+v, want allowed with 0 remaining", d)
	}
	if got, want := obs.String(), "r=allowed"; got != want {
		t.Errorf("observed %q, want %q (looking is not counted)", got, want)
	}
}

// Checks naming one counter take their summed cost once; a sum beyond the
// capacity is over without taking anything, and so is an Over check.
func TestCountersAndOver(t *testing.T) {
	t.Parallel()
	e := engineOn(t, nil)
	ctx := context.Background()
	r := &Rule{Name: "r", Limit: sluice.PerMinute(4)}
	o := &Rule{Name: "o", Limit: sluice.PerMinute(4)}
	twice := []Check{{Rule: r, Key: "k", Cost: 1}, {Rule: r, Key: "k", Cost: 1}}
	for i, want := range []struct {
		allowed   bool
		remaining int64
	}{{true, 2}, {true, 0}, {false, 0}} {
		v, err := e.EnforceAll(ctx, twice)
		if err != nil || v.Allowed != want.allowed {
			t.Fatalf("step %d: %+v, %v", i, v, err)
		}
		for j := range twice {
			if d := twice[j].Decision; d.Allowed != want.allowed || d.Remaining != want.remaining {
				t.Errorf("step %d check %d: %+v, want allowed %v remaining %d", i, j, d, want.allowed, want.remaining)
			}
		}
	}
	over := []Check{{Rule: o, Key: "big", Cost: 3}, {Rule: o, Key: "big", Cost: 2}}
	if v, err := e.EnforceAll(ctx, over); err != nil || v.Allowed || over[0].Decision.Allowed {
		t.Fatalf("5 units on a capacity of 4: %+v, %v", v, err)
	}
	blocked := []Check{{Rule: o, Key: "x", Cost: 1}, {Rule: o, Over: true}}
	v, err := e.EnforceAll(ctx, blocked)
	if err != nil || v.Allowed || v.Report != 1 {
		t.Fatalf("an Over check: %+v, %v", v, err)
	}
	if d := blocked[0].Decision; !d.Allowed || d.Remaining != 4 {
		t.Errorf("the other check is peeked: %+v", d)
	}
	for _, key := range []string{"big", "x"} {
		if d, _ := e.Peek(ctx, &Check{Rule: o, Key: key, Cost: 4}); !d.Allowed {
			t.Errorf("%s: units were taken by a refused request", key)
		}
	}
}

// A shadow rule takes its units only when the request is admitted.
func TestShadowTakesOnlyWhenAdmitted(t *testing.T) {
	t.Parallel()
	var obs events
	e := engineOn(t, &obs)
	ctx := context.Background()
	en := &Rule{Name: "en", Limit: sluice.PerMinute(1)}
	sh := &Rule{Name: "sh", Limit: sluice.PerMinute(5), Strategy: Shadow}
	checks := func() []Check { return []Check{{Rule: en, Key: "e", Cost: 1}, {Rule: sh, Key: "s", Cost: 1}} }
	for range 3 {
		e.Enforce(ctx, checks())
	}
	if got, want := obs.String(), "en=allowed sh=allowed en=denied en=denied"; got != want {
		t.Errorf("observed %q, want %q", got, want)
	}
	c := checks()
	if _, err := e.EnforceAll(ctx, c); err != nil || c[1].Decision.Remaining != 4 {
		t.Errorf("shadow counter %+v, %v: want one unit taken, for the one admitted request", c[1].Decision, err)
	}
}

// A blocked key is denied by Peek until its block ends, as a check would
// be, and a look (cost 0) reports nothing left to take, though the rate
// key itself has units again.
func TestPeekSeesBlock(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	m := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	r := &Rule{Name: "otp", Limit: sluice.PerSecond(1), Strategy: Penalty, Penalty: time.Minute}
	c := Check{Rule: r, Key: "k", PenaltyKey: "k!", Cost: 1}
	eng := New(m, nil)
	ctx := context.Background()
	for i, want := range []bool{true, false} { // the second starts the block
		if v, err := eng.Enforce(ctx, []Check{c}); err != nil || v.Allowed != want {
			t.Fatalf("request %d: %+v, %v; want allowed %v", i, v, err, want)
		}
	}
	clk.Advance(2 * time.Second) // the rate key is fresh again; the block is not
	d, err := eng.Peek(ctx, &c)
	if err != nil || d.Allowed || d.RetryAfter < 57*time.Second || d.RetryAfter > time.Minute {
		t.Errorf("Peek during the block = %+v, %v; want denied for about 58s", d, err)
	}
	look := []Check{{Rule: r, Key: "k", PenaltyKey: "k!", Cost: 0}}
	v, err := eng.EnforceAll(ctx, look)
	if err != nil || !v.Allowed || look[0].Decision.Remaining != 0 {
		t.Errorf("a look during the block = %+v (its check %+v), %v; want allowed, 0 remaining", v, look[0].Decision, err)
	}
}

func TestLastValue(t *testing.T) {
	for _, tt := range []struct {
		lines []string
		want  string
	}{
		{nil, ""},
		{[]string{"critical"}, "critical"},
		{[]string{"critical", "sheddable"}, "sheddable"},
		{[]string{"critical, sheddable"}, "sheddable"},
		{[]string{"normal", "critical ,  sheddable "}, "sheddable"},
	} {
		if got := LastValue(tt.lines); got != tt.want {
			t.Errorf("LastValue(%q) = %q, want %q", tt.lines, got, tt.want)
		}
	}
}

// goneAfter is a store whose client leaves (ctx cancelled) once the
// enforcing rule's key has been taken, before the shadow rule's call.
type goneAfter struct {
	sluice.Store
	key    string
	cancel context.CancelFunc
}

func (g goneAfter) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	d, err := g.Store.Take(ctx, key, l, cost)
	if key == g.key {
		g.cancel()
	}
	return d, err
}

// A shadow rule's call that fails because the client has gone is no store
// failure: not observed as an error, nor reported as the check's error,
// whether the request was admitted (the shadow takes) or denied (it peeks).
func TestShadowClientGoneIsNoStoreError(t *testing.T) {
	t.Parallel()
	for _, admitted := range []bool{true, false} {
		clock := storetest.NewClock(time.Unix(1_700_000_000, 0))
		m := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
		t.Cleanup(func() { m.Close() })
		en := &Rule{Name: "en", Limit: sluice.PerMinute(1)}
		sh := &Rule{Name: "sh", Limit: sluice.PerMinute(5), Strategy: Shadow}
		if !admitted {
			if _, err := m.Take(context.Background(), "e", en.Limit, 1); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(context.Background())
		var obs events
		e := New(goneAfter{m, "e", cancel}, &obs)
		c := []Check{{Rule: en, Key: "e", Cost: 1}, {Rule: sh, Key: "s", Cost: 1}}
		e.EnforceAll(ctx, c)
		cancel()
		if strings.Contains(obs.String(), "sh=error") || c[1].Err != nil {
			t.Errorf("admitted %v: observed %q, shadow check's error %v; want no error for a client gone", admitted, obs.String(), c[1].Err)
		}
	}
}
