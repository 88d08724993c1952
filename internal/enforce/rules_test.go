package enforce

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

var errNoKey = errors.New("test: no key")

// The collector keeps the rules that match and find a key, in order,
// tagged with their index; a wrapped no-key error skips a rule; any other
// key error, or a cost out of range, names the rule.
func TestRulesCollect(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	l := sluice.PerMinute(10)
	key := func(r string) (string, error) {
		switch r {
		case "none":
			return "", fmt.Errorf("wrapped: %w", errNoKey)
		case "fail":
			return "", errors.New("boom")
		}
		return r, nil
	}
	rs, err := NewRules(store, []Spec[string]{
		{Rule: Rule{Name: "all", Limit: l}, Key: key},
		{Rule: Rule{Name: "short", Limit: l, Strategy: Penalty, Penalty: sluice.MaxPeriod}, Key: key, Match: func(r string) bool { return len(r) < 5 }},
		{Rule: Rule{Name: "dark", Limit: l, Strategy: Shadow}, Key: Global[string](), Cost: func(r string) int64 { return int64(len(r)) }},
	}, "p:", nil, nil, errNoKey)
	if err != nil {
		t.Fatal(err)
	}
	if rs.Len() != 3 {
		t.Fatalf("Len = %d", rs.Len())
	}
	tests := []struct {
		req      string
		tags     string
		keys     string
		errMatch string
	}{
		{req: "ab", tags: "0 1 2", keys: "p:v3:all@01257885:ab p:v3:short@01257885:ab p:v3:dark@01257885:*"},
		{req: "abcdef", tags: "0 2", keys: "p:v3:all@01257885:abcdef p:v3:dark@01257885:*"},
		{req: "none", tags: "2", keys: "p:v3:dark@01257885:*"},
		{req: "fail", errMatch: `rule "all": boom`},
		{req: "abcdefghijklmnop", tags: "0 2", keys: "p:v3:all@01257885:abcdefghijklmnop p:v3:dark@01257885:*"}, // a shadow cost over capacity: the engine records it
	}
	for _, tt := range tests {
		checks, err := rs.Collect(tt.req, nil)
		if tt.errMatch != "" {
			if err == nil || !strings.Contains(err.Error(), tt.errMatch) {
				t.Errorf("%s: err = %v, want one containing %q", tt.req, err, tt.errMatch)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.req, err)
		}
		var tags, keys []string
		for _, c := range checks {
			tags = append(tags, fmt.Sprint(c.Tag))
			keys = append(keys, c.Key)
			if c.Rule != &rs.Spec(c.Tag).Rule {
				t.Errorf("%s: check %d points at another rule", tt.req, c.Tag)
			}
			if got, want := c.PenaltyKey != "", c.Rule.Strategy == Penalty; got != want {
				t.Errorf("%s: rule %s penalty key %q", tt.req, c.Rule.Name, c.PenaltyKey)
			}
		}
		if got := strings.Join(tags, " "); got != tt.tags {
			t.Errorf("%s: tags %q, want %q", tt.req, got, tt.tags)
		}
		if got := strings.Join(keys, " "); got != tt.keys {
			t.Errorf("%s: keys %q, want %q", tt.req, got, tt.keys)
		}
	}
	var zero *Rules[string]
	if cs, err := zero.Collect("x", nil); err != nil || len(cs) != 0 || zero.Len() != 0 {
		t.Errorf("nil Rules: %v, %v, want nothing", cs, err)
	}
}

// An enforcing rule's cost above its capacity is kept for the engine to
// refuse (Never); a cost below 1 fails the request, naming the rule.
func TestRulesCollectCostOverCapacity(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	rs, err := NewRules(store, []Spec[int64]{
		{Rule: Rule{Name: "n", Limit: sluice.PerMinute(10)}, Key: Global[int64](), Cost: func(n int64) int64 { return n }},
	}, "p:", nil, nil, errNoKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int64{10, 11} {
		checks, err := rs.Collect(n, nil)
		if err != nil || len(checks) != 1 || checks[0].Cost != n || Never(&checks[0]) != (n > 10) {
			t.Errorf("cost %d: %+v, %v", n, checks, err)
		}
	}
	if _, err := rs.Collect(0, nil); !errors.Is(err, sluice.ErrInvalidCost) || !strings.Contains(err.Error(), `rule "n"`) {
		t.Errorf("cost 0: %v, want ErrInvalidCost naming the rule", err)
	}
}
