package server

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/redisstore"
)

// redisInfoTimeout bounds one scrape's INFO calls, so that a stalled Redis
// cannot hold /metrics (and Prometheus's scrape) for long.
const redisInfoTimeout = time.Second

// redisInfo exports Redis's own figures, read with INFO when /metrics is
// scraped: memory, evictions and the cost of sluice's scripts. On a
// cluster every master reports, labelled by address; a Sentinel-managed
// master is labelled "master" (its address changes on failover). The
// client must honour context deadlines (NewRedisClient's do) for the
// scrape to stay within its bound.
type redisInfo struct {
	client  redis.UniversalClient
	timeout time.Duration
	// evictions, when set, is told each node's evicted_keys.
	evictions *evictionWatch
}

var (
	redisUpDesc = prometheus.NewDesc("sluice_redis_up",
		"1 if the Redis node answered INFO within the scrape's time bound, 0 if not.", []string{"node"}, nil)
	redisUsedDesc = prometheus.NewDesc("sluice_redis_memory_used_bytes",
		"Redis's used_memory (INFO memory).", []string{"node"}, nil)
	redisMaxDesc = prometheus.NewDesc("sluice_redis_memory_max_bytes",
		"Redis's maxmemory (INFO memory); 0: no limit.", []string{"node"}, nil)
	redisMayEvictDesc = prometheus.NewDesc("sluice_redis_may_evict",
		"1 if the node's maxmemory-policy (the label) may evict sluice's keys under its maxmemory, resetting their limits; 0 if not.", []string{"node", "policy"}, nil)
	redisAOFDesc = prometheus.NewDesc("sluice_redis_aof_enabled",
		"1 if the node writes an append-only file (INFO persistence aof_enabled); 0: a restart loses the decisions since its last RDB snapshot, if any, and those limits start afresh.", []string{"node"}, nil)
	redisEvictedDesc = prometheus.NewDesc("sluice_redis_evicted_keys_total",
		"Keys Redis evicted under maxmemory, as this instance saw them: the growth of INFO stats evicted_keys between its reads, summed over the servers under the node's name and their restarts (a failover's new master counts from the switch); sluice's keys among them lose their limits' state.", []string{"node"}, nil)
	redisRestartsDesc = prometheus.NewDesc("sluice_redis_restarts_total",
		"Restarts of the Redis node seen by this instance (a new run_id, started since the last look): the limits whose state Redis had not saved start afresh.", []string{"node"}, nil)
	redisSlotsLostDesc = prometheus.NewDesc("sluice_redis_slots_lost_total",
		"In-flight slots acquired through this instance that the Redis node lost (they were held there) in a restart without persistence or a flush: no longer counted as held.", []string{"node"}, nil)
	redisFlushesDesc = prometheus.NewDesc("sluice_redis_flushes_total",
		"Times this instance found sluice's marker key gone from a node that did not restart (FLUSHALL, FLUSHDB, or sluice's keys deleted): every limit on the node started afresh.", []string{"node"}, nil)
	redisScriptCallsDesc = prometheus.NewDesc("sluice_redis_script_calls_total",
		"Script calls Redis ran (INFO commandstats), by command: evalsha, eval.", []string{"node", "command"}, nil)
	redisScriptSecondsDesc = prometheus.NewDesc("sluice_redis_script_seconds_total",
		"Time Redis spent running scripts (INFO commandstats), by command; divide by the calls for the time per call.", []string{"node", "command"}, nil)
	redisScriptPerCallDesc = prometheus.NewDesc("sluice_redis_script_seconds_per_call",
		"Redis's mean time per script call since its statistics were reset (INFO commandstats usec_per_call).", []string{"node", "command"}, nil)
)

// newRedisInfo returns a collector reading INFO from client; timeout 0
// means redisInfoTimeout.
func newRedisInfo(client redis.UniversalClient, timeout time.Duration) *redisInfo {
	if timeout <= 0 {
		timeout = redisInfoTimeout
	}
	// A watch of its own, so that evictions are counted without a
	// service's (which replaces it).
	return &redisInfo{client: client, timeout: timeout, evictions: newEvictionWatch(slog.New(slog.DiscardHandler), DefaultStoreCheckInterval)}
}

