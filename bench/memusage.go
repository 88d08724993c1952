package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// KeyMemory is what one rate-limited key costs in Redis.
type KeyMemory struct {
	Name      string // algorithm, with the log's size where it matters
	RedisKeys int    // Redis keys written for the one limiter key
	Bytes     int64  // MEMORY USAGE (SAMPLES 0) summed over them
}

// memoryCase is one measurement: units taken one call at a time under limit.
type memoryCase struct {
	name  string
	limit sluice.Limit
	takes int
}

// MemoryKey is the limiter key every measurement uses; its length is part
// of the figure.
const MemoryKey = "user:00000001"

// MeasureMemory takes units for MemoryKey under each of sluice's algorithms
// (the sliding log with 10, 100 and 1,000 entries), then once under each
// peer, and reports Redis's MEMORY USAGE for the keys written. Limits are
// per hour so nothing expires while measuring.
// Every key it writes starts with a prefix unique to this call, and is
// deleted before it returns.
func MeasureMemory(ctx context.Context, client redis.UniversalClient) ([]KeyMemory, error) {
	hourly := func(a sluice.Algorithm) sluice.Limit {
		return sluice.Limit{Algorithm: a, Rate: 1000, Period: time.Hour}
	}
	var cases []memoryCase
	for _, a := range sluice.Algorithms() {
		if a == sluice.SlidingWindowLog {
			cases = append(cases,
				memoryCase{a.String() + " (10 entries)", hourly(a), 10},
				memoryCase{a.String() + " (100 entries)", hourly(a), 100},
				// Past zset-max-listpack-entries (128 by default): a skiplist.
				memoryCase{a.String() + " (1000 entries)", hourly(a), 1000})
			continue
		}
		cases = append(cases, memoryCase{a.String(), hourly(a), 1})
	}
	run := time.Now().UnixNano() % 1e8
	var out []KeyMemory
	for i, c := range cases {
		// Same-length prefixes, so key names weigh the same in every row.
		prefix := fmt.Sprintf("bm%08d:%02d:", run, i)
		store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
		for range c.takes {
			d, err := store.Take(ctx, MemoryKey, c.limit, 1)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrBench, c.name, err)
			}
			if !d.Allowed {
				return nil, fmt.Errorf("%w: %s: denied while filling", ErrBench, c.name)
			}
		}
		m, err := keyMemory(ctx, client, prefix)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBench, c.name, err)
		}
		m.Name = c.name
		out = append(out, m)
	}
	// The peers, for scale: one call each under their comparison limit.
	for i, c := range RedisContenders() {
		if !c.Peer {
			continue
		}
		prefix := fmt.Sprintf("bp%08d:%02d:", run, i)
		take, err := c.New(client, prefix)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBench, c.Name, err)
		}
		if _, err := take(ctx, MemoryKey); err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBench, c.Name, err)
		}
		m, err := keyMemory(ctx, client, prefix)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrBench, c.Name, err)
		}
		m.Name = c.Name
		out = append(out, m)
	}
	return out, nil
}

// keyMemory sums MEMORY USAGE over the keys that contain prefix, then
// deletes them.
func keyMemory(ctx context.Context, client redis.UniversalClient, prefix string) (KeyMemory, error) {
	var keys []string
	iter := client.Scan(ctx, 0, "*"+prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return KeyMemory{}, err
	}
	if len(keys) == 0 {
		return KeyMemory{}, fmt.Errorf("no key containing %q was written", prefix)
	}
	m := KeyMemory{RedisKeys: len(keys)}
	for _, k := range keys {
		n, err := client.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return KeyMemory{}, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		m.Bytes += n
	}
	if err := client.Del(ctx, keys...).Err(); err != nil {
		return KeyMemory{}, err
	}
	return m, nil
}
