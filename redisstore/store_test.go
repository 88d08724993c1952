package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

// The conformance suites (Store's and Granter's) with the caller's clock injected, on a standalone
// server and on a 3-master cluster, with concurrent calls batched into
// pipelines (the default; one pipeline in flight, so that the suite's
// concurrent steps do travel in batches) and with every call on its own.
func TestConformance(t *testing.T) {
	for _, c := range redistest.Deployments() {
		for _, m := range []struct {
			name            string
			batch, inFlight int
		}{{"batched", 0, 1}, {"unbatched", 1, 0}} {
			t.Run(c.Name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				client := c.Client(t)
				newStore := func(t *testing.T, now func() time.Time) sluice.Store {
					return redisstore.New(client, &redisstore.Options{
						Prefix: redistest.Prefix(t), Clock: now, MaxBatch: m.batch, MaxInFlight: m.inFlight,
					})
				}
				storetest.Run(t, newStore)
				storetest.RunGrant(t, newStore)
			})
		}
	}
}

// everyLimit has one limit per algorithm, long enough that nothing refills
// or expires while a test runs.
func everyLimit() []sluice.Limit {
	var ls []sluice.Limit
	for _, a := range sluice.Algorithms() {
		ls = append(ls, sluice.PerMinute(10).WithAlgorithm(a))
	}
	return ls
}

// existing returns the Redis keys that exist among keys.
func existing(t *testing.T, c redis.UniversalClient, keys ...string) []string {
	t.Helper()
	var found []string
	for _, k := range keys {
		n, err := c.Exists(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			found = append(found, k)
		}
	}
	return found
}

// scanPrefix returns every key under prefix, on every master.
func scanPrefix(t *testing.T, c redis.UniversalClient, prefix string) []string {
	t.Helper()
	pattern := globEscape(prefix) + "*"
	var (
		keys []string
		ctx  = context.Background()
	)
	scan := func(ctx context.Context, n *redis.Client) error {
		it := n.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			keys = append(keys, it.Val())
		}
		return it.Err()
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		var mu = make(chan struct{}, 1)
		err = c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu <- struct{}{}
			defer func() { <-mu }()
			return scan(ctx, n)
		})
	case *redis.Client:
		err = scan(ctx, c)
	default:
		t.Fatalf("scanPrefix: unsupported client %T", c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// TestNoScript: a flushed script cache costs nothing but a reload, for every
// algorithm and for TakeAll, on a standalone server and a cluster.
func TestNoScript(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		clock := storetest.NewClock(storetest.T0)
		s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
		for _, l := range everyLimit() {
			for i := range 3 {
				if err := c.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				d, err := s.Take(ctx, "k", l, 1)
				if err != nil {
					t.Fatalf("%v take %d after SCRIPT FLUSH: %v", l, i, err)
				}
				if got, want := d.Remaining, int64(10-i-1); !d.Allowed || got != want {
					t.Fatalf("%v take %d: %+v, want remaining %d", l, i, d, want)
				}
				c.ScriptFlush(ctx)
				if p, err := s.Peek(ctx, "k", l, 1); err != nil || p.Remaining != d.Remaining {
					t.Fatalf("%v peek after SCRIPT FLUSH: %+v %v", l, p, err)
				}
			}
		}
		c.ScriptFlush(ctx)
		reqs := []sluice.Request{
			{Key: "{tenant}a", Limit: sluice.PerMinute(5), Cost: 1},
			{Key: "{tenant}b", Limit: sluice.PerMinute(5).WithAlgorithm(sluice.FixedWindow), Cost: 2},
		}
		if ds, err := s.TakeAll(ctx, reqs); err != nil || !ds[0].Allowed || ds[1].Remaining != 3 {
			t.Fatalf("TakeAll after SCRIPT FLUSH: %+v %v", ds, err)
		}
	})
}

