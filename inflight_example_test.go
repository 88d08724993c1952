package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

func ExampleAcquireSlot() {
	store := memory.New(&memory.Options{Clock: exampleClock})
	defer store.Close()
	ctx := context.Background()
	// At most 2 exports in progress per customer; a slot nobody releases
	// is freed after 10 minutes.
	limit := sluice.Concurrent(2, 10*time.Minute)
	var held []*sluice.Slot
	for range 3 {
		slot, d, err := sluice.AcquireSlot(ctx, store, "export:cust42", limit, 1)
		if err != nil {
			panic(err) // a store failure; a denial is not an error
		}
		fmt.Printf("allowed=%v in-use=%d retry-after≈%v\n", d.Allowed, d.InUse, d.RetryAfter)
		if slot != nil {
			held = append(held, slot)
		}
	}
	held[0].Release(ctx)
	held[0].Release(ctx) // a no-op
	_, d, _ := sluice.AcquireSlot(ctx, store, "export:cust42", limit, 1)
	fmt.Printf("after a release: allowed=%v in-use=%d\n", d.Allowed, d.InUse)
	// Output:
	// allowed=true in-use=1 retry-after≈0s
	// allowed=true in-use=2 retry-after≈0s
	// allowed=false in-use=2 retry-after≈10m0s
	// after a release: allowed=true in-use=2
}
