package resilient

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// denyCache remembers backend denials so that a blocked key costs the
// backend nothing until it could be admitted again.
//
// Why it is exact, for all six algorithms: a denial for cost c with
// RetryAfter r means the backend's state admits c units no earlier than
// now+r if nobody takes anything meanwhile. Without takes, what a key
// admits only grows with time (tokens refill, the TAT recedes, log entries
// and window counts age out, the sliding counter's estimate only falls);
// and takes by anyone only delay it further. So until now+r the backend
// denies cost c, and the cached answer is the backend's own.
//
// Entries are anchored at the time the request was sent, not when the
// answer came back, so the cached deadline is never later than the
// backend's own.
//
// One entry per (key, limit), for the cost that was denied: a larger cost
// is denied too, but for longer than the cached RetryAfter says, and a
// client must never be told to come back too early. For the same reason a
// take through this Store drops the key's entry: the units it took delay
// the denied cost further. Not covered: takes by other processes, which
// can make the real wait longer (the backend's own RetryAfter has the same
// caveat); and a Reset on another process, a backend that lost its data (a
// restarted Redis), or units the backend gives back after denying (a
// non-atomic TakeAll's refund), each of which can make the cached denial
// outlast the backend's, by at most r, or by at most Options.DenyCacheFor's
// bound where it sets one.
type denyCache struct {
	seed   maphash.Seed
	shards [16]denyShard
	per    int                                                // entries per shard
	keep   func(key string, limit sluice.Limit) time.Duration // Options.DenyCacheFor
}

type denyShard struct {
	mu sync.Mutex
	m  map[denyKey]denial
}

type denyKey struct {
	key   string
	limit sluice.Limit
}

type denial struct {
	until     time.Time // first instant the cost may be admitted
	expire    time.Time // forgotten then: until, or sooner (Options.DenyCacheFor)
	resetAt   time.Time
	cost      int64
	remaining int64
}

func newDenyCache(size int, keep func(key string, limit sluice.Limit) time.Duration) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), per: max(size/16, 1), keep: keep}
	for i := range c.shards {
		c.shards[i].m = make(map[denyKey]denial)
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// get returns the cached denial for cost units of key under limit, if one
// holds at now. Remaining is as the backend last reported it (a lower
// bound: units may have come back since, though fewer than cost).
func (c *denyCache) get(key string, limit sluice.Limit, cost int64, now time.Time) (sluice.Decision, bool) {
	sh := c.shard(key)
	k := denyKey{key, limit}
	sh.mu.Lock()
	e, ok := sh.m[k]
	if ok && !now.Before(e.expire) {
		delete(sh.m, k)
		ok = false
	}
	sh.mu.Unlock()
	if !ok || e.cost != cost {
		return sluice.Decision{}, false
	}
	return sluice.Decision{
		Limit:      limit,
		Remaining:  e.remaining,
		RetryAfter: e.until.Sub(now),
		ResetAfter: max(e.resetAt.Sub(now), e.until.Sub(now)),
		Source:     sluice.SourceDenyCache,
	}, true
}

// put records denial d of cost units, for a request sent at sent.
func (c *denyCache) put(key string, limit sluice.Limit, cost int64, d sluice.Decision, sent time.Time) {
	if d.Allowed || d.RetryAfter <= 0 {
		return
	}
	e := denial{until: sent.Add(d.RetryAfter), resetAt: sent.Add(d.ResetAfter), cost: cost, remaining: d.Remaining}
	e.expire = e.until
	if c.keep != nil {
		// Forgotten sooner, it still tells the backend's RetryAfter while
		// kept: a client is never told to come back too early.
		if k := c.keep(key, limit); k > 0 && k < d.RetryAfter {
			e.expire = sent.Add(k)
		}
	}
	sh := c.shard(key)
	k := denyKey{key, limit}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.m[k]; !ok && len(sh.m) >= c.per {
		sh.evict(sent)
	}
	sh.m[k] = e
}

// forget drops the entry of key under limit.
func (c *denyCache) forget(key string, limit sluice.Limit) {
	sh := c.shard(key)
	k := denyKey{key, limit}
	sh.mu.Lock()
	delete(sh.m, k)
	sh.mu.Unlock()
}

// evict frees room: expired entries among a sample, or else one arbitrary
// entry (map iteration starts at a random place).
func (sh *denyShard) evict(now time.Time) {
	const sample = 8
	n := 0
	var victim denyKey
	freed := false
	for k, e := range sh.m {
		if !now.Before(e.expire) {
			delete(sh.m, k)
			freed = true
		}
		victim = k
		if n++; n >= sample {
			break
		}
	}
	if !freed {
		delete(sh.m, victim)
	}
}

// len returns the number of entries, for tests.
func (c *denyCache) len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
