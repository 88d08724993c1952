package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// A fixed clock keeps the examples' output exact; real code leaves Clock nil.
func exampleClock() time.Time { return time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC) }

func Example() {
	store := memory.New(&memory.Options{Clock: exampleClock})
	defer store.Close()
	limiter, err := sluice.NewLimiter(store, sluice.PerMinute(3), &sluice.Options{Prefix: "login:"})
	if err != nil {
		panic(err)
	}
	for range 4 {
		d, err := limiter.Allow(context.Background(), "203.0.113.7")
		if err != nil {
			panic(err) // a store failure; a denial is not an error
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry-after=0s
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=20s
}

func ExampleLimiter_AllowN() {
	store := memory.New(&memory.Options{Clock: exampleClock})
	defer store.Close()
	// An export costs 25 units of a 100-per-hour budget.
	limiter, _ := sluice.NewLimiter(store, sluice.PerHour(100), nil)
	for range 5 {
		d, _ := limiter.AllowN(context.Background(), "account-42", 25)
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// true 75 0s
	// true 50 0s
	// true 25 0s
	// true 0 0s
	// false 0 15m0s
}

func ExampleLimiter_Wait() {
	store := memory.New(nil)
	defer store.Close()
	// A third-party API allows 50 calls per second: pace outbound calls.
	limiter, _ := sluice.NewLimiter(store, sluice.PerSecond(50).WithBurst(1), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 3 {
		if _, err := limiter.Wait(ctx, "partner-api"); err != nil {
			fmt.Println("gave up:", err)
			return
		}
		fmt.Println("call", i+1)
	}
	// Output:
	// call 1
	// call 2
	// call 3
}

func ExampleParseLimit() {
	for _, s := range []string{"100/min", "10/s burst 20", "fixed_window 5000/1h", "sliding_window_log 300/5min"} {
		l, err := sluice.ParseLimit(s)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%-28s → %v, capacity %d\n", s, l, l.Capacity())
	}
	// Output:
	// 100/min                      → 100/min, capacity 100
	// 10/s burst 20                → 10/s burst 20, capacity 20
	// fixed_window 5000/1h         → fixed_window 5000/h, capacity 5000
	// sliding_window_log 300/5min  → sliding_window_log 300/5m, capacity 300
}

func ExampleLimiter_Peek() {
	store := memory.New(&memory.Options{Clock: exampleClock})
	defer store.Close()
	limiter, _ := sluice.NewLimiter(store, sluice.PerMinute(10).WithAlgorithm(sluice.SlidingWindowLog), nil)
	ctx := context.Background()
	limiter.AllowN(ctx, "user-7", 4)
	d, _ := limiter.Peek(ctx, "user-7") // looks, takes nothing
	fmt.Println(d.Allowed, d.Remaining)
	d, _ = limiter.Peek(ctx, "user-7")
	fmt.Println(d.Allowed, d.Remaining)
	// Output:
	// true 6
	// true 6
}
