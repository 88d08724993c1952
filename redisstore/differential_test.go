package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// The differential test holds the Lua scripts to the memory store's Go, which
// is the specification: random traces drive both stores with one fake clock,
// and every step must give the same Decision (Allowed, Remaining and Limit
// equal; RetryAfter and ResetAfter within diffTolerance).
//
// Environment:
//
//	SLUICE_DIFF_SEED   the seed (default diffDefaultSeed); a failure prints it
//	SLUICE_DIFF_STEPS  steps per trace (default diffDefaultSteps)
//
// Redis TTLs run in real time while the fake clock jumps, so a key written
// with a short TTL (a fixed window taken 1µs before its end gets 1ms) could
// vanish from Redis while the memory store still holds its state. Before
// each step the test raises the key's TTL to at least diffTTLFloor, far
// longer than the test runs, in one atomic script; after a take with a short
// ResetAfter it does so again at once. Redis therefore keeps state past the
// point where the memory store calls it fresh, and the scripts must decide on
// such stale state exactly as on a missing key, which this test checks along
// the way. Should a key still have expired in real time before a step (its
// TTL was shorter than the round trip that raised it), the memory store's key
// is reset too and the trace goes on; the test fails instead if Redis lost a
// key whose TTL cannot have run out.
const (
	diffDefaultSeed  = 20260101
	diffDefaultSteps = 10_000
	diffTraces       = 2 // per algorithm; each draws its own limits
	diffKeys         = 4 // per trace, each under its own random limit
	diffTolerance    = time.Millisecond
	diffTTLFloor     = time.Hour
	diffShortTTL     = time.Second // raise at once after a take leaving less
	diffHistoryShown = 40
	diffMaxIdleGap   = 48 * time.Hour
	diffSeedEnv      = "SLUICE_DIFF_SEED"
	diffStepsEnv     = "SLUICE_DIFF_STEPS"
)

type diffOp uint8

const (
	diffTake diffOp = iota
	diffPeek
	diffReset
	diffResync // Redis expired the key in real time; the memory store's key was reset to match
)

func (o diffOp) String() string {
	return [...]string{"take", "peek", "reset", "resync"}[o]
}

// diffStep is one call and both stores' answers.
type diffStep struct {
	step     int // in the trace
	at       time.Time
	key      int
	op       diffOp
	cost     int64
	mem, red sluice.Decision
}

// diffKey is one key of a trace.
type diffKey struct {
	name  string
	limit sluice.Limit
	redis string          // the Redis key holding its state
	last  sluice.Decision // the previous decision on this key (drives "exact retry" gaps)
	steps []int           // indices of this key's steps since its last reset
	// safeUntil is the real time before which Redis cannot have expired the
	// key: its TTL was raised to diffTTLFloor, or set to ResetAfter, no
	// earlier than the call was sent.
	safeUntil time.Time
}

// diffSeed is SLUICE_DIFF_SEED, or diffDefaultSeed.
func diffSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(diffDefaultSeed)
	if v := os.Getenv(diffSeedEnv); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", diffSeedEnv, v, err)
		}
		seed = s
	}
	return seed
}

func TestDifferential(t *testing.T) {
	seed := diffSeed(t)
	steps := diffDefaultSteps
	if v := os.Getenv(diffStepsEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", diffStepsEnv, v)
		}
		steps = n
	}
	t.Logf("seed %d, %d steps per trace (%s=%d to repeat)", seed, steps, diffSeedEnv, seed)
	client := redistest.Client(t)

	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			for trace := range diffTraces {
				t.Run(fmt.Sprintf("trace%d", trace), func(t *testing.T) {
					// One stream per (algorithm, trace), so a subtest replays
					// alone with -run.
					r := rand.New(rand.NewPCG(seed, uint64(alg)<<8|uint64(trace)))
					runDiffTrace(t, client, r, alg, steps, seed)
				})
			}
		})
	}
}

// diffStores returns the two stores a differential test holds to each
// other, both on clock: the memory store, which never sweeps, and a Redis
// store under the test's own prefix.
func diffStores(t *testing.T, client *redis.Client, clock *storetest.Clock) (*memory.Store, *redisstore.Store) {
	mem := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	return mem, redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
}