// TestRestartedServer: a server that crashed and came back (empty script
// cache, dead pooled connections) answers the next call without error.
func TestRestartedServer(t *testing.T) {
	ctx := context.Background()
	srv := redistest.StartServer(t)
	c := srv.Client(t)
	clock := storetest.NewClock(storetest.T0)
	for _, name := range []string{"caller clock", "server clock"} {
		t.Run(name, func(t *testing.T) {
			opts := &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now}
			if name == "server clock" {
				opts.Clock = nil
			}
			s := redisstore.New(c, opts)
			for _, l := range everyLimit() {
				if _, err := s.Take(ctx, "k", l, 3); err != nil {
					t.Fatal(err)
				}
				srv.Stop()
				srv.Start(t)
				// Nothing is persisted: the key starts fresh.
				d, err := s.Take(ctx, "k", l, 1)
				if err != nil {
					t.Fatalf("%v after restart: %v", l, err)
				}
				if !d.Allowed || d.Remaining != 9 {
					t.Fatalf("%v after restart: %+v, want a fresh key", l, d)
				}
			}
		})
	}
}

// TestBadInput: typed errors and nothing written, for Take, Peek, Reset and
// TakeAll, on every algorithm.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		prefix := redistest.Prefix(t)
		s := redisstore.New(c, &redisstore.Options{Prefix: prefix})
		for _, good := range everyLimit() {
			for _, tc := range storetest.BadInputs("k", good) {
				l := tc.ForAlgorithm(good.Algorithm)
				t.Run(good.Algorithm.String()+"/"+strings.ReplaceAll(tc.Name, " ", "_"), func(t *testing.T) {
					if _, err := s.Take(ctx, tc.Key, l, tc.Cost); !errors.Is(err, tc.Want) {
						t.Errorf("Take: %v, want %v", err, tc.Want)
					}
					if _, err := s.Peek(ctx, tc.Key, l, tc.Cost); !errors.Is(err, tc.Want) {
						t.Errorf("Peek: %v, want %v", err, tc.Want)
					}
					reqs := []sluice.Request{{Key: "other", Limit: good, Cost: 1}, {Key: tc.Key, Limit: l, Cost: tc.Cost}}
					if _, err := s.TakeAll(ctx, reqs); !errors.Is(err, tc.Want) {
						t.Errorf("TakeAll: %v, want %v", err, tc.Want)
					}
					if tc.Cost > 0 && tc.Cost <= l.Capacity() { // Reset takes no cost
						if err := s.Reset(ctx, tc.Key, l); !errors.Is(err, tc.Want) {
							t.Errorf("Reset: %v, want %v", err, tc.Want)
						}
					}
				})
			}
		}
		dup := []sluice.Request{{Key: "d", Limit: sluice.PerMinute(5), Cost: 1}, {Key: "d", Limit: sluice.PerSecond(5), Cost: 1}}
		if _, err := s.TakeAll(ctx, dup); !errors.Is(err, sluice.ErrInvalidKey) {
			t.Errorf("TakeAll with one key twice: %v, want ErrInvalidKey", err)
		}
		if keys := scanPrefix(t, c, prefix); len(keys) != 0 {
			t.Errorf("rejected calls wrote %v", keys)
		}
	})
}

// TestPeekWritesNothing: Peek on a fresh key, and a denied Take, leave no
// key behind.
func TestPeekWritesNothing(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
		for _, l := range everyLimit() {
			if d, err := s.Peek(ctx, "fresh", l, 10); err != nil || !d.Allowed || d.Remaining != 10 {
				t.Fatalf("%v: Peek of a fresh key: %+v %v", l, d, err)
			}
			if got := existing(t, c, s.Keys("fresh", l)...); len(got) != 0 {
				t.Errorf("%v: Peek wrote %v", l, got)
			}
		}
	})
}

