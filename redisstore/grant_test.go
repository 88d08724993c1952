package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// grantDiffSteps is the length of each differential grant trace.
const grantDiffSteps = 600

// The grant script is held to the memory store's Go: random traces of
// grants, returns, takes and peeks on a few keys drive both stores with one
// fake clock, and every answer must be the same. Periods are an hour and the
// clock never stops within two seconds of a window's end, and every key's
// TTL is raised after each write, so that Redis's real-time expiry cannot
// drop a key the memory store still holds.
func TestGrantDifferential(t *testing.T) {
	client := redistest.Client(t)
	for _, alg := range sluice.Algorithms() {
		if alg == sluice.SlidingWindowLog {
			continue
		}
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(20261123, uint64(alg)))
			runGrantDiff(t, client, r, alg)
		})
	}
}

func runGrantDiff(t *testing.T, client *redis.Client, r *rand.Rand, alg sluice.Algorithm) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.T0.Add(time.Minute))
	mem := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	red := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})

	type key struct {
		name   string
		limit  sluice.Limit
		grants []sluice.Grant // live grants with units left to return
	}
	keys := make([]*key, 3)
	for i := range keys {
		l := sluice.Limit{Algorithm: alg, Rate: 5 + r.Int64N(200), Period: time.Hour}
		if alg < sluice.FixedWindow && r.IntN(2) == 0 {
			l.Burst = 1 + r.Int64N(l.Rate)
		}
		keys[i] = &key{name: fmt.Sprintf("k%d", i), limit: l}
	}
	for step := range grantDiffSteps {
		k := keys[r.IntN(len(keys))]
		where := fmt.Sprintf("step %d at %v on %s (%v)", step, clock.Now().Sub(storetest.T0), k.name, k.limit)
		switch op := r.IntN(10); {
		case op < 4:
			n := 1 + r.Int64N(k.limit.Capacity())
			gm, err1 := mem.Grant(ctx, k.name, k.limit, n)
			gr, err2 := red.Grant(ctx, k.name, k.limit, n)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: grant: %v, %v", where, err1, err2)
			}
			if gm != gr {
				t.Fatalf("%s: grant %d:\nmemory %+v\nredis  %+v", where, n, gm, gr)
			}
			if gm.Granted > 0 {
				k.grants = append(k.grants, gm)
			}
		case op < 6 && len(k.grants) > 0:
			i := r.IntN(len(k.grants))
			g := k.grants[i]
			k.grants = append(k.grants[:i], k.grants[i+1:]...)
			unused := 1 + r.Int64N(g.Granted)
			um, err1 := mem.Return(ctx, k.name, k.limit, g, unused)
			ur, err2 := red.Return(ctx, k.name, k.limit, g, unused)
			if err1 != nil || err2 != nil || um != ur {
				t.Fatalf("%s: return %d of %+v: memory %d, %v; redis %d, %v", where, unused, g, um, err1, ur, err2)
			}
		case op < 7:
			dm, err1 := mem.Take(ctx, k.name, k.limit, 1)
			dr, err2 := red.Take(ctx, k.name, k.limit, 1)
			if err1 != nil || err2 != nil || dm != dr {
				t.Fatalf("%s: take: memory %+v, %v; redis %+v, %v", where, dm, err1, dr, err2)
			}
		default:
			dm, err1 := mem.Peek(ctx, k.name, k.limit, 1)
			dr, err2 := red.Peek(ctx, k.name, k.limit, 1)
			if err1 != nil || err2 != nil || dm != dr {
				t.Fatalf("%s: peek: memory %+v, %v; redis %+v, %v", where, dm, err1, dr, err2)
			}
		}
		for _, rk := range red.Keys(k.name, k.limit) {
			if err := client.Do(ctx, "pexpire", rk, time.Hour.Milliseconds(), "gt").Err(); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(grantDiffAdvance(r, clock.Now()))
	}
}

// grantDiffAdvance is a random step of the clock that never stops within
// two seconds of an hour's end: often none, often under a second, now and
// then minutes.
func grantDiffAdvance(r *rand.Rand, now time.Time) time.Duration {
	var d time.Duration
	switch r.IntN(4) {
	case 0:
	case 1, 2:
		d = time.Duration(r.Int64N(int64(time.Second/time.Microsecond))) * time.Microsecond
	default:
		d = time.Duration(r.Int64N(int64(20*time.Minute/time.Microsecond))) * time.Microsecond
	}
	if left := now.Add(d).Truncate(time.Hour).Add(time.Hour).Sub(now.Add(d)); left < 2*time.Second {
		d += 4 * time.Second
	}
	return d
}