func runDiffTrace(t *testing.T, client *redis.Client, r *rand.Rand, alg sluice.Algorithm, n int, seed uint64) {
	ctx := context.Background()
	start := storetest.T0.Add(time.Duration(r.Int64N(int64(24*time.Hour/time.Microsecond))) * time.Microsecond)
	clock := storetest.NewClock(start)
	mem, red := diffStores(t, client, clock)

	keys := make([]diffKey, diffKeys)
	var written []string
	for i := range keys {
		keys[i] = diffKey{name: fmt.Sprintf("k%d", i), limit: diffLimit(r, alg)}
		rk := red.Keys(keys[i].name, keys[i].limit)
		if len(rk) != 1 {
			t.Fatalf("Store.Keys(%q) = %q: this test expects one Redis key per key", keys[i].name, rk)
		}
		keys[i].redis = rk[0]
		written = append(written, rk[0])
	}
	t.Cleanup(func() { client.Del(context.Background(), written...) })

	hist := make([]diffStep, 0, n+16)
	exact, compared, resyncs := 0, 0, 0
	for i := range n {
		ki := r.IntN(len(keys))
		k := &keys[ki]
		clock.Advance(diffGap(r, clock.Now(), k))
		s := diffStep{step: i, at: clock.Now(), key: ki, op: diffTake, cost: diffCost(r, k.limit)}
		switch p := r.IntN(100); {
		case p < 1:
			s.op = diffReset
		case p < 11:
			s.op = diffPeek
		}

		if s.op != diffReset {
			sent := time.Now()
			switch ttl := raiseTTL(t, client, k.redis); {
			case ttl >= 0:
				k.safeUntil = sent.Add(diffTTLFloor)
			case ttl == -1:
				t.Fatalf("step %d: Redis key %s has no TTL\n%s", i, k.redis, diffReport(hist, k, start))
			default: // gone: fine if the memory store's state is fresh too
				if d, _ := mem.Peek(ctx, k.name, k.limit, 1); d.ResetAfter > 0 {
					if time.Now().Before(k.safeUntil) {
						t.Fatalf("step %d: Redis lost key %s before its TTL can have run out; the memory store holds state for %v more\n%s",
							i, k.redis, d.ResetAfter, diffReport(hist, k, start))
					}
					mem.Reset(ctx, k.name, k.limit)
					hist = append(hist, diffStep{step: i, at: s.at, key: ki, op: diffResync})
					k.steps = append(k.steps[:0], len(hist)-1)
					resyncs++
				}
			}
		}

		var errM, errR error
		var sent time.Time
		switch s.op {
		case diffTake:
			s.mem, errM = mem.Take(ctx, k.name, k.limit, s.cost)
			sent = time.Now()
			s.red, errR = red.Take(ctx, k.name, k.limit, s.cost)
		case diffPeek:
			s.mem, errM = mem.Peek(ctx, k.name, k.limit, s.cost)
			s.red, errR = red.Peek(ctx, k.name, k.limit, s.cost)
		case diffReset:
			errM = mem.Reset(ctx, k.name, k.limit)
			errR = red.Reset(ctx, k.name, k.limit)
		}
		if errM != nil || errR != nil {
			t.Fatalf("step %d (%v %s cost %d): memory error %v, redis error %v", i, s.op, k.name, s.cost, errM, errR)
		}
		hist = append(hist, s)
		if s.op == diffReset {
			k.steps = k.steps[:0]
			k.last = sluice.Decision{}
			continue
		}
		k.steps = append(k.steps, len(hist)-1)
		k.last = s.mem

		if !diffSame(s.mem, s.red, diffTolerance) {
			t.Fatalf("step %d: %s cost %d at t=%d µs: memory and redis disagree\n  memory: %s\n  redis:  %s\n%s"+
				"repeat: %s=%d go test -run '^%s$' ./redisstore/",
				i, s.op, s.cost, s.at.UnixMicro(), fmtDecision(s.mem), fmtDecision(s.red),
				diffReport(hist, k, start), diffSeedEnv, seed, t.Name())
		}
		compared++
		if diffSame(s.mem, s.red, 0) {
			exact++
		}
		if s.op == diffTake && s.red.Allowed {
			k.safeUntil = sent.Add(s.red.ResetAfter)
			if s.red.ResetAfter < diffShortTTL {
				raised := time.Now()
				if raiseTTL(t, client, k.redis) >= 0 {
					k.safeUntil = raised.Add(diffTTLFloor)
				}
			}
		}
	}
	if exact != compared {
		t.Logf("%d of %d decisions differ, by at most %v, in RetryAfter or ResetAfter", compared-exact, compared, diffTolerance)
	}
	allowed := 0
	for _, s := range hist {
		if s.op == diffTake && s.mem.Allowed {
			allowed++
		}
	}
	t.Logf("%d steps, %d takes allowed, %d keys resynced after expiring in real time, fake time %v; limits %s",
		n, allowed, resyncs, clock.Now().Sub(start), diffLimits(keys))
}

