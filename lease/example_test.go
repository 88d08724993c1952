package lease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
)

// A lease of 5 units answers five requests; only the first asks the store.
// Remaining is the key's figure throughout: what the store had left at the
// grant, plus the lease's unspent units.
func Example() {
	store := memory.New(nil) // in a fleet: a redisstore.Store
	defer store.Close()
	leased, err := lease.New(store, &lease.Options{MaxStaleness: 50 * time.Millisecond, Size: 5})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer leased.Close(ctx)
	for range 6 {
		d, err := leased.Take(ctx, "api:alice", sluice.PerMinute(100), 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.Remaining, d.Source)
	}
	// Output:
	// true 99 backend
	// true 98 lease
	// true 97 lease
	// true 96 lease
	// true 95 lease
	// true 94 backend
}