// Describe implements prometheus.Collector.
func (c *redisInfo) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{redisUpDesc, redisUsedDesc, redisMaxDesc, redisMayEvictDesc,
		redisAOFDesc, redisEvictedDesc, redisRestartsDesc, redisSlotsLostDesc, redisFlushesDesc, redisScriptCallsDesc, redisScriptSecondsDesc, redisScriptPerCallDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *redisInfo) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	eachNode(ctx, c.client, func(ctx context.Context, node *redis.Client, name string) {
		c.collectNode(ctx, ch, node, name)
	})
}

// eachNode calls f for every node client reports on, at once on a
// cluster: each master, by address; a Sentinel-managed master as
// "master" (its address changes on failover).
func eachNode(ctx context.Context, client redis.UniversalClient, f func(ctx context.Context, node *redis.Client, name string)) {
	switch cl := client.(type) {
	case *redis.ClusterClient:
		// The masters of the slot map in memory: ForEachMaster reloads it
		// first, one node after another, and one stopped node (a replica
		// too) held that to the deadline and every master read as down.
		// They answer in parallel; one that does not is reported down
		// without hiding the others.
		nodes, err := redisstore.Masters(ctx, cl)
		if err != nil {
			return
		}
		var wg sync.WaitGroup
		for _, node := range nodes {
			wg.Go(func() { f(ctx, node, node.Options().Addr) })
		}
		wg.Wait()
	case *redis.Client:
		name := cl.Options().Addr
		if name == "FailoverClient" {
			name = "master"
		}
		f(ctx, cl, name)
	}
}

func (c *redisInfo) collectNode(ctx context.Context, ch chan<- prometheus.Metric, cl redis.Cmdable, node string) {
	asked := time.Now()
	raw, err := cl.Info(ctx, "server", "persistence", "memory", "stats", "commandstats", "keyspace").Result()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(redisUpDesc, prometheus.GaugeValue, 0, node)
		// The counts seen so far stay while the node is down: a series
		// gone for longer than an alert's range shows no increase() at
		// the restart that ends the outage.
		c.collectCounts(ch, node)
		return
	}
	ch <- prometheus.MustNewConstMetric(redisUpDesc, prometheus.GaugeValue, 1, node)
	info := parseInfo(raw)
	c.evictions.observe(node, info, asked)
	gauge := func(d *prometheus.Desc, field string, t prometheus.ValueType) {
		if v, err := strconv.ParseFloat(info[field], 64); err == nil {
			ch <- prometheus.MustNewConstMetric(d, t, v, node)
		}
	}
	gauge(redisUsedDesc, "used_memory", prometheus.GaugeValue)
	gauge(redisMaxDesc, "maxmemory", prometheus.GaugeValue)
	gauge(redisAOFDesc, "aof_enabled", prometheus.GaugeValue)
	c.collectCounts(ch, node)
	if p := info["maxmemory_policy"]; p != "" {
		v := 0.0
		if redisstore.MayEvict(p, info["maxmemory"]) {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(redisMayEvictDesc, prometheus.GaugeValue, v, node, p)
	}
	for _, cmd := range []string{"evalsha", "eval"} {
		stat := commandStat(info["cmdstat_"+cmd])
		calls, err1 := strconv.ParseFloat(stat["calls"], 64)
		usec, err2 := strconv.ParseFloat(stat["usec"], 64)
		perCall, err3 := strconv.ParseFloat(stat["usec_per_call"], 64)
		if err1 != nil || err2 != nil || err3 != nil {
			calls, usec, perCall = 0, 0, 0 // never called since the last CONFIG RESETSTAT
		}
		ch <- prometheus.MustNewConstMetric(redisScriptCallsDesc, prometheus.CounterValue, calls, node, cmd)
		ch <- prometheus.MustNewConstMetric(redisScriptSecondsDesc, prometheus.CounterValue, usec/1e6, node, cmd)
		ch <- prometheus.MustNewConstMetric(redisScriptPerCallDesc, prometheus.GaugeValue, perCall/1e6, node, cmd)
	}
}

