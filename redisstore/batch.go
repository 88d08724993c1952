package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends concurrent calls together, with no goroutine of its own
// between calls.
//
// A call that finds fewer than inFlight batches in flight takes a slot and
// goes at once, alone, on its caller's goroutine and context: no added
// latency when the store is quiet. Otherwise it joins the queue and waits.
// Whoever finishes with a slot hands it on: if calls are queued, a goroutine
// takes up to max of them, sends them as one pipeline, and repeats while the
// queue refills; the slot is released only once the queue is empty. So a
// slot is free only while nobody waits, and that goroutine ends with the
// burst that started it.
//
// In a batch, one-key calls whose keys one script may touch together (all
// of them on one server, those of one hash slot on a cluster) are merged
// into one run of takeEachScript: a script call costs Redis more than a
// small decision does, so this roughly halves Redis's work per decision.
type batcher struct {
	client   redis.UniversalClient
	max      int // calls per batch
	inFlight int // batches at once
	group    func(key string) string

	mu    sync.Mutex
	busy  int     // slots taken
	queue []*call // waiting calls, oldest first; non-empty only when busy == inFlight
}

func newBatcher(client redis.UniversalClient, max, inFlight int) *batcher {
	return &batcher{client: client, max: max, inFlight: inFlight, group: groupOf(client)}
}

// do sends c and sets its reply, or returns ctx.Err() as soon as ctx ends
// (the command may still run if it was already sent).
func (b *batcher) do(ctx context.Context, c *call) error {
	b.mu.Lock()
	if b.busy < b.inFlight {
		b.busy++
		b.mu.Unlock()
		return c.await(ctx, func() {
			runOne(ctx, b.client, c)
			b.release()
		})
	}
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	c.until, _ = ctx.Deadline()
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1) // never sent
		} else {
			c.gone = true // in flight: its sender still holds it
		}
		b.mu.Unlock()
		return ctx.Err()
	}
}

// release hands a finished slot on to the queued calls, or frees it.
func (b *batcher) release() {
	b.mu.Lock()
	batch := b.next()
	if batch == nil {
		b.busy--
	}
	b.mu.Unlock()
	if batch != nil {
		go b.loop(batch)
	}
}

// loop sends batches on one slot until the queue is empty.
func (b *batcher) loop(batch []*call) {
	for batch != nil {
		b.send(batch)
		b.mu.Lock()
		if batch = b.next(); batch == nil {
			b.busy--
		}
		b.mu.Unlock()
	}
}

// next takes up to max calls off the queue, or returns nil if it is empty.
// b.mu is held.
func (b *batcher) next() []*call {
	n := min(len(b.queue), b.max)
	if n == 0 {
		return nil
	}
	batch := slices.Clone(b.queue[:n])
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
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
// caller's cancellation may fail the others. It lasts at most until the
// latest of their deadlines, if every caller has one (go-redis applies it
// with ContextTimeoutEnabled), and otherwise the client's read and write
// timeouts bound it.
func (b *batcher) send(batch []*call) {
	ctx := context.Background()
	if until := latest(batch); !until.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, until)
		defer cancel()
	}
	units := b.units(batch)
	b.exec(ctx, units)
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
// it loads their scripts (on every master of a cluster) and sends them
// again by EVALSHA; any that still miss (the cache was flushed again
// meanwhile) go by EVAL, which cannot.
func (b *batcher) exec(ctx context.Context, units []*unit) {
	pipeline := func(units []*unit, eval bool) {
		pipe := b.client.Pipeline()
		for _, u := range units {
			args := u.args
			if eval {
				args = evalArgs(u.script, args)
			}
			u.cmd = newCmd(ctx, args)
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
	eval := false
	loaded := make(map[*script]bool)
	for _, u := range failed {
		if !loaded[u.script] {
			loaded[u.script] = true
			if b.client.ScriptLoad(ctx, u.script.src).Err() != nil {
				eval = true
			}
		}
	}
	pipeline(failed, eval)
	if !eval {
		if failed = slices.DeleteFunc(failed, found); len(failed) > 0 {
			pipeline(failed, true)
		}
	}
}

// latest returns the latest deadline of the calls, or zero if any has none.
func latest(calls []*call) time.Time {
	var until time.Time
	for _, c := range calls {
		if c.until.IsZero() {
			return time.Time{}
		}
		if c.until.After(until) {
			until = c.until
		}
	}
	return until
}