// TestTTL: every key a take writes expires when its state is fresh again:
// 0 < PTTL <= ResetAfter rounded up to a millisecond.
func TestTTL(t *testing.T) {
	ctx := context.Background()
	for _, srv := range redistest.Deployments() {
		for _, clockName := range []string{"caller_clock", "server_clock"} {
			t.Run(srv.Name+"/"+clockName, func(t *testing.T) {
				c := srv.Client(t)
				opts := &redisstore.Options{Prefix: redistest.Prefix(t)}
				if clockName == "caller_clock" {
					opts.Clock = storetest.NewClock(storetest.T0.Add(1234567 * time.Microsecond)).Now
				}
				s := redisstore.New(c, opts)
				limits := everyLimit()
				for _, a := range sluice.Algorithms() {
					limits = append(limits, sluice.Limit{Algorithm: a, Rate: 3, Period: 7 * time.Hour})
				}
				for i, l := range limits {
					key := fmt.Sprintf("k%d", i)
					for _, cost := range []int64{1, 2} {
						d, err := s.Take(ctx, key, l, cost)
						if err != nil || !d.Allowed {
							t.Fatalf("%v: %+v %v", l, d, err)
						}
						for _, k := range s.Keys(key, l) {
							pttl, err := c.PTTL(ctx, k).Result()
							if err != nil {
								t.Fatal(err)
							}
							// TTLs are whole milliseconds, rounded up, and Redis
							// counts them on its own millisecond clock, which can
							// trail TIME by up to a millisecond: 2ms of slack.
							if pttl <= 0 || pttl > d.ResetAfter+2*time.Millisecond {
								t.Errorf("%v cost %d: PTTL %v, want in (0, %v]", l, cost, pttl, d.ResetAfter+2*time.Millisecond)
							}
						}
					}
				}
			})
		}
	}
}

// TestTTLOlderClock: a take by a caller whose clock lags the stored window
// (here by 500ms) leaves the key at least until that window's end as the
// newer clock sees it, and no longer than the ResetAfter it reports.
func TestTTLOlderClock(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		clock := storetest.NewClock(storetest.T0.Add(time.Second))
		s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
		for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter} {
			l := sluice.Limit{Algorithm: a, Rate: 1000, Period: time.Second}
			clock.Set(storetest.T0.Add(time.Second))
			if d, err := s.Take(ctx, "k", l, 500); err != nil || !d.Allowed {
				t.Fatalf("%v: %+v %v", l, d, err)
			}
			clock.Set(storetest.T0.Add(500 * time.Millisecond)) // 500ms behind
			d, err := s.Take(ctx, "k", l, 500)
			if err != nil || !d.Allowed {
				t.Fatalf("%v behind: %+v %v", l, d, err)
			}
			for _, k := range s.Keys("k", l) {
				pttl, err := c.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				// At least to the window's end as the newer clock sees
				// it (less the real time the test took).
				if pttl < d.ResetAfter-600*time.Millisecond || pttl > d.ResetAfter+2*time.Millisecond {
					t.Errorf("%v: PTTL %v for ResetAfter %v", l, pttl, d.ResetAfter)
				}
			}
		}
	})
}

// TestTTLLimitChange: on Redis's own clock, as deployed, a key taken under
// 5/s and then under a longer or shorter Period gets a TTL within the new
// limit's ResetAfter: a window counted in seconds read as one in minutes
// once set TTLs of millennia.
func TestTTLLimitChange(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
		for _, a := range sluice.Algorithms() {
			for i, to := range []time.Duration{time.Minute, 24 * time.Hour, 100 * time.Millisecond} {
				key := fmt.Sprintf("k%d", i)
				from := sluice.Limit{Algorithm: a, Rate: 5, Period: time.Second}
				l := sluice.Limit{Algorithm: a, Rate: 5, Period: to}
				for range 3 {
					if _, err := s.Take(ctx, key, from, 1); err != nil {
						t.Fatal(err)
					}
				}
				d, err := s.Take(ctx, key, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.RetryAfter < 0 || d.ResetAfter < 0 || d.ResetAfter > 2*to+sluice.MaxClockSkew {
					t.Errorf("%v then %v: %+v", from, l, d)
				}
				for _, k := range s.Keys(key, l) {
					pttl, err := c.PTTL(ctx, k).Result()
					if err != nil {
						t.Fatal(err)
					}
					if pttl > max(d.ResetAfter, from.Period)+2*time.Millisecond {
						t.Errorf("%v then %v: PTTL %v, ResetAfter %v", from, l, pttl, d.ResetAfter)
					}
				}
			}
		}
	})
}

