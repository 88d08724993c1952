package memory_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// An exact in-process store behind a Limiter: three logins a minute per
// client address. (The fixed clock keeps the output exact; real code
// leaves Options nil.)
func Example() {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	store := memory.New(&memory.Options{Clock: func() time.Time { return now }})
	defer store.Close()
	limiter, err := sluice.NewLimiter(store, sluice.PerMinute(3), &sluice.Options{Prefix: "login:"})
	if err != nil {
		log.Fatal(err)
	}
	for range 4 {
		d, err := limiter.Allow(context.Background(), "203.0.113.7")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 20s
}
