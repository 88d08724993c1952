// Command compare runs the Redis contenders of package bench in interleaved
// rounds (every contender once per round, so a noisy neighbour hurts all of
// them alike) and prints, per contender, the median throughput, its ratio to
// the best peer's median, and the median CPU cost per call on each side:
// this process (the client) and the Redis server. CPU per call is far less
// sensitive to a busy machine than throughput, and says where the time goes.
// Give it a Redis server of its own: the server's CPU counts every client.
//
// It prints two tables: keys in strict rotation over bench.NumKeys keys
// under bench.Rate per second, and keys drawn from a Zipf distribution
// (bench.ZipfS over bench.ZipfKeys keys, under bench.ZipfRate per second)
// with sluice's leases of each -staleness among the contenders, followed by
// each leased contender's ratios to redis_rate's throughput and to sluice's
// Redis CPU per call without leases.
//
//	redis-server --port 16391 --save '' --appendonly no &
//	SLUICE_REDIS_ADDR=127.0.0.1:16391 go run ./cmd/compare
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
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
	keys                   int // distinct keys used, fewest in a round
}

// load is one comparison: its contenders, how keys are handed out, and the
// limit it runs under.
type load struct {
	title      string
	contenders []bench.Contender
	newSet     func() *bench.KeySet
	rate       int64
}

func run() error {
	var (
		addr       = flag.String("addr", os.Getenv("SLUICE_REDIS_ADDR"), "Redis address (default $SLUICE_REDIS_ADDR)")
		rounds     = flag.Int("rounds", 5, "rounds; each runs every contender once")
		duration   = flag.Duration("duration", 3*time.Second, "duration of one contender's run")
		goroutines = flag.Int("goroutines", bench.Goroutines, "concurrent callers")
		numKeys    = flag.Int("keys", bench.NumKeys, "distinct keys of the uniform comparison")
		uniform    = flag.Bool("uniform", true, "run the comparison of keys in rotation")
		zipf       = flag.Bool("zipf", true, "run the skewed comparison, with leases")
		staleness  = flag.String("staleness", joinDurations(bench.LeaseStaleness), "leases' maximum stalenesses in the skewed comparison, comma-separated")
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
	var loads []load
	if *uniform {
		loads = append(loads, load{
			title:      fmt.Sprintf("%d keys in rotation", len(keys)),
			contenders: bench.RedisContenders(),
			newSet:     func() *bench.KeySet { return bench.NewKeySet(keys) },
			rate:       bench.Rate,
		})
	}
	if *zipf {
		zkeys, err := bench.Keys(bench.ZipfKeys)
		if err != nil {
			return err
		}
		stale, err := parseDurations(*staleness)
		if err != nil {
			return err
		}
		loads = append(loads, load{
			title:      fmt.Sprintf("Zipf s=%v over %d keys, leases of at most %s", bench.ZipfS, len(zkeys), *staleness),
			contenders: bench.ZipfContenders(stale...),
			newSet:     func() *bench.KeySet { return bench.NewZipfKeySet(zkeys, bench.ZipfS, *goroutines) },
			rate:       bench.ZipfRate,
		})
	}
	for li, l := range loads {
		samples, err := measure(ctx, client, l, li, *rounds, *goroutines, *duration)
		if err != nil {
			return err
		}
		if li > 0 {
			fmt.Println()
		}
		fmt.Printf("%s: %d goroutines, %d rounds of %v, limit %d per %v\n\n",
			l.title, *goroutines, *rounds, *duration, l.rate, bench.Period)
		if err := printTable(l.contenders, samples); err != nil {
			return err
		}
		if l.rate == bench.ZipfRate {
			printLeaseRatios(l.contenders, samples)
		}
	}

	if !*memory {
		return nil
	}
	rows, err := bench.MeasureMemory(ctx, client)
	if err != nil {
		return err
	}
	fmt.Printf("\nRedis MEMORY USAGE per limiter key (key %q, 14-byte prefix)\n\n", bench.MemoryKey)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "limiter\tRedis keys\tbytes\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t\n", r.Name, r.RedisKeys, r.Bytes)
	}
	return tw.Flush()
}