// TestServerClock: with no Clock the scripts read Redis's TIME, and every
// algorithm still counts down, denies and reports a bounded wait.
func TestServerClock(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
		for _, a := range sluice.Algorithms() {
			l := sluice.PerHour(3).WithAlgorithm(a)
			for i := range 3 {
				d, err := s.Take(ctx, "k", l, 1)
				if err != nil || !d.Allowed || d.Remaining != int64(2-i) {
					t.Fatalf("%v take %d: %+v %v", l, i, d, err)
				}
			}
			d, err := s.Take(ctx, "k", l, 1)
			// The sliding counter may have to wait into the next window.
			if err != nil || d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 2*time.Hour || d.ResetAfter <= 0 {
				t.Fatalf("%v 4th take: %+v %v, want denied with a wait within two periods", l, d, err)
			}
			reqs := []sluice.Request{{Key: "{t}1", Limit: l, Cost: 1}, {Key: "{t}2", Limit: l, Cost: 3}}
			ds, err := s.TakeAll(ctx, reqs)
			if err != nil || !ds[0].Allowed || !ds[1].Allowed || ds[0].Remaining != 2 || ds[1].Remaining != 0 {
				t.Fatalf("%v TakeAll: %+v %v", l, ds, err)
			}
		}
	})
}

// TestTakeAll covers both paths: one script when the keys share a slot (on
// a cluster, through a common hash tag), and take-then-refund across slots.
// Either way a denial anywhere leaves every key as it was.
func TestTakeAll(t *testing.T) {
	ctx := context.Background()
	for _, srv := range redistest.Deployments() {
		for _, tc := range []struct {
			name string
			keys [2]string
		}{
			{"shared_tag", [2]string{"{tenant}:user", "{tenant}:ip"}}, // one slot
			{"two_slots", [2]string{"user", "ip"}},                    // apart on the cluster
		} {
			keys := tc.keys
			t.Run(srv.Name+"/"+tc.name, func(t *testing.T) {
				c := srv.Client(t)
				clock := storetest.NewClock(storetest.T0)
				s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
				for _, a := range sluice.Algorithms() {
					user := sluice.Request{Key: keys[0], Limit: sluice.PerMinute(10).WithAlgorithm(a), Cost: 2}
					ip := sluice.Request{Key: keys[1], Limit: sluice.PerMinute(5).WithAlgorithm(a), Cost: 2}
					before := make(map[string]string)
					for _, order := range [][]sluice.Request{{user, ip}, {ip, user}} {
						ds, err := s.TakeAll(ctx, order)
						if err != nil || !ds[0].Allowed || !ds[1].Allowed {
							t.Fatalf("%v: %+v %v", a, ds, err)
						}
					}
					// user has 6 left, ip 1: asking 2 of each denies on ip.
					for _, r := range []sluice.Request{user, ip} {
						before[r.Key] = dumpState(t, c, s.Keys(r.Key, r.Limit)[0])
					}
					for _, order := range [][]sluice.Request{{user, ip}, {ip, user}} {
						ds, err := s.TakeAll(ctx, order)
						if err != nil {
							t.Fatal(err)
						}
						u, i := ds[0], ds[1]
						if order[0].Key == ip.Key {
							u, i = i, u
						}
						if !u.Allowed || u.Remaining != 6 || i.Allowed || i.Remaining != 1 || i.RetryAfter <= 0 {
							t.Errorf("%v: user %+v, ip %+v; want user allowing with 6 left, ip denying", a, u, i)
						}
					}
					for _, r := range []sluice.Request{user, ip} {
						if got := dumpState(t, c, s.Keys(r.Key, r.Limit)[0]); got != before[r.Key] {
							t.Errorf("%v %s: a denied TakeAll changed\n%s\nto\n%s", a, r.Key, before[r.Key], got)
						}
					}
				}
			})
		}
	}
}

