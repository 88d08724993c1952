package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends concurrent calls together, with no goroutine of its own
// between calls.
//
// A call that finds fewer than inFlight batches in flight in its lane takes
// a slot and goes at once, alone: no added latency when the store is
// quiet. Otherwise it joins the lane's queue and waits, unless the wait
// would cost it too much of its deadline (see hurried): then it takes a
// slot beyond inFlight, up to most, and goes alone at once. Whoever finishes with a slot hands it on: if calls are
// queued, a goroutine takes up to max of them, sends them as one pipeline,
// and repeats while the queue refills; the slot is released only once the
// queue is empty. So a slot is free only while nobody waits, and that
// goroutine ends with the burst that started it.
//
// A standalone or Sentinel client has one lane. A ClusterClient has one per
// master, the one that owns the call's first key in go-redis's slot map:
// a master that stops answering holds only its own lane's slots and queue,
// never the calls of the others. The lanes only share slots out fairly;
// a call queued in the wrong lane (a slot moved, a failover the map has not
// caught up with) still goes through the ClusterClient, which routes it and
// follows MOVED and ASK.
//
// In a batch, one-key calls whose keys one script may touch together (all
// of them on one server, those of one hash slot on a cluster) are merged
// into one run of takeEachScript: a script call costs Redis more than a
// small decision does, so this roughly halves Redis's work per decision.
type batcher struct {
	client   redis.UniversalClient
	store    *Store // told the calls' errors, its shut ends their waits; nil: none
	max      int    // calls per batch
	inFlight int    // batches at once, per lane
	group    func(key string) string

	slow *slowLog // nil: no line for hurried calls
	// log, when set, receives the lanes' stall lines (stallLog); stalls
	// counts their switches.
	log    *slog.Logger
	stalls *atomic.Int64
	// dials is the client's record of dials, which each lane's stall log
	// asks (dials.refuses); nil: no client.
	dials *Dials

	// most is how many slots a lane may take, hurried calls' included;
	// read from the client at the first hurried call (New does not touch
	// the client).
	most func() int

	lane // the only lane; on a cluster, calls whose master is unknown

	cluster *redis.ClusterClient // nil: one lane
	// ready: a call has succeeded on the cluster, so go-redis has a slot
	// map and MasterForKey answers from memory. Until then it could load
	// one on the caller's goroutine, past the caller's deadline.
	ready  atomic.Bool
	lanes  sync.Map   // *redis.Client (a master) → *lane
	laneMu sync.Mutex // adding and pruning lanes
	nLanes int        // in lanes
	kept   int        // lanes left by the last prune
}

// lane is one queue of calls and its slots.
type lane struct {
	mu    sync.Mutex
	busy  int          // slots taken
	queue []*call      // waiting calls, oldest first; non-empty only when busy >= inFlight
	rtt   atomic.Int64 // smoothed round trip of the lane's answered sends, ns; 0 before the first
	// answered is rtt rising faster: how late a reply may still come
	// (sendContext).
	answered atomic.Int64
	// resumed: Unix ns when the lane's latest stall ended; a send on the
	// wire then waited through it, and is no round trip (seen).
	resumed atomic.Int64
	// stalled: the lane's latest send was cut off unanswered, none
	// answered since (Redis stopped, a dead link). The lane then sends one
	// batch at a time, dials nothing ahead, and hurried calls queue: each
	// send holds a connection until its deadline and the next dials anew,
	// so more at once only churned connections.
	stalled atomic.Bool
	stall   *stallLog     // nil: no lines
	probe   chan struct{} // the unbatched calls' one send while stalled (gate)

	// node is the server the lane's calls go to, to dial ahead on (see
	// ahead); nil: none known (a cluster's calls whose master is not).
	node    pinger
	peak    int  // the most slots taken at once since the pool was last known warm
	warming bool // a dial ahead is under way
}

// pinger is a client of one server.
type pinger interface {
	Ping(ctx context.Context) *redis.StatusCmd
	PoolStats() *redis.PoolStats
}

func newBatcher(client redis.UniversalClient, maxBatch, inFlight int, dials *Dials) *batcher {
	b := &batcher{client: client, max: maxBatch, inFlight: inFlight, group: groupOf(client), dials: dials}
	b.most = sync.OnceValue(func() int { return max(poolSize(client), inFlight) })
	b.cluster, _ = client.(*redis.ClusterClient)
	if b.cluster == nil {
		b.lane.node = client
	}
	return b
}

