package resilient_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

// With the backend down, each of 4 nodes enforces a quarter of the limit
// locally, so the fleet stays near 8/min.
func Example() {
	store, err := resilient.New(storetest.Down{}, &resilient.Options{
		Policy: resilient.FallbackLocal,
		Nodes:  4,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	limiter, err := sluice.NewLimiter(store, sluice.PerMinute(8), nil)
	if err != nil {
		log.Fatal(err)
	}
	for range 3 {
		d, err := limiter.Allow(context.Background(), "client-1")
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(d.Allowed, d.Limit, d.Remaining)
	}
	// Output:
	// true 2/min 1
	// true 2/min 0
	// false 2/min 0
}

// sources prints who answered each call.
type sources struct{}

func (sources) ObserveDecision(sluice.DecisionEvent) {}
func (sources) ObserveBreaker(sluice.BreakerEvent)   {}
func (sources) ObserveStore(e sluice.StoreEvent)     { fmt.Print(e.Source, " ") }

// A healthy backend answers; once it denies a key, the denial is answered
// locally until its RetryAfter has passed.
func Example_denyCache() {
	backend := memory.New(nil)
	defer backend.Close()
	store, err := resilient.New(backend, &resilient.Options{Observer: sources{}, Timeout: time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	for range 3 {
		d, _ := store.Take(context.Background(), "k", sluice.PerHour(1), 1)
		fmt.Println(d.Allowed)
	}
	// Output:
	// backend true
	// backend false
	// deny_cache false
}

// registry is a Membership that always counts three processes, as three
// processes sharing one Redis would (redisstore.Store.Membership).
type registry struct{}

func (registry) Heartbeat(context.Context, string, time.Duration) (int, error) { return 3, nil }

// A Fleet counts the processes sharing the backend; the fallback gives each
// its share of every limit.
func ExampleNewFleet() {
	fleet, err := resilient.NewFleet(registry{}, &resilient.FleetOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer fleet.Close()
	store, err := resilient.New(storetest.Down{}, &resilient.Options{Fleet: fleet, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	d, err := store.Take(context.Background(), "client-1", sluice.PerMinute(9), 1)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(fleet.Size(), d.Allowed, d.Limit, d.Remaining, d.Source)
	// Output:
	// 3 true 3/min 2 fallback
}
