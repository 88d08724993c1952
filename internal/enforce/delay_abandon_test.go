package enforce

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

// A request whose context ends while a Delay rule holds it is Abandoned
// and observed as nothing, through Enforce (the middleware) and
// EnforceAll (the service) alike, as a store call of an ended context is
// not: no client hears its denial. One refused at once, its context
// alive, is observed as denied. On frozen clocks (memory and a real
// Redis): 1/min, its unit taken.
func TestDelayAbandonedNotObserved(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	for _, s := range delayStores(t, clock.Now) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			var obs events
			e := New(s.store, &obs)
			held := &Rule{Name: "held", Limit: sluice.PerMinute(1).WithBurst(1), Strategy: Delay, MaxDelay: 2 * time.Minute}
			short := &Rule{Name: "short", Limit: held.Limit, Strategy: Delay, MaxDelay: time.Second}
			for _, all := range []bool{false, true} {
				enforce := func(ctx context.Context, r *Rule, key string) Verdict {
					checks := []Check{{Rule: r, Key: key, Cost: 1}}
					var v Verdict
					var err error
					if all {
						v, err = e.EnforceAll(ctx, checks)
					} else {
						v, err = e.Enforce(ctx, checks)
					}
					if err != nil && ctx.Err() == nil {
						t.Fatal(err)
					}
					return v
				}
				key := "k"
				if all {
					key = "all"
				}
				obs = nil
				if v := enforce(context.Background(), held, key); !v.Allowed {
					t.Fatalf("all=%v: first request refused", all)
				}
				obs = nil
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(100*time.Millisecond, cancel)
				v := enforce(ctx, held, key)
				if v.Allowed || !v.Abandoned {
					t.Errorf("all=%v: held request cancelled: %+v, want Abandoned", all, v)
				}
				if len(obs) != 0 {
					t.Errorf("all=%v: held request cancelled: observed %q, want nothing", all, obs.String())
				}
				obs = nil
				if v := enforce(context.Background(), short, key); v.Allowed || v.Abandoned {
					t.Errorf("all=%v: request refused at once: %+v, want a denial", all, v)
				}
				if got := obs.String(); got != "short=denied" {
					t.Errorf("all=%v: request refused at once: observed %q, want short=denied", all, got)
				}
			}
		})
	}
}