// dumpState prints a key's value, whatever its type, for comparisons.
func dumpState(t *testing.T, c redis.UniversalClient, key string) string {
	t.Helper()
	ctx := context.Background()
	typ, err := c.Type(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var v any
	switch typ {
	case "string":
		v, err = c.Get(ctx, key).Result()
	case "hash":
		v, err = c.HGetAll(ctx, key).Result()
	case "zset":
		v, err = c.ZRangeWithScores(ctx, key, 0, -1).Result()
	case "none":
	default:
		t.Fatalf("%s has type %s", key, typ)
	}
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s %v", typ, v)
}

// TestForeignState: a sluice key holding the wrong type or a value sluice
// never writes (not a number, NaN, an infinity, beyond 2^53, a fraction, a
// negative count) is ErrUnexpectedReply from Take, Peek and TakeAll, never
// a panic, a silent fresh start or a verdict drawn from it (a GCRA key
// holding "nan" denied forever, with no RetryAfter and no TTL).
func TestForeignState(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	clock := storetest.NewClock(storetest.T0)
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
	now := strconv.FormatInt(storetest.T0.UnixMicro(), 10)
	for _, l := range everyLimit() {
		key := s.Keys("k", l)[0]
		win := strconv.FormatInt(storetest.T0.UnixMicro()/l.Period.Microseconds(), 10) // now's fixed window
		type state struct {
			name string
			set  func() error
		}
		hash := func(name string, kv ...any) state {
			return state{name, func() error { return c.HSet(ctx, key, kv...).Err() }}
		}
		cases := []state{
			{"list", func() error { return c.RPush(ctx, key, "x").Err() }},
		}
		bad := []string{"not a number", "nan", "inf", "-inf", "1e300", "99999999999999999999999", "1.5"}
		switch l.Algorithm {
		case sluice.GCRA:
			for _, v := range bad {
				cases = append(cases, state{v, func() error { return c.Set(ctx, key, v, 0).Err() }})
			}
			cases = append(cases, hash("hash", "tokens", "1"))
		case sluice.SlidingWindowLog:
			cases = append(cases, state{"string", func() error { return c.Set(ctx, key, "a string", 0).Err() }})
		case sluice.TokenBucket, sluice.LeakyBucket:
			count := map[sluice.Algorithm]string{sluice.TokenBucket: "tokens", sluice.LeakyBucket: "level"}[l.Algorithm]
			for _, v := range append(bad, "-5") {
				cases = append(cases, hash(count+"="+v, count, v, "last", now))
			}
			for _, v := range bad {
				cases = append(cases, hash("last="+v, count, "1", "last", v))
			}
			cases = append(cases, state{"string", func() error { return c.Set(ctx, key, "1", 0).Err() }})
		case sluice.FixedWindow:
			for _, v := range append(bad, "-5") {
				cases = append(cases, hash("n="+v, "w", win, "n", v))
			}
			for _, v := range bad {
				cases = append(cases, hash("w="+v, "w", v, "n", "1"))
			}
		case sluice.SlidingWindowCounter:
			for _, v := range append(bad, "-5") {
				cases = append(cases, hash("c="+v, "w", win, "c", v, "p", "0"), hash("p="+v, "w", win, "c", "0", "p", v))
			}
			for _, v := range bad {
				cases = append(cases, hash("w="+v, "w", v, "c", "1", "p", "0"))
			}
		}
		for _, tc := range cases {
			t.Run(l.Algorithm.String()+"/"+tc.name, func(t *testing.T) {
				c.Del(ctx, key)
				if err := tc.set(); err != nil {
					t.Fatal(err)
				}
				if d, err := s.Take(ctx, "k", l, 1); !errors.Is(err, redisstore.ErrUnexpectedReply) {
					t.Errorf("Take: %+v, %v; want ErrUnexpectedReply", d, err)
				}
				if d, err := s.Peek(ctx, "k", l, 1); !errors.Is(err, redisstore.ErrUnexpectedReply) {
					t.Errorf("Peek: %+v, %v; want ErrUnexpectedReply", d, err)
				}
				reqs := []sluice.Request{{Key: "k", Limit: l, Cost: 1}}
				if ds, err := s.TakeAll(ctx, reqs); !errors.Is(err, redisstore.ErrUnexpectedReply) {
					t.Errorf("TakeAll: %+v, %v; want ErrUnexpectedReply", ds, err)
				}
			})
		}
		c.Del(ctx, key)
	}
}

// TestLogMembers: weighted takes add one member per unit, all distinct even
// within one microsecond, plus the sequence sentinel.
func TestLogMembers(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	clock := storetest.NewClock(storetest.T0)
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
	l := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 2500, Period: time.Minute}
	for _, cost := range []int64{1, 1, 1200, 1297} { // 1200 crosses a ZADD batch
		if d, err := s.Take(ctx, "k", l, cost); err != nil || !d.Allowed {
			t.Fatalf("cost %d: %+v %v", cost, d, err)
		}
	}
	key := s.Keys("k", l)[0]
	if n, err := c.ZCount(ctx, key, "0", "+inf").Result(); err != nil || n != 2499 {
		t.Errorf("%d entries (%v), want 2499", n, err)
	}
	if n, _ := c.ZCard(ctx, key).Result(); n != 2500 {
		t.Errorf("ZCARD %d, want 2499 entries and the sentinel", n)
	}
	if d, err := s.Take(ctx, "k", l, 2); err != nil || d.Allowed || d.RetryAfter != time.Minute {
		t.Errorf("over the limit: %+v %v, want denied for a minute", d, err)
	}
}