// collectCounts sends node's counters as the eviction watch knows them:
// evictions once the node was read, restarts and flushes once its run_id
// is known.
func (c *redisInfo) collectCounts(ch chan<- prometheus.Metric, node string) {
	counts := c.evictions.counts(node)
	if counts.read {
		ch <- prometheus.MustNewConstMetric(redisEvictedDesc, prometheus.CounterValue, float64(counts.evicted), node)
	}
	if counts.known {
		ch <- prometheus.MustNewConstMetric(redisRestartsDesc, prometheus.CounterValue, float64(counts.restarts), node)
		ch <- prometheus.MustNewConstMetric(redisSlotsLostDesc, prometheus.CounterValue, float64(counts.slotsLost), node)
		ch <- prometheus.MustNewConstMetric(redisFlushesDesc, prometheus.CounterValue, float64(counts.flushes), node)
	}
}

// parseInfo reads INFO's "field:value" lines. A "# Section" line is kept
// as a key of its own, without a value: an empty section (Keyspace, with
// no keys) has no other line to say it was read.
func parseInfo(raw string) map[string]string {
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(raw))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") {
			m[line] = ""
		} else if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// keyspaceSection is INFO keyspace's header, as parseInfo keeps it.
const keyspaceSection = "# Keyspace"

// commandStat reads a commandstats value: "calls=3,usec=40,usec_per_call=13.33,…".
func commandStat(v string) map[string]string {
	m := map[string]string{}
	for kv := range strings.SplitSeq(v, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// evictionWatch tells Redis evicting keys (each an evicted sluice key's
// limit started afresh) when it happens, not only when a full check, up
// to a minute later, finds a policy that may: it reads every node's
// evicted_keys (INFO stats) on each poll (every store check, while Redis
// answers) and each /metrics scrape. A count grown since the node's last
// read starts an episode, logged once at WARN with the count; one that
// stays put for evictionQuietPolls polls ends it, logged at INFO with the
// episode's total. The first read of a node, and the first of another
// server under its name (a Sentinel failover), only set where counting
// starts: that server's evicted_keys is of its own past. After a restart
// or a CONFIG RESETSTAT the whole count is new. The sum of the growth is
// sluice_redis_evicted_keys_total, which never goes down. Readiness does
// not change: Redis still answers.
//
// It also tells a restart of a node (see restarted), from INFO server.
type evictionWatch struct {
	log *slog.Logger
	// lost, if set, is told each restart without persistence of a node
	// (what "restarted", before its server's start) and each flush (what
	// "flushed", before the last look that found the marker there), and
	// returns how many in-flight slots, written before before, it lost
	// (Server.slotsLost). Set before the watch runs.
	lost  func(node, what string, before time.Time) int64
	every time.Duration // the poll interval
	quiet time.Duration // evictionQuietPolls polls
	mu    sync.Mutex
	nodes map[string]*evictedNode
	keys  map[string]string // each Cluster master's marker key, by address
}

// evictionQuietPolls is how many polls without an eviction end an
// episode: a minute at the default store check interval.
const evictionQuietPolls = 60

// evictedNode is what an evictionWatch knows of one node.
type evictedNode struct {
	count int64     // evicted_keys at the last read
	since time.Time // the episode's start; zero between episodes
	last  time.Time // the episode's last growth
	total int64     // evicted in the episode
	// evicted sums the growth of evicted_keys seen, on every server under
	// the node's name: sluice_redis_evicted_keys_total.
	evicted int64

	runID    string    // the server's run_id at the last read
	read     time.Time // the last read
	asked    time.Time // when the last read observed was asked for
	restarts int64     // restarts seen
	// slotsLost sums what lost returned at its restarts and flushes.
	slotsLost int64
	grewAt    time.Time // the last read that found evictions

	// The marker key (see marker): its value at the last look, the
	// server's run_id then, and the flushes it told; flushCalls is the
	// FLUSHALL and FLUSHDB calls INFO commandstats counted then.
	marker, markerRun, markerKey string
	flushes, flushCalls          int64
	markerAt                     time.Time // the last look at the marker
	markerAsked                  time.Time // when that look was sent
}

func newEvictionWatch(log *slog.Logger, every time.Duration) *evictionWatch {
	return &evictionWatch{log: log, every: every, quiet: evictionQuietPolls * every, nodes: map[string]*evictedNode{}, keys: map[string]string{}}
}

// observe takes a node's INFO fields, asked for at now. A read asked for
// before the last one observed is past news and ignored: a scrape's INFO
// answered by a server about to restart, observed after the watch's from
// the restarted one, set the old run_id back, and the next read counted
// the restart again. A nil watch does nothing.
func (w *evictionWatch) observe(node string, info map[string]string, now time.Time) {
	if w == nil {
		return
	}
	count, err := strconv.ParseInt(info["evicted_keys"], 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[node]
	if n == nil {
		n = &evictedNode{count: count, asked: now}
		w.nodes[node] = n
		w.restarted(node, n, info, now)
		return
	}
	if now.Before(n.asked) {
		return
	}
	n.asked = now
	// evicted_keys is the server's own, since its start or CONFIG
	// RESETSTAT: only its growth on one server is evictions since the
	// last read.
	grown := count - n.count
	switch w.restarted(node, n, info, now) {
	case restartedServer:
		grown = count // all since its start, after the last read
	case otherServer:
		grown = 0 // a Sentinel failover: the new master's past
	default:
		if count < n.count {
			grown = count // CONFIG RESETSTAT since the last read
		}
	}
	n.count = count
	if grown == 0 {
		if !n.since.IsZero() && now.Sub(n.last) >= w.quiet {
			w.log.Info("Redis no longer evicting keys", "node", node, "evicted", n.total,
				"lasted", n.last.Sub(n.since).Round(time.Millisecond))
			n.since, n.total = time.Time{}, 0
		}
		return
	}
	n.evicted += grown
	n.last, n.grewAt = now, now
	if !n.since.IsZero() {
		n.total += grown
		return
	}
	n.since, n.total = now, grown
	w.log.Warn("Redis evicting keys: an evicted sluice key starts its limit afresh; set maxmemory-policy noeviction, or give Redis more memory",
		"node", node, "evicted", grown, "maxmemory_policy", info["maxmemory_policy"], "maxmemory", info["maxmemory"])
}

// What restarted found: the same server as at the last read (or none
// known), the server restarted since, or another server under the node's
// name.
const (
	sameServer = iota
	restartedServer
	otherServer
)

// restarted tells a restart of node: a new run_id whose server started
// since the last read (uptime_in_seconds). A new run_id on an older
// server is another server under the node's name (a Sentinel failover,
// told by its own lines), not a restart. Redis keeps nothing it had not
// written to its AOF or last RDB save: the limits of the keys it lost
// start afresh, each admitting up to its whole limit again. w.mu is held.
func (w *evictionWatch) restarted(node string, n *evictedNode, info map[string]string, now time.Time) int {
	id := info["run_id"]
	if id == "" {
		return sameServer // INFO without its server section
	}
	prev, read := n.runID, n.read
	n.runID, n.read = id, now
	if prev == "" || id == prev {
		return sameServer
	}
	up, err := strconv.ParseInt(info["uptime_in_seconds"], 10, 64)
	if err != nil || time.Duration(up)*time.Second > now.Sub(read)+time.Second {
		return otherServer
	}
	n.restarts++
	args := []any{"node", node, "uptime", time.Duration(up) * time.Second, "aof_enabled", info["aof_enabled"]}
	// The keyspace's count, not rdb_last_load_keys_loaded: under a
	// multi-part AOF that counts only the base RDB, not the keys replayed
	// from the incremental files.
	if k, ok := keyspaceKeys(info); ok {
		args = append(args, "keyspace_keys", k)
	}
	if info["loading"] == "1" {
		args = append(args, "loading", true) // still loading: more keys to come
	}
	msg := "Redis restarted: sluice's keys it had not saved are gone and their limits start afresh (each may admit up to its whole limit again)"
	if info["aof_enabled"] != "1" {
		msg += "; appendonly yes keeps them"
	}
	w.log.Warn(msg, args...)
	// Without an AOF, and with no RDB loaded (none was saved), it started
	// empty: every in-flight slot held there is gone. Slots an RDB kept
	// cannot be told apart, and stay counted to their hold. Its start is
	// up to a second before now less its uptime, which is whole seconds.
	if w.lost != nil && info["aof_enabled"] != "1" && cmp.Or(info["rdb_last_load_keys_loaded"], "0") == "0" {
		n.slotsLost += w.lost(node, "restarted", now.Add(-time.Duration(up)*time.Second))
	}
	return restartedServer
}

// keyspaceKeys sums the keys of every database in INFO keyspace's
// "dbN:keys=…,expires=…" lines; ok is false without the section (its
// header alone, with no database listed, is an empty keyspace).
func keyspaceKeys(info map[string]string) (n int64, ok bool) {
	if _, ok := info[keyspaceSection]; !ok {
		return 0, false
	}
	for k, v := range info {
		if db, found := strings.CutPrefix(k, "db"); found {
			if _, err := strconv.Atoi(db); err == nil {
				c, _ := strconv.ParseInt(commandStat(v)["keys"], 10, 64)
				n += c
			}
		}
	}
	return n, true
}

// nodeCounts are an evictionWatch's counters of one node.
type nodeCounts struct {
	evicted  int64 // evictions seen, summed over the servers under its name
	restarts int64 // restarts told
	flushes  int64 // flushes told
	// slotsLost: in-flight slots its restarts and flushes lost
	// (evictionWatch.lost)
	slotsLost int64
	read      bool // the node was read at all: evicted is known
	known     bool // its run_id is known: restarts and flushes are
}

// counts returns node's counters. A nil watch knows nothing.
func (w *evictionWatch) counts(node string) nodeCounts {
	if w == nil {
		return nodeCounts{}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[node]
	if n == nil {
		return nodeCounts{}
	}
	return nodeCounts{evicted: n.evicted, restarts: n.restarts, flushes: n.flushes, slotsLost: n.slotsLost, read: true, known: n.runID != ""}
}

// watch reads every node's INFO at once, then every interval until stop
// is closed, skipping the polls when down reports the store lost. The
// first read sets the marker key at start: a flush before the first poll
// would find no marker read before it, and be missed.
func (w *evictionWatch) watch(stop <-chan struct{}, every time.Duration, client redis.UniversalClient, down func() bool) {
	poll := func() {
		if down() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), min(every, redisInfoTimeout))
		defer cancel()
		eachNode(ctx, client, func(ctx context.Context, node *redis.Client, name string) {
			// INFO and the marker's SET in one pipeline, on one connection:
			// both answered by one server. Apart, a restart between them
			// had the SET reach the restarted server, which had lost the
			// key, and compared with the killed one's run_id: a flush.
			key := w.markerKey(ctx, client, name)
			var b [8]byte
			rand.Read(b[:])
			mine := hex.EncodeToString(b[:])
			pipe := node.Pipeline()
			infoCmd := pipe.Info(ctx, "server", "persistence", "stats", "memory", "commandstats", "keyspace")
			var set *redis.StatusCmd
			if key != "" {
				set = pipe.SetArgs(ctx, key, mine, redis.SetArgs{Mode: "NX", Get: true})
			}
			asked := time.Now()
			pipe.Exec(ctx) // each command's error is its own
			raw, err := infoCmd.Result()
			if err != nil {
				return
			}
			info, now := parseInfo(raw), time.Now()
			w.observe(name, info, asked)
			if set != nil {
				w.marker(name, key, mine, set, info, asked, now)
			}
		})
	}
	poll()
	tick.Every(stop, every, poll)
}

// markerPrefix starts the marker key: under sluice's key prefix, so that
// its ACL user may write it, and apart from the limits' keys (the prefix
// then "{" or "[").
const markerPrefix = "sluice:marker"

// marker tells a FLUSHALL or FLUSHDB (or sluice's keys deleted), which
// starts every limit afresh and which Redis reports nowhere: on every poll
// it sets a key without a TTL, if absent, to a value of its own (SET NX
// GET, in the poll's INFO pipeline), and reads the value there. A value other than the
// last one read, on the same server (run_id), is a flush: the key was
// gone and this instance or another wrote it again. A restart or a
// failover (another run_id) is told by their own lines. The key has no
// TTL, so only an allkeys-* maxmemory-policy may evict it: there, with
// evictions in this read or the one before, its loss is a flush only if
// INFO commandstats counted a FLUSHALL or FLUSHDB since the last read,
// and told as evictions otherwise; under the other policies (volatile-*,
// noeviction) it is a flush whatever was evicted. On a Cluster each
// master has its own key, in one of its slots. Errors (a replica, a
// refused write) leave it unchanged. set is the SET NX GET of mine at
// key, sent at asked with the INFO read that gave info, answered by now
// (see watch). A flush also erased the in-flight slots held there: those
// the store answered for before the last look was sent stop being
// counted (lost), as at a restart without persistence; those since may
// have been acquired after the flush, and stay counted to their hold.
func (w *evictionWatch) marker(name, key, mine string, set *redis.StatusCmd, info map[string]string, asked, now time.Time) {
	runID := info["run_id"]
	if runID == "" {
		return
	}
	found, err := set.Result()
	switch {
	case errors.Is(err, redis.Nil):
		found = mine // it was absent: now it holds ours
	case err != nil:
		if strings.HasPrefix(err.Error(), "MOVED ") {
			w.mu.Lock()
			delete(w.keys, name) // its slot moved: find another
			w.mu.Unlock()
		}
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.nodes[name]
	if n == nil {
		return
	}
	prev, prevRun, prevKey, prevCalls, prevAt, prevAsked := n.marker, n.markerRun, n.markerKey, n.flushCalls, n.markerAt, n.markerAsked
	calls := flushCalls(info)
	n.marker, n.markerRun, n.markerKey, n.flushCalls, n.markerAt, n.markerAsked = found, runID, key, calls, now, asked
	if prev == "" || prev == found || prevRun != runID || prevKey != key {
		return
	}
	// calls below the last read's: CONFIG RESETSTAT since, and calls
	// made after it.
	flushed := calls > prevCalls || (calls < prevCalls && calls > 0)
	// Evictions seen since the marker was last there, by this watch or a
	// scrape (which may see them first, the watch's next look coming late
	// on a busy machine), or just before.
	evicting := !n.grewAt.Before(prevAt) || now.Sub(n.grewAt) <= 2*w.every
	if evicting && mayEvictMarker(info["maxmemory_policy"]) && !flushed {
		return
	}
	n.flushes++
	w.log.Warn("Redis flushed: sluice's keys are gone without a restart (FLUSHALL, FLUSHDB, or sluice's keys deleted); every limit starts afresh, each may admit up to its whole limit again",
		"node", name)
	if w.lost != nil {
		n.slotsLost += w.lost(name, "flushed", prevAsked)
	}
}

// flushCalls is the FLUSHALL and FLUSHDB calls INFO commandstats counts
// (0 without them: none made, or the section refused).
func flushCalls(info map[string]string) int64 {
	var n int64
	for _, cmd := range []string{"cmdstat_flushall", "cmdstat_flushdb"} {
		c, _ := strconv.ParseInt(commandStat(info[cmd])["calls"], 10, 64)
		n += c
	}
	return n
}

// mayEvictMarker reports whether maxmemory-policy policy may evict the
// marker key, which has no TTL: the allkeys-* policies, or one INFO did
// not say.
func mayEvictMarker(policy string) bool {
	return policy == "" || strings.HasPrefix(policy, "allkeys-")
}

// markerKey returns the marker key of node name: on a Cluster, a key in
// one of that master's slots ("" if none is found), else markerPrefix.
func (w *evictionWatch) markerKey(ctx context.Context, client redis.UniversalClient, name string) string {
	cc, ok := client.(*redis.ClusterClient)
	if !ok {
		return markerPrefix
	}
	w.mu.Lock()
	key, ok := w.keys[name]
	w.mu.Unlock()
	if ok {
		return key
	}
	// The slot map in memory routes each candidate; about 170,000 fill
	// every slot, and most masters are found in a few.
	found := map[string]string{}
	for i := 0; i < 1<<18 && found[name] == ""; i++ {
		k := markerPrefix + "{" + strconv.Itoa(i) + "}"
		m, err := cc.MasterForKey(ctx, k)
		if err != nil {
			return ""
		}
		if a := m.Options().Addr; found[a] == "" {
			found[a] = k
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for a, k := range found {
		if _, ok := w.keys[a]; !ok {
			w.keys[a] = k
		}
	}
	return w.keys[name]
}
