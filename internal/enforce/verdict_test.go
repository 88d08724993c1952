package enforce

import (
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// No two distinct (rule, key) pairs share a store key, nor does a key a
// block key, whatever bytes names and keys hold: names are escaped, and the
// first separator after the tag ends them.
func TestKeyGrammarIsInjective(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", ":", "#", "!", "%", "%3A", "3A", "v2:", "|", "{", "}"}
	word := func(r *rand.Rand, minLen int) string {
		var b strings.Builder
		for n := minLen + r.IntN(4); n > 0; n-- {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	r := rand.New(rand.NewPCG(1, 2))
	for _, secret := range [][]byte{nil, []byte("s")} {
		k := NewKeyer("p:", secret)
		type pair struct{ name, id, kind string }
		seen := map[string]pair{}
		add := func(key string, p pair) {
			if prev, dup := seen[key]; dup && prev != p {
				t.Fatalf("secret %q: %+v and %+v share the store key %q", secret, prev, p, key)
			}
			seen[key] = p
		}
		for range 20000 {
			name, id := word(r, 1), word(r, 0)
			if r.IntN(50) == 0 {
				name = strings.Repeat(name, 200)[:min(len(name)*200, MaxNameLen)] // hashed whole
			}
			if r.IntN(50) == 0 {
				id = strings.Repeat("x", sluice.MaxKeyLen) // hashed id
			}
			key, block := k.Keys(k.Base(name), id, true)
			if len(key) > sluice.MaxKeyLen || len(block) > sluice.MaxKeyLen {
				t.Fatalf("%q, %q: key of %d, block of %d bytes", name, id, len(key), len(block))
			}
			if !strings.HasPrefix(key, "p:"+KeyVersion) {
				t.Fatalf("key %q lacks the version tag", key)
			}
			add(key, pair{name, id, "key"})
			add(block, pair{name, id, "block"})
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
