package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// TestTakeAllMatchesMemory: random layered requests (one to three limits
// over three keys, every algorithm) decide exactly as the memory store's
// TakeAll, on the one-script path (standalone) and on the take-and-refund
// path (cluster, keys in different slots). Each algorithm keeps one limit,
// so a key's state always means the same thing to both stores.
func TestTakeAllMatchesMemory(t *testing.T) {
	ctx := context.Background()
	for _, srv := range redistest.Deployments() {
		t.Run(srv.Name, func(t *testing.T) {
			t.Parallel()
			c := srv.Client(t)
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
					reqs = append(reqs, sluice.Request{Key: fmt.Sprint("k", rng.IntN(3)), Limit: l, Cost: 1 + rng.Int64N(3)})
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
}
