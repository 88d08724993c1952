// Command compare runs the Redis contenders of package bench in interleaved
// rounds (every contender once per round, so a noisy neighbour hurts all of
// them alike) and prints, per contender, the median throughput, its ratio to
// the best peer's median, and the median CPU cost per call on each side:
// this process (the client) and the Redis server. CPU per call is far less
// sensitive to a busy machine than throughput, and says where the time goes.
// Give it a Redis server of its own: the server's CPU counts every client.
//
//	redis-server --port 16391 --save '' --appendonly no &
//	SLUICE_REDIS_ADDR=127.0.0.1:16391 go run ./cmd/compare -rounds 9
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

	"github.com/sluicehq/sluice/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compare:", err)
		os.Exit(1)
	}
}

// sample is one contender's measurements across rounds.
type sample struct {
	ops, clientUS, redisUS []float64
	calls, allowed         int64
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
	samples := make([]sample, len(contenders))
	for r := range *rounds {
		for i, c := range contenders {
			rc0, err := bench.RedisCPU(ctx, client)
			if err != nil {
				return err
			}
			pc0 := bench.ProcessCPU()
			res, err := bench.Run(ctx, c.Name, takes[i], keys, *goroutines, *duration)
			if err != nil {
				return err
			}
			pc1 := bench.ProcessCPU()
			rc1, err := bench.RedisCPU(ctx, client)
			if err != nil {
				return err
			}
			s := &samples[i]
			n := float64(res.Calls)
			s.ops = append(s.ops, res.OpsPerSec())
			s.clientUS = append(s.clientUS, float64((pc1-pc0).Microseconds())/n)
			s.redisUS = append(s.redisUS, float64((rc1-rc0).Microseconds())/n)
			s.calls += res.Calls
			s.allowed += res.Allowed
			fmt.Fprintf(os.Stderr, "round %d/%d %-22s %8.0f ops/s\n", r+1, *rounds, c.Name, res.OpsPerSec())
		}
	}

	best := 0.0
	for i, c := range contenders {
		if c.Peer {
			best = max(best, median(samples[i].ops))
		}
	}
	fmt.Printf("%d goroutines, %d keys, %d rounds of %v, limit %d per %v\n\n",
		*goroutines, len(keys), *rounds, *duration, bench.Rate, bench.Period)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tmedian ops/s\tmin\tmax\t× best peer\tclient CPU µs/op\tRedis CPU µs/op\tallowed\t")
	for i, c := range contenders {
		s := samples[i]
		lo, hi := minMax(s.ops)
		ratio := "-"
		if !c.Peer && best > 0 {
			ratio = fmt.Sprintf("%.2f", median(s.ops)/best)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t%.1f\t%.1f\t%.2f\t\n", c.Name, median(s.ops), lo, hi, ratio,
			median(s.clientUS), median(s.redisUS), float64(s.allowed)/float64(s.calls))
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
	fmt.Printf("\nRedis MEMORY USAGE per limiter key (key %q, 14-byte prefix)\n\n", bench.MemoryKey)
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "limiter\tRedis keys\tbytes\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t\n", r.Name, r.RedisKeys, r.Bytes)
	}
	return tw.Flush()
}

func median(xs []float64) float64 { return bench.Median(append([]float64(nil), xs...)) }

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