// diffLimit draws a valid limit: small rates (where boundaries are hit often),
// periods from a second to a day including ones that rates do not divide,
// and for the bucket algorithms a burst below, at or above the rate.
func diffLimit(r *rand.Rand, alg sluice.Algorithm) sluice.Limit {
	periods := []time.Duration{
		time.Second, 3 * time.Second, 10 * time.Second, time.Minute, 90 * time.Second,
		7 * time.Minute, time.Hour, 24 * time.Hour,
	}
	for {
		l := sluice.Limit{Algorithm: alg, Period: periods[r.IntN(len(periods))]}
		switch p := r.IntN(10); {
		case p < 6:
			l.Rate = 1 + r.Int64N(10)
		case p < 9:
			l.Rate = 1 + r.Int64N(100)
		default:
			l.Rate = 1 + r.Int64N(1000)
		}
		if alg == sluice.GCRA || alg == sluice.TokenBucket || alg == sluice.LeakyBucket {
			switch r.IntN(3) {
			case 0: // burst = rate
			case 1:
				l.Burst = 1 + r.Int64N(l.Rate)
			case 2:
				l.Burst = l.Rate + r.Int64N(3*l.Rate)
			}
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// diffCost is mostly 1, sometimes anything up to the capacity.
func diffCost(r *rand.Rand, l sluice.Limit) int64 {
	switch p := r.IntN(10); {
	case p < 5:
		return 1
	case p < 9:
		return 1 + r.Int64N(l.Capacity())
	default:
		return l.Capacity()
	}
}

// diffGap draws how far the clock moves before the next call on k: zero
// (several calls in one microsecond), tiny, within one unit's interval,
// within the time to refill (or one window), across windows, long idle, or
// exactly at (±1µs) the instant the last decision named: its RetryAfter, its
// ResetAfter, or the next window boundary; or back by up to 2ms, as a
// caller whose clock lags another's (or Redis's TIME after a failover).
func diffGap(r *rand.Rand, now time.Time, k *diffKey) time.Duration {
	us := func(hi time.Duration) time.Duration { // uniform in [1µs, hi]
		return time.Duration(1+r.Int64N(max(int64(hi/time.Microsecond), 1))) * time.Microsecond
	}
	jitter := time.Duration(r.IntN(3)-1) * time.Microsecond
	interval := k.limit.Interval()
	scale := k.limit.Period // one window, or the time from empty to full
	if k.limit.Algorithm == sluice.GCRA || k.limit.Algorithm == sluice.TokenBucket || k.limit.Algorithm == sluice.LeakyBucket {
		scale = time.Duration(k.limit.Capacity()) * interval
	}
	switch p := r.IntN(100); {
	case p < 20:
		return 0
	case p < 32:
		return us(time.Millisecond)
	case p < 50:
		return us(interval)
	case p < 68:
		return us(scale)
	case p < 76:
		return scale + us(2*scale)
	case p < 80:
		return 3*scale + us(min(100*scale, diffMaxIdleGap))
	case p < 88:
		return max(k.last.RetryAfter+jitter, 0)
	case p < 94:
		return max(k.last.ResetAfter+jitter, 0)
	case p < 97: // the next window boundary, counted from the Unix epoch
		period := k.limit.Period
		into := time.Duration(now.UnixMicro()%period.Microseconds()) * time.Microsecond
		return max(period-into+jitter, 0)
	default:
		return -us(2 * time.Millisecond)
	}
}

// raiseTTL raises key's TTL to at least diffTTLFloor and returns the PTTL it
// had: -2 if the key is missing, -1 if it has no TTL.
func raiseTTL(t *testing.T, c *redis.Client, key string) int64 {
	t.Helper()
	ttl, err := raiseTTLScript.Run(context.Background(), c, []string{key}, diffTTLFloor.Milliseconds()).Int64()
	if err != nil {
		t.Fatalf("raising the TTL of %s: %v", key, err)
	}
	return ttl
}

// raiseTTLScript returns the key's PTTL and raises it to ARGV[1] ms if lower.
var raiseTTLScript = redis.NewScript(`
local ttl = redis.call('PTTL', KEYS[1])
if ttl >= 0 and ttl < tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return ttl
`)

func diffSame(a, b sluice.Decision, tol time.Duration) bool {
	near := func(x, y time.Duration) bool { return x-y <= tol && y-x <= tol }
	return a.Allowed == b.Allowed && a.Remaining == b.Remaining && a.Limit == b.Limit &&
		near(a.RetryAfter, b.RetryAfter) && near(a.ResetAfter, b.ResetAfter)
}

func diffLimits(keys []diffKey) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %q", k.name, k.limit.String())
	}
	return b.String()
}

func fmtDecision(d sluice.Decision) string {
	return fmt.Sprintf("allowed=%-5v remaining=%-4d retry=%-12v reset=%v", d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter)
}

// diffReport describes key k: its limit and its history since it was last
// reset (memory's decisions; Redis agreed with each, within diffTolerance,
// unless the last step is the mismatch reported above it).
func diffReport(hist []diffStep, k *diffKey, start time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key %s, limit %q (%+v), trace start %d µs\n", k.name, k.limit.String(), k.limit, start.UnixMicro())
	shown := k.steps
	if len(shown) > diffHistoryShown {
		fmt.Fprintf(&b, "history: %d steps since the last reset, the last %d shown\n", len(shown), diffHistoryShown)
		shown = shown[len(shown)-diffHistoryShown:]
	} else {
		fmt.Fprintf(&b, "history since the last reset:\n")
	}
	var prev time.Time
	for _, i := range shown {
		s := hist[i]
		gap := "-"
		if !prev.IsZero() {
			gap = "+" + s.at.Sub(prev).String()
		}
		prev = s.at
		fmt.Fprintf(&b, "  step %-5d t=%d µs %14s  %-6s %-4d %s\n", s.step, s.at.UnixMicro(), gap, s.op, s.cost, fmtDecision(s.mem))
	}
	return b.String()
}

// grantDiffSteps is the length of each differential grant trace.
const grantDiffSteps = 600

// The grant script is held to the memory store's Go: random traces of
// grants, returns, regrants, takes, peeks and resets on a few keys drive
// both stores with one fake clock, and every answer must be the same; a
// third of the steps land on the key's last ResetAfter exactly, where a
// GCRA key's TAT is now and the memory store holds it no more. Each store
// is returned its own grants: their epochs are each store's count of
// Resets, compared by neither. Periods are an hour and the clock never
// stops within two seconds of a window's end, and every key's TTL is
// raised after each write, so that Redis's real-time expiry cannot drop a
// key the memory store still holds.
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
	mem, red := diffStores(t, client, clock)

	type key struct {
		name   string
		limit  sluice.Limit
		grants [][2]sluice.Grant // live grants with units left to return: memory's, Redis's
		reset  time.Duration     // the last ResetAfter reported
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
			if !sameGrant(gm, gr) {
				t.Fatalf("%s: grant %d:\nmemory %+v\nredis  %+v", where, n, gm, gr)
			}
			if gm.Granted > 0 {
				k.grants = append(k.grants, [2]sluice.Grant{gm, gr})
			}
			k.reset = gm.ResetAfter
		case op < 6 && len(k.grants) > 0:
			i := r.IntN(len(k.grants))
			g := k.grants[i]
			k.grants = append(k.grants[:i], k.grants[i+1:]...)
			unused := 1 + r.Int64N(g[0].Granted)
			um, err1 := mem.Return(ctx, k.name, k.limit, g[0], unused)
			ur, err2 := red.Return(ctx, k.name, k.limit, g[1], unused)
			if err1 != nil || err2 != nil || um != ur {
				t.Fatalf("%s: return %d of %+v: memory %d, %v; redis %d, %v", where, unused, g, um, err1, ur, err2)
			}
		case op < 7 && len(k.grants) > 0:
			i := r.IntN(len(k.grants))
			g := k.grants[i]
			k.grants = append(k.grants[:i], k.grants[i+1:]...)
			unused, n := 1+r.Int64N(g[0].Granted), 1+r.Int64N(k.limit.Capacity())
			um, gm, err1 := mem.Regrant(ctx, k.name, k.limit, g[0], unused, n)
			ur, gr, err2 := red.Regrant(ctx, k.name, k.limit, g[1], unused, n)
			if err1 != nil || err2 != nil || um != ur || !sameGrant(gm, gr) {
				t.Fatalf("%s: regrant %d of %+v, then %d:\nmemory %d, %+v, %v\nredis  %d, %+v, %v", where, unused, g, n, um, gm, err1, ur, gr, err2)
			}
			if gm.Granted > 0 {
				k.grants = append(k.grants, [2]sluice.Grant{gm, gr})
			}
		case op < 8:
			dm, err1 := mem.Take(ctx, k.name, k.limit, 1)
			dr, err2 := red.Take(ctx, k.name, k.limit, 1)
			if err1 != nil || err2 != nil || dm != dr {
				t.Fatalf("%s: take: memory %+v, %v; redis %+v, %v", where, dm, err1, dr, err2)
			}
			k.reset = dm.ResetAfter
		case op < 9 && r.IntN(8) == 0:
			if err1, err2 := mem.Reset(ctx, k.name, k.limit), red.Reset(ctx, k.name, k.limit); err1 != nil || err2 != nil {
				t.Fatalf("%s: reset: %v, %v", where, err1, err2)
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
		if k.reset > 0 && r.IntN(3) == 0 {
			clock.Advance(k.reset) // to the key's expiry exactly
			k.reset = 0
		} else {
			clock.Advance(grantDiffAdvance(r, clock.Now()))
		}
	}
}

// sameGrant reports whether two stores' grants are the same but for their
// epochs, each store's own count of Resets (Redis keeps its count for its
// horizon in real time, which the fake clock outruns).
func sameGrant(m, r sluice.Grant) bool {
	m.Epoch, r.Epoch = 0, 0
	return m == r
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

// limitChangeSteps is how many calls each limit of a limit-change sequence
// gets in TestDifferentialLimitChange.
const limitChangeSteps = 30

// The scripts decide as the memory store does on state written under
// another limit: storetest's limit-change sequences, each limit in turn
// (and then once more) given random takes and peeks on one key of both
// stores, one fake clock, every decision the same. A policy reloaded with
// another Period, Rate or Burst keeps its keys, so each limit reads what the
// one before it wrote.
//
// Redis's TTLs run in real time while the fake clock jumps, and state read
// past its TTL under another limit is not always a fresh key's (a longer
// interval refills it more slowly than its TTL assumed). So the test
// expires the key on both stores when the fake clock reaches the memory
// store's expiry (the last allowed take's ResetAfter), and otherwise holds
// the Redis key up with diffTTLFloor.
func TestDifferentialLimitChange(t *testing.T) {
	seed := diffSeed(t)
	client := redistest.Client(t)
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 1<<16|uint64(alg)))
			for i, seq := range storetest.LimitChanges(alg) {
				t.Run(fmt.Sprint(i), func(t *testing.T) { runLimitChangeDiff(t, client, r, append(seq, seq...), seed) })
			}
		})
	}
}