// stallLog returns the stall lines of a lane of node ("": the one server),
// which ask sends a script to (nil: none, see stallLog.ask) and refuses
// dials (nil: not known, see stallLog.refuses).
func (b *batcher) stallLog(node string, ask func(context.Context) error, refuses func() bool) *stallLog {
	if b.log == nil {
		return nil
	}
	return &stallLog{log: b.log, count: b.stalls, node: node, ask: ask, refuses: refuses}
}

// poolSize is how many connections client keeps to a server (each node, on
// a cluster), or 0 if it cannot tell: as many as hurried calls may take,
// as they would with batching off.
func poolSize(client redis.UniversalClient) int {
	var size, active int
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		size, active = o.PoolSize, o.MaxActiveConns
	case *redis.ClusterClient:
		o := c.Options()
		size, active = o.PoolSize, o.MaxActiveConns
	}
	if active > 0 {
		size = min(size, active)
	}
	return size
}

// hurried reports whether a call with budget left (0: no deadline) cannot
// afford to queue in l. A queued call is sent when a slot frees, up to a
// round trip later, and answered a round trip after that: it queues only
// while those two round trips fit in half its budget. Redis nearby, that
// is every call; Redis a quarter of the budget away or more, none, and each
// goes at once, in a slot of its own.
func (l *lane) hurried(budget time.Duration) bool {
	return budget > 0 && 4*time.Duration(l.rtt.Load()) > budget
}

// ahead dials connections ahead of the lane's calls, when a hurried one
// has just taken more slots at once than since the pool was last known
// warm, until the pool holds one more connection than that: a PING for
// each one short, sent when no connection is idle, so that each dials one,
// outside any caller's deadline, and leaves it in the pool for the next
// calls. The first
// command on a new connection costs several round trips (the handshake:
// HELLO, CLIENT SETINFO), which against a distant Redis is more than a
// decision's deadline: without this, each call that grows the lane's
// concurrency would time out on it. It has the deadline of a send for a
// caller with budget left.
func (l *lane) ahead(budget time.Duration) {
	ctx, cancel := sendContext(context.Background(), budget, l.answeredRTT())
	defer cancel()
	defer func() {
		l.mu.Lock()
		l.warming = false
		l.mu.Unlock()
	}()
	for range aheadTries {
		l.mu.Lock()
		need := l.peak + 1
		l.mu.Unlock()
		st := l.node.PoolStats()
		short := need - int(st.TotalConns)
		switch {
		case short <= 0:
			return
		case st.IdleConns > 0:
			// A PING would take it, and the caller that just gave it
			// back would dial in its place, on its own deadline.
			time.Sleep(aheadPause)
			continue
		}
		// A burst of calls may leave the pool several short: all at once.
		var lost atomic.Bool
		var wg sync.WaitGroup
		for range short {
			wg.Go(func() {
				if connLost(l.node.Ping(ctx).Err()) {
					lost.Store(true)
				}
			})
		}
		wg.Wait()
		if lost.Load() {
			l.mu.Lock()
			l.peak = 0
			l.mu.Unlock()
			return
		}
	}
}

// A dial ahead looks at the pool up to aheadTries times, aheadPause apart
// while a connection is idle.
const (
	aheadTries = 4
	aheadPause = time.Millisecond
)

// connLost reports whether a send that ended in err lost its connection:
// refused, reset or closed, or cut off waiting for a reply (go-redis
// closes the connection then). Any of them may have emptied the pool.
func connLost(err error) bool {
	if err == nil {
		return false
	}
	var rerr redis.Error // escapes: allocated only for an error
	return !errors.As(err, &rerr)
}

// timedOut reports whether err is a send cut off waiting for Redis.
func timedOut(err error) bool {
	var nerr net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &nerr) && nerr.Timeout())
}