// TestBackendError: a failing server is an error wrapped by the store, not
// a denial.
func TestBackendError(t *testing.T) {
	srv := redistest.StartServer(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, nil)
	srv.Stop()
	for _, l := range everyLimit() {
		if d, err := s.Take(context.Background(), "k", l, 1); err == nil || !strings.HasPrefix(err.Error(), "redisstore: ") {
			t.Errorf("%v on a dead server: %+v %v", l, d, err)
		}
	}
	reqs := []sluice.Request{{Key: "a", Limit: sluice.PerMinute(1), Cost: 1}, {Key: "b", Limit: sluice.PerMinute(1), Cost: 1}}
	if _, err := s.TakeAll(context.Background(), reqs); err == nil {
		t.Error("TakeAll on a dead server: no error")
	}
}

// TestNoClient: a Store without a client fails with ErrNoClient, never a
// panic.
func TestNoClient(t *testing.T) {
	for _, s := range []*redisstore.Store{redisstore.New(nil, nil), {}} {
		storetest.Refuses(t, s, redisstore.ErrNoClient)
	}
}

// TestTakeAllMatchesMemory: random layered requests (one to three limits
// over three keys, every algorithm) decide exactly as the memory store's
// TakeAll, on the one-script path (standalone, and keys with a common hash
// tag on the cluster) and on the take-and-refund path (cluster, untagged
// keys in different slots). Each algorithm keeps one limit, so a key's
// state always means the same thing to both stores.
func TestTakeAllMatchesMemory(t *testing.T) {
	for name, keys := range map[string][3]string{"untagged": {"k0", "k1", "k2"}, "tagged": {"api:{t}:k0", "{t}:k1", "k2{t}"}} {
		// A name with a hash tag would give the Prefix one.
		t.Run(name, func(t *testing.T) { t.Parallel(); takeAllMatchesMemory(t, keys) })
	}
}

func takeAllMatchesMemory(t *testing.T, keys [3]string) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		t.Parallel()
		rng := rand.New(rand.NewPCG(1, 99))
		clock := storetest.NewClock(storetest.T0)
		rs := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
		ms := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
		for step := range 2000 {
			clock.Advance(time.Duration(rng.Int64N(int64(3*time.Second))) / time.Microsecond * time.Microsecond)
			n := 1 + rng.IntN(3)
			var reqs []sluice.Request
			perm := rng.Perm(6)
			for j := range n {
				a := sluice.Algorithm(perm[j])
				l := sluice.Limit{Algorithm: a, Rate: int64(3 + perm[j]%3), Period: 10 * time.Second}
				reqs = append(reqs, sluice.Request{Key: keys[rng.IntN(3)], Limit: l, Cost: 1 + rng.Int64N(3)})
			}
			dr, er := rs.TakeAll(ctx, reqs)
			dm, em := ms.TakeAll(ctx, reqs)
			if er != nil || em != nil {
				t.Fatal(er, em)
			}
			for j := range dr {
				if dr[j] != dm[j] {
					t.Fatalf("step %d req %d %+v:\nredis  %+v\nmemory %+v", step, j, reqs, dr, dm)
				}
			}
		}
	})
}