func runLimitChangeDiff(t *testing.T, client *redis.Client, r *rand.Rand, seq []sluice.Limit, seed uint64) {
	ctx := context.Background()
	start := storetest.T0.Add(time.Duration(r.Int64N(int64(24*time.Hour/time.Microsecond))) * time.Microsecond)
	clock := storetest.NewClock(start)
	mem, red := diffStores(t, client, clock)
	k := &diffKey{name: "k"}
	k.redis = red.Keys(k.name, seq[0])[0]
	t.Cleanup(func() { client.Del(context.Background(), k.redis) })
	var (
		expires time.Time // the memory store's expiry of the key; zero: fresh
		hist    []diffStep
	)
	for i := range len(seq) * limitChangeSteps {
		k.limit = seq[i/limitChangeSteps]
		if i%limitChangeSteps != 0 { // a new limit reads the state at once
			clock.Advance(diffGap(r, clock.Now(), k))
		}
		now := clock.Now()
		if !expires.IsZero() && !now.Before(expires) {
			// Both fresh: the memory store keeps an expired state until it
			// sweeps, for a caller whose clock steps back to read.
			if err := client.Del(ctx, k.redis).Err(); err != nil {
				t.Fatal(err)
			}
			if err := mem.Reset(ctx, k.name, k.limit); err != nil {
				t.Fatal(err)
			}
			expires = time.Time{}
		} else if !expires.IsZero() && raiseTTL(t, client, k.redis) < 0 {
			t.Fatalf("step %d: Redis lost key %s, which the memory store holds until %v\n%s", i, k.redis, expires.Sub(start), diffReport(hist, k, start))
		}
		s := diffStep{step: i, at: now, op: diffTake, cost: diffCost(r, k.limit)}
		var errM, errR error
		var sent time.Time
		if r.IntN(5) == 0 {
			s.op = diffPeek
			s.mem, errM = mem.Peek(ctx, k.name, k.limit, s.cost)
			s.red, errR = red.Peek(ctx, k.name, k.limit, s.cost)
		} else {
			s.mem, errM = mem.Take(ctx, k.name, k.limit, s.cost)
			sent = time.Now()
			s.red, errR = red.Take(ctx, k.name, k.limit, s.cost)
		}
		if errM != nil || errR != nil {
			t.Fatalf("step %d (%v %s cost %d): memory error %v, redis error %v", i, s.op, k.name, s.cost, errM, errR)
		}
		hist = append(hist, s)
		k.steps = append(k.steps, len(hist)-1)
		k.last = s.mem
		if !diffSame(s.mem, s.red, diffTolerance) {
			t.Fatalf("step %d: %s cost %d at t=%d µs under %v (limits %v): memory and redis disagree\n  memory: %s\n  redis:  %s\n%s"+
				"repeat: %s=%d go test -run '^%s$' ./redisstore/",
				i, s.op, s.cost, s.at.UnixMicro(), k.limit, seq, fmtDecision(s.mem), fmtDecision(s.red),
				diffReport(hist, k, start), diffSeedEnv, seed, t.Name())
		}
		if s.op == diffTake && s.mem.Allowed {
			expires = now.Add(s.mem.ResetAfter)
			if s.mem.ResetAfter == 0 {
				// Fresh at once: Redis deleted the key. The memory store
				// holds it until it sweeps, so a clock that then steps back
				// would read it there alone.
				if err := mem.Reset(ctx, k.name, k.limit); err != nil {
					t.Fatal(err)
				}
				expires = time.Time{}
			} else if raiseTTL(t, client, k.redis) == -2 {
				// The script set a TTL of ResetAfter rounded up to a
				// millisecond; a slow machine may reach here after it ran
				// out. Both are fresh then, as at ResetAfter 0.
				if time.Since(sent) < s.red.ResetAfter.Round(time.Millisecond)+time.Millisecond {
					t.Fatalf("step %d: Redis lost key %s at once (ResetAfter %v)", i, k.redis, s.red.ResetAfter)
				}
				if err := mem.Reset(ctx, k.name, k.limit); err != nil {
					t.Fatal(err)
				}
				expires = time.Time{}
			}
		}
	}
}
