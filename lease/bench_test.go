package lease_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// BenchmarkLocal is a decision answered from a live lease: the local path,
// one goroutine and parallel, beside the memory store's own decision on
// a key of the same limit. The lease is large enough never to run out in
// the timed loop, and the memory store's key never denies.
func BenchmarkLocal(b *testing.B) {
	m := memory.New(&memory.Options{SweepInterval: -1})
	b.Cleanup(func() { m.Close() })
	l := sluice.Limit{Rate: 1e9, Period: time.Hour}
	s, err := lease.New(m, &lease.Options{MaxStaleness: time.Hour, Size: 5e8})
	if err != nil {
		b.Fatal(err)
	}
	if d, err := s.Take(ctx, "hot", l, 1); err != nil || !d.Allowed {
		b.Fatal(d, err)
	}
	for _, c := range []struct {
		name, key string
		store     sluice.Store
	}{{"lease", "hot", s}, {"memory", "mem", m}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.store.Take(ctx, c.key, l, 1)
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.store.Take(ctx, c.key, l, 1)
				}
			})
		})
	}
	if got := s.Stats(); got.Grants != 1 {
		b.Fatalf("%d grants: the lease ran out", got.Grants)
	}
}

// refillDelay is what BenchmarkRedisRefill adds to every round trip to
// Redis: a store across a slow link.
const refillDelay = 30 * time.Millisecond

// delayed is a go-redis hook that holds every command, and every pipeline,
// refillDelay before sending it, and counts the round trips.
type delayed struct{ trips atomic.Int64 }

func (h *delayed) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *delayed) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips.Add(1)
		time.Sleep(refillDelay)
		return next(ctx, cmd)
	}
}

func (h *delayed) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips.Add(1)
		time.Sleep(refillDelay)
		return next(ctx, cmds)
	}
}

// BenchmarkRedisRefill is a request that its lease cannot cover, under the
// limit, on a real Redis whose round trips each take refillDelay more: the
// lease's leftover goes back and a new lease is granted, in one regrant,
// and (return+grant) as a return and then a grant, over a granter that
// cannot regrant. It reports the median and the 99th percentile of the
// request's latency, and round trips per request.
func BenchmarkRedisRefill(b *testing.B) {
	client := redistest.Client(b)
	var hook delayed
	client.AddHook(&hook)
	rs := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(b)})
	l := sluice.Limit{Rate: 1e6, Period: time.Hour}
	for _, c := range []struct {
		name string
		g    sluice.Granter
	}{{"regrant", rs}, {"return+grant", struct{ sluice.Granter }{rs}}} {
		b.Run(c.name, func(b *testing.B) {
			s, err := lease.New(c.g, &lease.Options{MaxStaleness: time.Minute, Size: 3})
			if err != nil {
				b.Fatal(err)
			}
			// Each request costs 2 of a lease of 3: the 1 left cannot cover
			// the next, which refills.
			if d, err := s.Take(ctx, c.name, l, 2); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			var lat []time.Duration
			trips := hook.trips.Load()
			for b.Loop() {
				start := time.Now()
				d, err := s.Take(ctx, c.name, l, 2)
				lat = append(lat, time.Since(start))
				if err != nil || !d.Allowed || d.Source != sluice.SourceBackend {
					b.Fatalf("refill = %+v, %v; want allowed by a new lease", d, err)
				}
			}
			n := len(lat)
			b.ReportMetric(float64(hook.trips.Load()-trips)/float64(n), "round-trips/op")
			slices.Sort(lat)
			b.ReportMetric(float64(lat[n/2])/1e6, "p50-ms")
			b.ReportMetric(float64(lat[n*99/100])/1e6, "p99-ms")
		})
	}
}

// BenchmarkTakeAll is a layered TakeAll of two checks on the memory store,
// each on a lease that lives through the timed loop: leased, both answered
// from their live leases (admitted); denied, the first check denied by
// its remembered denial (SourceDenyCache, as an overloaded key's are) and
// the second's lease able to admit, the hottest path of a key under
// closed-loop overload.
func BenchmarkTakeAll(b *testing.B) {
	plenty := sluice.Limit{Rate: 1e9, Period: time.Hour}
	// One unit per half hour: once spent, a grant of nothing is remembered
	// for its RetryAfter, under the staleness (so the other check's lease
	// is not given back for it, see quiet).
	scarce := sluice.Limit{Rate: 2, Period: time.Hour}
	for _, c := range []struct {
		name  string
		first sluice.Limit
		src   sluice.Source
	}{{"leased", plenty, sluice.SourceLease}, {"denied", scarce, sluice.SourceDenyCache}} {
		b.Run(c.name, func(b *testing.B) {
			m := memory.New(&memory.Options{SweepInterval: -1})
			b.Cleanup(func() { m.Close() })
			s, err := lease.New(m, &lease.Options{MaxStaleness: time.Hour, Size: 5e8})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close(ctx) })
			reqs := []sluice.Request{{Key: "a", Limit: c.first, Cost: 1}, {Key: "b", Limit: plenty, Cost: 1}}
			for range 3 {
				if _, err := s.TakeAll(ctx, reqs); err != nil {
					b.Fatal(err)
				}
			}
			ds, err := s.TakeAll(ctx, reqs)
			if err != nil || ds[0].Source != c.src || ds[0].Allowed != (c.src == sluice.SourceLease) || !ds[1].Allowed || ds[1].Source != sluice.SourceLease {
				b.Fatalf("TakeAll = %+v, %v; want the first check %v", ds, err, c.src)
			}
			grants := s.Stats().Grants
			b.ReportAllocs()
			for b.Loop() {
				s.TakeAll(ctx, reqs)
			}
			if got := s.Stats().Grants; got != grants {
				b.Fatalf("%d grants in the timed loop, want none", got-grants)
			}
		})
	}
}