// gate lets an unbatched call of l send: at once, or while l is stalled
// once no other such call is on the wire, as the batched calls go one
// batch at a time. It returns ctx's error if ctx ends first, the call
// never sent; else done, to call once the send has returned.
func (l *lane) gate(ctx context.Context) (done func(), err error) {
	if l.probe == nil || !l.stalled.Load() {
		return func() {}, nil
	}
	select {
	case l.probe <- struct{}{}:
		if err := ended(ctx); err != nil {
			<-l.probe
			return nil, err
		}
		return func() { <-l.probe }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// seen sets whether l is stalled from the end of one of its sends, which
// took d: an answer ends a stall, a send cut off unanswered starts one. It
// reports whether the send was a round trip: answered, and not on the wire
// when a stall ended (its reply waited for Redis to resume).
func (l *lane) seen(d time.Duration, err error) bool {
	now := time.Now().UnixNano()
	switch {
	case !connLost(err):
		if l.stalled.Load() && l.stalled.CompareAndSwap(true, false) {
			l.resumed.Store(now)
			l.stall.answered()
			return false
		}
		return now-int64(d) >= l.resumed.Load()
	case timedOut(err):
		if !l.stalled.Load() && l.stalled.CompareAndSwap(false, true) {
			l.suspect(d)
		} else {
			l.stall.cut()
		}
	}
	return false
}

// observe adds a send of l that took d and ended in err to l's round
// trips, if it was one (see seen). A send cut off unanswered is none: its
// time is the cut, and with it in, a lane's round trip after a stall
// stood at 62–83 ms for 50 ms callers, so the first calls once Redis
// answered took it for a distant one and dialled the pool full. A lost
// connection makes the next calls dial ahead again.
func (l *lane) observe(d time.Duration, err error) {
	if connLost(err) {
		l.mu.Lock()
		l.peak = 0
		l.mu.Unlock()
	}
	if !l.seen(d, err) {
		return
	}
	// Up fast: replies that start coming late must keep their
	// connections from the first ones on.
	if old := l.answered.Load(); int64(d) > old {
		l.answered.Store(old + (int64(d)-old)/2)
	} else {
		smooth(&l.answered, d)
	}
	smooth(&l.rtt, d)
}

// smooth mixes sample d into the round trip v as TCP smooths its own (an
// eighth of each sample). Racing updates may lose a sample, which only
// slows the average.
func smooth(v *atomic.Int64, d time.Duration) {
	old := v.Load()
	if old == 0 {
		v.Store(int64(d))
		return
	}
	v.Store(old + (int64(d)-old)/8)
}

// answeredRTT is l's round trip over its answered sends; 0 before one.
func (l *lane) answeredRTT() time.Duration { return time.Duration(l.answered.Load()) }

// do sends c and sets its reply, or returns ctx.Err() as soon as ctx ends
// (the command may still run if it was already sent).
func (b *batcher) do(ctx context.Context, c *call) error {
	if b.cluster == nil {
		return b.doIn(ctx, &b.lane, c)
	}
	err := b.doIn(ctx, b.laneOf(ctx, c), c)
	if err == nil && c.err == nil && !b.ready.Load() {
		b.ready.Store(true)
	}
	return err
}

// laneOf returns the lane of the master that owns c's first key.
func (b *batcher) laneOf(ctx context.Context, c *call) *lane {
	if !b.ready.Load() || len(c.args) <= 3 {
		return &b.lane
	}
	key, ok := c.args[3].(string)
	if !ok {
		return &b.lane
	}
	node, err := b.cluster.MasterForKey(ctx, key)
	if err != nil {
		return &b.lane
	}
	if l, ok := b.lanes.Load(node); ok {
		return l.(*lane)
	}
	return b.addLane(node)
}

// addLane returns node's lane, adding one if it has none. Masters come and
// go with failovers and resharding, so before the lanes grow past twice
// what the last prune left, the idle ones are dropped: a live master's is
// added again on its next call. A call that found a lane just before it
// was dropped still completes in it, as in any other.
func (b *batcher) addLane(node *redis.Client) *lane {
	b.laneMu.Lock()
	defer b.laneMu.Unlock()
	if l, ok := b.lanes.Load(node); ok {
		return l.(*lane)
	}
	if b.nLanes >= 2*b.kept+4 {
		b.lanes.Range(func(k, v any) bool {
			l := v.(*lane)
			l.mu.Lock()
			idle := l.busy == 0
			l.mu.Unlock()
			if idle {
				b.lanes.Delete(k)
				b.nLanes--
			}
			return true
		})
		b.kept = b.nLanes
	}
	l := &lane{node: node, stall: b.stallLog(node.Options().Addr, askScript(node), b.dials.refuses(node))}
	b.lanes.Store(node, l)
	b.nLanes++
	return l
}

// takeSlot locks l.mu, and takes one of l's slots (l.busy) when a call
// of budget would get one now: below the lane's slots, or a hurried call
// below the most there may be while the lane is not stalled. It returns
// with l.mu held either way, and whether the call is hurried and the lane
// stalled.
func (b *batcher) takeSlot(l *lane, budget time.Duration) (slot, hurried, stalled bool) {
	hurried = l.hurried(budget)
	if hurried && b.slow != nil {
		b.slow.hurried(budget)
	}
	stalled = l.stalled.Load()
	l.mu.Lock()
	if l.busy < b.slots(stalled) || (hurried && !stalled && l.busy < b.most()) {
		l.busy++
		return true, hurried, stalled
	}
	return false, hurried, stalled
}

// doIn is do in lane l.
func (b *batcher) doIn(ctx context.Context, l *lane, c *call) error {
	budget := budgetOf(ctx)
	if slot, hurried, stalled := b.takeSlot(l, budget); slot {
		// Only a hurried call's deadline is shorter than a handshake.
		ahead := false
		if hurried && !stalled && l.busy > l.peak && l.node != nil {
			l.peak = l.busy
			ahead, l.warming = !l.warming, true
		}
		l.mu.Unlock()
		if ahead {
			go l.ahead(budget)
		}
		return c.await(ctx, b.shut(), func() {
			sctx, cancel := sendContext(ctx, budget, l.answeredRTT())
			start := time.Now()
			runOne(sctx, b.client, b.store, c)
			l.observe(time.Since(start), c.err)
			cancel()
			b.release(l)
		})
	}
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	c.budget = budget
	l.queue = append(l.queue, c)
	l.mu.Unlock()
	return b.wait(ctx, l, c)
}

// doAll sends cs, calls independent of one another, together: the calls
// of each lane (on a cluster, each master's) as one batch (past max
// calls, as many as its free slots take: see enqueue), in a slot of their
// own when the lane would give one call a slot, else queued together for
// the next batch, the lanes side by side. Each call is sent once. It
// returns when each call has its reply, or with ctx's error (or the
// Store's shut's) for each call it stopped waiting for, as do does.
func (b *batcher) doAll(ctx context.Context, cs []*call) []error {
	budget := budgetOf(ctx)
	lanes := make([]*lane, len(cs))
	for i, c := range cs {
		lanes[i] = &b.lane
		if b.cluster != nil {
			lanes[i] = b.laneOf(ctx, c)
		}
		if c.done == nil {
			c.done = make(chan struct{}, 1)
		}
		c.budget = budget
	}
	var batch []*call
	for i, l := range lanes {
		if slices.Index(lanes, l) != i {
			continue // its calls went with its first
		}
		batch = batch[:0]
		for j := i; j < len(cs); j++ {
			if lanes[j] == l {
				batch = append(batch, cs[j])
			}
		}
		b.enqueue(l, batch, budget)
	}
	errs := make([]error, len(cs))
	for i, c := range cs {
		errs[i] = b.wait(ctx, lanes[i], c)
		if errs[i] == nil && c.err == nil && b.cluster != nil && !b.ready.Load() {
			b.ready.Store(true)
		}
	}
	return errs
}

// enqueue sends cs in lane l as one batch in a slot of its own when a
// call of budget would take one (see doIn), or queues them all together
// for the lane's next batch. Past max calls, the rest go as further
// batches in the lane's free slots, side by side, and what no free slot
// takes is queued: queued behind the first batch while a slot was free,
// it waited a round trip for nothing, and calls that came after it went
// first (a slot is free only while nobody waits).
func (b *batcher) enqueue(l *lane, cs []*call, budget time.Duration) {
	slot, _, stalled := b.takeSlot(l, budget)
	if !slot {
		l.queue = append(l.queue, cs...)
		l.mu.Unlock()
		return
	}
	var batches [][]*call
	for {
		n := min(len(cs), b.max)
		batches = append(batches, slices.Clone(cs[:n]))
		if cs = cs[n:]; len(cs) == 0 {
			break
		}
		if l.busy >= b.slots(stalled) {
			l.queue = append(l.queue, cs...)
			break
		}
		l.busy++
	}
	l.mu.Unlock()
	for _, batch := range batches {
		go b.loop(l, batch)
	}
}

// wait waits for c's reply, queued or sent in l: nil once it has one, or
// ctx's error (the Store's shut's) first, c then taken off the queue if
// it is still there, never sent, or left to its sender.
func (b *batcher) wait(ctx context.Context, l *lane, c *call) error {
	var err error
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-b.shut():
		err = redis.ErrClosed
	}
	l.mu.Lock()
	if i := slices.Index(l.queue, c); i >= 0 {
		l.queue = slices.Delete(l.queue, i, i+1) // never sent
	} else {
		c.gone = true // in flight: its sender still holds it
	}
	l.mu.Unlock()
	return err
}

// shut is the Store's shut, nil without one.
func (b *batcher) shut() <-chan struct{} {
	if b.store == nil {
		return nil
	}
	return b.store.shut
}

// slots is how many slots a lane's calls take before they queue.
func (b *batcher) slots(stalled bool) int {
	if stalled {
		return 1
	}
	return b.inFlight
}

// release hands a finished slot of l on to its queued calls, or frees it.
func (b *batcher) release(l *lane) {
	l.mu.Lock()
	batch := b.handOn(l)
	l.mu.Unlock()
	if batch != nil {
		go b.loop(l, batch)
	}
}

// loop sends batches on one slot of l until its queue is empty.
func (b *batcher) loop(l *lane, batch []*call) {
	for batch != nil {
		b.send(l, batch)
		l.mu.Lock()
		batch = b.handOn(l)
		l.mu.Unlock()
	}
}

// handOn returns the next batch for a slot of l just finished, or frees
// the slot: when the queue is empty, or when l is stalled and another slot
// will hand the queue on. l.mu is held.
func (b *batcher) handOn(l *lane) []*call {
	if l.busy > 1 && l.stalled.Load() {
		l.busy--
		return nil
	}
	batch := b.next(l)
	if batch == nil {
		l.busy--
	}
	return batch
}

// next takes up to max calls off l's queue, or returns nil if it is empty.
// l.mu is held.
func (b *batcher) next(l *lane) []*call {
	n := min(len(l.queue), b.max)
	if n == 0 {
		return nil
	}
	batch := slices.Clone(l.queue[:n])
	rest := copy(l.queue, l.queue[n:])
	clear(l.queue[rest:])
	l.queue = l.queue[:rest]
	return batch
}

// unit is one command of a pipeline: a call's own script, or one run of
// takeEachScript for several one-key calls.
type unit struct {
	script *script
	args   []any
	calls  []*call
	cmd    scriptCmd
}

// send runs batch as one pipeline and wakes its callers. The pipeline runs
// on a context of its own, since it carries many callers' commands: no
// caller's cancellation may fail the others, and a caller that stops
// waiting leaves the reply to come (see sendContext). It lasts at most
// sendContext's time for the longest of the callers' budgets, if every caller has
// one (go-redis applies it with ContextTimeoutEnabled), and otherwise the
// client's read and write timeouts bound it.
func (b *batcher) send(l *lane, batch []*call) {
	ctx, cancel := sendContext(context.Background(), longest(batch), l.answeredRTT())
	defer cancel()
	units := b.units(batch)
	start := time.Now()
	b.exec(ctx, units)
	l.observe(time.Since(start), units[0].cmd.Err())
	// Calls to send again on their own: decisions that raised an error
	// inside takeEachScript (so that each reports its own), and merged runs
	// that a cluster refused before running them because their keys were
	// not all on hand (a slot in migration).
	var alone []*call
	for _, u := range units {
		if u.script != takeEachScript {
			u.calls[0].val, u.calls[0].err = u.cmd.Val(), u.cmd.Err()
			continue
		}
		v, err := u.cmd.Result()
		if redis.HasErrorPrefix(err, "TRYAGAIN") || redis.HasErrorPrefix(err, "CROSSSLOT") {
			alone = append(alone, u.calls...)
			continue
		}
		if err == nil && len(v) != 5*len(u.calls) {
			err = fmt.Errorf("%w: want %d integers for %d decisions, got %d", ErrUnexpectedReply, 5*len(u.calls), len(u.calls), len(v))
		}
		for i, c := range u.calls {
			if err != nil {
				c.err = err
				continue
			}
			r := v[5*i : 5*i+5 : 5*i+5]
			switch {
			case r[0] == -1:
				alone = append(alone, c)
			case c.argv[argMode] == modeRefund:
				c.val = r[:0]
			default:
				c.val = r[:algorithms[c.alg].reply]
			}
		}
	}
	if len(alone) > 0 {
		units = units[:0]
		for _, c := range alone {
			units = append(units, &unit{script: c.script, args: c.args, calls: []*call{c}})
		}
		b.exec(ctx, units)
		for _, u := range units {
			u.calls[0].val, u.calls[0].err = u.cmd.Val(), u.cmd.Err()
		}
	}
	for _, c := range batch {
		c.done <- struct{}{}
	}
}

// units groups a batch into commands: one-key calls whose keys share a
// group (see groupOf) merge into one takeEachScript run, in queue order;
// any other call, or a group of one, is a command of its own.
func (b *batcher) units(batch []*call) []*unit {
	var units []*unit
	merged := make(map[string]*unit)
	for _, c := range batch {
		if c.alg < 0 {
			units = append(units, &unit{script: c.script, args: c.args, calls: []*call{c}})
			continue
		}
		g := b.group(c.argv[argKey].(string))
		u := merged[g]
		if u == nil {
			u = &unit{script: c.script, args: c.args}
			merged[g] = u
			units = append(units, u)
		}
		u.calls = append(u.calls, c)
	}
	for _, u := range units {
		if len(u.calls) < 2 || u.calls[0].alg < 0 {
			continue
		}
		n := len(u.calls)
		args := make([]any, 0, 3+8*n)
		args = append(args, "evalsha", takeEachScript.sha, n)
		for _, c := range u.calls {
			args = append(args, c.argv[argKey])
		}
		for _, c := range u.calls {
			token := c.argv[argToken]
			if token == nil {
				token = "0"
			}
			args = append(args, c.alg, c.argv[argNow], c.argv[argMode], c.argv[argParam1], c.argv[argParam2], c.argv[argCost], token)
		}
		u.script, u.args = takeEachScript, args
	}
	return units
}

// exec runs units as one pipeline, then retries those that met NOSCRIPT:
// it loads their scripts (see load) and sends them again by EVALSHA; any
// that still miss (the cache was flushed again meanwhile, or the load went
// to a node the slot has left) go by EVAL, which cannot.
func (b *batcher) exec(ctx context.Context, units []*unit) {
	pipeline := func(units []*unit, eval bool) {
		for _, u := range units {
			args := u.args
			if eval {
				args = evalArgs(u.script, args)
			}
			u.cmd = newCmd(ctx, b.store, args)
		}
		if len(units) == 1 {
			// One command (a batch merged into one script run, as on one
			// server it mostly is) goes on the client's pool: go-redis
			// takes a pipeline's connection from a pool of its own,
			// PipelinePoolSize more connections than PoolSize.
			_ = b.client.Process(ctx, units[0].cmd)
			return
		}
		pipe := b.client.Pipeline()
		for _, u := range units {
			_ = pipe.Process(ctx, u.cmd)
		}
		_, _ = pipe.Exec(ctx) // every command keeps its own error
	}
	found := func(u *unit) bool { return !isNoScript(u.cmd.Err()) }
	pipeline(units, false)
	failed := slices.DeleteFunc(slices.Clone(units), found)
	if len(failed) == 0 {
		return
	}
	eval := !b.load(ctx, failed)
	pipeline(failed, eval)
	if !eval {
		if failed = slices.DeleteFunc(failed, found); len(failed) > 0 {
			pipeline(failed, true)
		}
	}
}

// load loads the scripts of units on the server they went to, and reports
// whether every load succeeded. On a cluster that is the master of each
// unit's first key, not ClusterClient.ScriptLoad: that reloads the slot map
// asking nodes one at a time and then loads on every node, so one stopped
// master held the batch, its callers and its lane's slot for the client's
// read timeout, whatever master the batch was for.
func (b *batcher) load(ctx context.Context, units []*unit) bool {
	type load struct {
		node   redis.Cmdable
		script *script
	}
	loads := make(map[load]bool)
	for _, u := range units {
		var node redis.Cmdable = b.client
		if b.cluster != nil {
			if len(u.args) <= 3 {
				return false
			}
			key, ok := u.args[3].(string)
			if !ok {
				return false
			}
			master, err := b.cluster.MasterForKey(ctx, key)
			if err != nil {
				return false
			}
			node = master
		}
		loads[load{node, u.script}] = true
	}
	var failed atomic.Bool
	var wg sync.WaitGroup
	for l := range loads {
		wg.Go(func() {
			if l.node.ScriptLoad(ctx, l.script.src).Err() != nil {
				failed.Store(true)
			}
		})
	}
	wg.Wait()
	return !failed.Load()
}

// longest returns the longest budget of the calls, or 0 if any has none.
func longest(calls []*call) time.Duration {
	var most time.Duration
	for _, c := range calls {
		if c.budget <= 0 {
			return 0
		}
		most = max(most, c.budget)
	}
	return most
}
