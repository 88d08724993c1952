package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends concurrent calls in pipelines, with no goroutine of its own
// between calls.
//
// A call that finds fewer than inFlight pipelines in flight takes a slot and
// goes at once, alone, on its caller's goroutine and context: no added
// latency when the store is quiet. Otherwise it joins the queue and waits.
// Whoever finishes with a slot hands it on: if calls are queued, a goroutine
// takes up to max of them, sends them as one pipeline, and repeats while the
// queue refills; the slot is released only once the queue is empty. So a
// slot is free only while nobody waits, and that goroutine ends with the
// burst that started it.
type batcher struct {
	client   redis.UniversalClient
	max      int // calls per pipeline
	inFlight int // pipelines at once

	mu    sync.Mutex
	busy  int     // slots taken
	queue []*call // waiting calls, oldest first; non-empty only when busy == inFlight
}

// do sends c and returns its error once it has a reply, or ctx.Err() if ctx
// ends first (the command may still run if it was already sent).
func (b *batcher) do(ctx context.Context, c *call) error {
	b.mu.Lock()
	if b.busy < b.inFlight {
		b.busy++
		b.mu.Unlock()
		err := runOne(ctx, b.client, c)
		b.release()
		return err
	}
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	c.until, _ = ctx.Deadline()
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.cmd.Err()
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
	cmds := make([]redis.Cmder, len(batch))
	for i, c := range batch {
		cmds[i] = c.cmd
	}
	pipe := b.client.Pipeline()
	_ = pipe.BatchProcess(ctx, cmds...)
	_, _ = pipe.Exec(ctx) // every command keeps its own error
	b.reload(ctx, batch)
	for _, c := range batch {
		c.done <- struct{}{}
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

// reload retries the calls of batch that met NOSCRIPT: it loads their
// scripts (on every master of a cluster) and sends them again by EVALSHA;
// any that still miss (the cache was flushed again meanwhile) go by EVAL,
// which cannot.
func (b *batcher) reload(ctx context.Context, batch []*call) {
	failed := slices.DeleteFunc(slices.Clone(batch), func(c *call) bool { return !isNoScript(c.cmd.Err()) })
	if len(failed) == 0 {
		return
	}
	eval := false
	loaded := make(map[*script]bool)
	for _, c := range failed {
		if !loaded[c.script] {
			loaded[c.script] = true
			if b.client.ScriptLoad(ctx, c.script.src).Err() != nil {
				eval = true
			}
		}
	}
	for len(failed) > 0 {
		pipe := b.client.Pipeline()
		for _, c := range failed {
			args := c.args
			if eval {
				args = evalArgs(c)
			}
			c.cmd = newCmd(ctx, args)
			_ = pipe.Process(ctx, c.cmd)
		}
		_, _ = pipe.Exec(ctx)
		if eval {
			return
		}
		failed = slices.DeleteFunc(failed, func(c *call) bool { return !isNoScript(c.cmd.Err()) })
		eval = true
	}
}