// measure runs l's contenders in interleaved rounds, CPU measured on both
// sides of each run.
func measure(ctx context.Context, client redis.UniversalClient, l load, li, rounds, goroutines int, d time.Duration) ([]sample, error) {
	takes := make([]bench.TakeFunc, len(l.contenders))
	for i, c := range l.contenders {
		var err error
		if takes[i], err = c.New(client, fmt.Sprintf("cmp:%d:%d:%d:", os.Getpid(), li, i)); err != nil {
			return nil, fmt.Errorf("%s: %w", c.Name, err)
		}
	}
	samples := make([]sample, len(l.contenders))
	for r := range rounds {
		for i, c := range l.contenders {
			rc0, err := bench.RedisCPU(ctx, client)
			if err != nil {
				return nil, err
			}
			pc0 := bench.ProcessCPU()
			res, err := bench.Run(ctx, c.Name, takes[i], l.newSet, goroutines, d)
			if err != nil {
				return nil, err
			}
			pc1 := bench.ProcessCPU()
			rc1, err := bench.RedisCPU(ctx, client)
			if err != nil {
				return nil, err
			}
			s := &samples[i]
			n := float64(res.Calls)
			s.ops = append(s.ops, res.OpsPerSec())
			s.clientUS = append(s.clientUS, float64((pc1-pc0).Microseconds())/n)
			s.redisUS = append(s.redisUS, float64((rc1-rc0).Microseconds())/n)
			s.calls += res.Calls
			s.allowed += res.Allowed
			if r == 0 || res.Keys < s.keys {
				s.keys = res.Keys
			}
			fmt.Fprintf(os.Stderr, "round %d/%d %-26s %9.0f ops/s\n", r+1, rounds, c.Name, res.OpsPerSec())
		}
	}
	return samples, nil
}

func printTable(contenders []bench.Contender, samples []sample) error {
	best := 0.0
	for i, c := range contenders {
		if c.Peer {
			best = max(best, median(samples[i].ops))
		}
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "contender\tmedian ops/s\tmin\tmax\t× best peer\tclient CPU µs/op\tRedis CPU µs/op\tallowed\tkeys\t")
	for i, c := range contenders {
		s := samples[i]
		lo, hi := minMax(s.ops)
		ratio := "-"
		if !c.Peer && best > 0 {
			ratio = fmt.Sprintf("%.2f", median(s.ops)/best)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%s\t%.2f\t%.3f\t%.4f\t%d\t\n", c.Name, median(s.ops), lo, hi, ratio,
			median(s.clientUS), median(s.redisUS), float64(s.allowed)/float64(s.calls), s.keys)
	}
	return tw.Flush()
}

// printLeaseRatios compares each leased contender with redis_rate's
// throughput and with sluice's Redis CPU per call under the same algorithm
// without leases.
func printLeaseRatios(contenders []bench.Contender, samples []sample) {
	byName := map[string]sample{}
	for i, c := range contenders {
		byName[c.Name] = samples[i]
	}
	fmt.Println()
	peer := byName["redis_rate/gcra"]
	for _, c := range contenders {
		if !strings.HasPrefix(c.Name, "sluice-lease-") {
			continue
		}
		_, alg, _ := strings.Cut(c.Name, "/")
		leased, exact := byName[c.Name], byName["sluice/"+alg]
		fmt.Printf("%s: %.1f× redis_rate/gcra's ops/s; Redis CPU per call %.3f of sluice/%s's (1/%.0f)\n", c.Name,
			median(leased.ops)/median(peer.ops), median(leased.redisUS)/median(exact.redisUS), alg,
			median(exact.redisUS)/median(leased.redisUS))
	}
}

func joinDurations(ds []time.Duration) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ",")
}

func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(f))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("-staleness: %q is not a positive duration", f)
		}
		out = append(out, d)
	}
	return out, nil
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
