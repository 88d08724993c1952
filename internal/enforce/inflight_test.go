package enforce

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// Requests are "key priority": rules see the key, the test the priority.
func slotRules(t *testing.T, specs ...SlotSpec[string]) *SlotRules[string] {
	t.Helper()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	rs, err := NewSlotRules(store, specs, "p:", nil, nil, errNoKey, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// ident keys a request by itself; the empty one has no key.
func ident(r string) (string, error) {
	if r == "" {
		return "", errNoKey
	}
	return r, nil
}

// The threshold model, step by step, fleet-wide (Shed) and in the process
// (Worker): capacity 10, reserves 20% and 30%: sheddable fits under 5,
// normal under 8, critical under 10.
func TestSlotThresholds(t *testing.T) {
	t.Parallel()
	reserve := sluice.Reserve{Critical: 0.2, Normal: 0.3}
	for _, kind := range []SlotKind{Shed, Worker} {
		t.Run(fmt.Sprintf("kind %d", kind), func(t *testing.T) { testThresholds(t, kind, reserve) })
	}
}

func testThresholds(t *testing.T, kind SlotKind, reserve sluice.Reserve) {
	rs := slotRules(t, SlotSpec[string]{Name: "cap", Kind: kind, Limit: sluice.Concurrent(10, time.Minute), Reserve: reserve})
	var held []*Held
	steps := []struct {
		p     sluice.Priority
		n     int // acquires
		admit int // of which admitted
	}{
		{sluice.PrioritySheddable, 6, 5},
		{sluice.PriorityNormal, 4, 3},
		{sluice.PrioritySheddable, 1, 0},
		{sluice.PriorityCritical, 3, 2},
		{sluice.PriorityCritical, 1, 0},
	}
	for i, st := range steps {
		admitted := 0
		for range st.n {
			h, v, err := rs.Acquire(context.Background(), "", st.p)
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed {
				admitted++
				held = append(held, h)
			} else if !v.Shed || v.Policy != "cap" || v.Decision.RetryAfter <= 0 {
				t.Errorf("step %d: refusal %+v", i, v)
			}
		}
		if admitted != st.admit {
			t.Errorf("step %d: %v admitted %d of %d, want %d", i, st.p, admitted, st.n, st.admit)
		}
	}
	for _, h := range held {
		h.Release()
		h.Release() // idempotent: frees nothing more
	}
	h, v, err := rs.Acquire(context.Background(), "", sluice.PrioritySheddable)
	if err != nil || !v.Allowed {
		t.Errorf("after every release: %+v %v", v, err)
	}
	h.Release()
}

// All or none: a rule refusing releases the slots of the rules before it.
func TestSlotAllOrNone(t *testing.T) {
	t.Parallel()
	rs := slotRules(t,
		SlotSpec[string]{Name: "key", Limit: sluice.Concurrent(5, time.Minute), Key: ident},
		SlotSpec[string]{Name: "workers", Kind: Worker, Limit: sluice.InFlightLimit{Max: 1}},
	)
	h, v, err := rs.Acquire(context.Background(), "a", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	for range 10 { // each refused by workers, after key granted its slot
		if _, v, _ := rs.Acquire(context.Background(), "a", sluice.PriorityCritical); v.Allowed || v.Policy != "workers" || v.Rule != 1 {
			t.Fatalf("%+v", v)
		}
	}
	h.Release()
	// Had the refusals kept their "key" slots, 10 > 5 would refuse now.
	h, v, err = rs.Acquire(context.Background(), "a", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Errorf("after the refusals: %+v %v", v, err)
	}
	h.Release()
	// No key skips the rule: only the worker slot is taken.
	h, v, err = rs.Acquire(context.Background(), "", sluice.PriorityCritical)
	if err != nil || !v.Allowed || len(h.holds) != 1 {
		t.Errorf("no key: %+v %v", v, err)
	}
	h.Release()
}

// A priority with everything above it reserved is refused without a
// store call, its Retry-After the hold; a weight out of range is an error.
func TestSlotNeverAdmitted(t *testing.T) {
	t.Parallel()
	rs := slotRules(t, SlotSpec[string]{Name: "cap", Kind: Shed, Limit: sluice.Concurrent(4, 30*time.Second), Reserve: sluice.Reserve{Critical: 0.5, Normal: 0.5},
		Weight: func(r string) int64 { return int64(len(r)) }})
	if _, v, err := rs.Acquire(context.Background(), "x", sluice.PrioritySheddable); err != nil || v.Allowed || v.Decision.RetryAfter != 30*time.Second {
		t.Errorf("sheddable: %+v %v", v, err)
	}
	if _, v, err := rs.Acquire(context.Background(), "xxx", sluice.PriorityNormal); err != nil || v.Allowed {
		t.Errorf("normal of weight 3 over a threshold of 2: %+v %v", v, err)
	}
	if _, _, err := rs.Acquire(context.Background(), "xxxxx", sluice.PriorityCritical); !errors.Is(err, sluice.ErrInvalidWeight) {
		t.Errorf("weight 5 of 4: %v", err)
	}
	if got := (SlotVerdict{Policy: "cap", Shed: true, Decision: sluice.SlotDecision{RetryAfter: 1500 * time.Millisecond}}).Message(); got != `overloaded: "cap" sheds this request; retry in 2s (an estimate)` {
		t.Errorf("Message %q", got)
	}
}

func TestNewSlotRulesErrors(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	lim := sluice.Concurrent(4, time.Minute)
	for name, spec := range map[string]SlotSpec[string]{
		"no key":         {Name: "a", Limit: lim},
		"reserve":        {Name: "a", Limit: lim, Key: ident, Reserve: sluice.Reserve{Critical: 0.1}},
		"shed key":       {Name: "a", Kind: Shed, Limit: lim, Key: ident},
		"bad name":       {Name: "", Limit: lim, Key: ident},
		"unknown kind":   {Name: "a", Kind: 9, Limit: lim},
		"worker max":     {Name: "a", Kind: Worker},
		"shed hold zero": {Name: "a", Kind: Shed, Limit: sluice.InFlightLimit{Max: 4}},
	} {
		if _, err := NewSlotRules(store, []SlotSpec[string]{spec}, "", nil, nil, errNoKey, 0, nil); !errors.Is(err, ErrInvalidRule) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := NewSlotRules(store, []SlotSpec[string]{{Name: "a", Kind: Worker, Limit: lim}}, "", nil, nil, errNoKey, 1, func(int) string { return "a" }); err == nil {
		t.Error("a taken name was accepted")
	}
	if rs, err := NewSlotRules[string](store, nil, "", nil, nil, errNoKey, 0, nil); rs != nil || err != nil || rs.Len() != 0 {
		t.Errorf("no specs: %v %v", rs, err)
	}
	if _, err := NewSlotRules(store, []SlotSpec[string]{{Name: "s", Kind: Shed, Limit: lim, Workers: 3}}, "", nil, nil, errNoKey, 0, nil); !errors.Is(err, ErrInvalidRule) {
		t.Errorf("capacity and workers: %v", err)
	}
	// A nil SlotRules holds nothing and admits everything.
	var none *SlotRules[string]
	if h, v, err := none.Acquire(context.Background(), "a", 0); h != nil || !v.Allowed || err != nil {
		t.Errorf("nil rules: %v %+v %v", h, v, err)
	}
}
