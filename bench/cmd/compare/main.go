// Command compare runs the Redis contenders of package bench in interleaved
// rounds (every contender once per round, so a noisy neighbour hurts all of
// them alike) and prints the median throughput of each, its ratio to the
// best peer, and Redis memory per key.
//
//	SLUICE_REDIS_ADDR=127.0.0.1:6379 go run ./cmd/compare -rounds 5 -duration 5s
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"sluice/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		addr       = flag.String("addr", os.Getenv("SLUICE_REDIS_ADDR"), "Redis address (default $SLUICE_REDIS_ADDR)")
		rounds     = flag.Int("rounds", 5, "rounds; each runs every contender once")
		duration   = flag.Duration("duration", 3*time.Second, "duration of one contender's run")
		goroutines = flag.Int("goroutines", bench.Goroutines, "concurrent callers")
		numKeys    = flag.Int("keys", bench.NumKeys, "distinct keys")
		memory     = flag.Bool("memory", true, "also measure Redis MEMORY USAGE per key")
	)
	flag.Parse()
	if *addr == "" {
		return errors.New("no Redis address: set SLUICE_REDIS_ADDR or -addr")
	}
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	if err := client.Ping(ctx).Err(); err != nil {
		return err
	}
	keys, err := bench.Keys(*numKeys)
	if err != nil {
		return err
	}

	contenders := bench.RedisContenders()
	takes := make([]bench.TakeFunc, len(contenders))
	for i, c := range contenders {
		if takes[i], err = c.New(client, fmt.Sprintf("cmp:%d:%d:", os.Getpid(), i)); err != nil {
			return fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	ops := make([][]float64, len(contenders))
	allowed := make([]float64, len(contenders))
	for r := range *rounds {
		for i, c := range contenders {
			res, err := bench.Run(ctx, c.Name, takes[i], keys, *goroutines, *duration)
			if err != nil {
				return err
			}
			ops[i] = append(ops[i], res.OpsPerSec())
			allowed[i] = float64(res.Allowed) / float64(res.Calls)
			fmt.Fprintf(os.Stderr, "round %d/%d %-22s %8.0f ops/s\n", r+1, *rounds, c.Name, res.OpsPerSec())
		}
	}

	med := make([]float64, len(contenders))
	best := 0.0
	for i, c := range contenders {
		med[i] = bench.Median(append([]float64(nil), ops[i]...))
		if c.Peer {
			best = max(best, med[i])
		}
	}
	fmt.Printf("%d goroutines, %d keys, %d rounds of %v, limit %d/%v\n\n", *goroutines, len(keys), *rounds, *duration, bench.Rate, bench.Period)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tmedian ops/s\tmin\tmax\tallowed\t× best peer\t")
	for i, c := range contenders {
		lo, hi := minMax(ops[i])
		ratio := "-"
		if !c.Peer && best > 0 {
			ratio = fmt.Sprintf("%.2f", med[i]/best)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.2f\t%s\t\n", c.Name, med[i], lo, hi, allowed[i], ratio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if !*memory {
		return nil
	}
	rows, err := bench.MeasureMemory(ctx, client)
	if err != nil {
		return err
	}
	fmt.Printf("\nRedis MEMORY USAGE per limiter key (key %q, prefix of 14 bytes)\n\n", bench.MemoryKey)
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "algorithm\tRedis keys\tbytes\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t\n", r.Name, r.RedisKeys, r.Bytes)
	}
	return tw.Flush()
}

func minMax(xs []float64) (lo, hi float64) {
	for i, x := range xs {
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi
}
