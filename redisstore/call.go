package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// call is one script run for one caller: its arguments, and its reply once
// it has one.
type call struct {
	script *script
	args   []any   // evalsha, sha, numkeys, keys..., argv...
	argv   [10]any // backs args for one-key calls, saving an allocation
	// alg is the algorithm of a one-key call, which a batch may merge with
	// others into one run of takeEachScript; -1 for any other call.
	alg  int64
	val  []int64
	err  error
	done chan struct{} // batched calls: receives once val and err are set
	// budget is what a batched call's caller had left when it called;
	// 0: its context has no deadline.
	budget time.Duration
	// gone: the caller stopped waiting while the call was in flight, so the
	// sender may still write to it and it must not be recycled.
	gone bool
}

// One-key calls' arguments after EVALSHA, the digest and numkeys: KEYS[1],
// then the script's ARGV (see scripts/*.lua).
const (
	argKey = 3 + iota
	argNow
	argMode
	argParam1
	argParam2
	argCost
	argToken
)

// calls recycles one-key calls: their argument array and channel would
// otherwise be allocated on every call.
var calls = sync.Pool{New: func() any { return new(call) }}

// recycle returns c to the pool unless its sender may still use it. The
// caller must be done with c.val.
func (c *call) recycle() {
	if c.gone {
		return
	}
	*c = call{done: c.done} // the channel is empty: its one signal was received
	calls.Put(c)
}

// scriptCmd is a script call that go-redis must never send twice. go-redis
// retries a command (and a whole pipeline) after a lost connection or a
// read timeout, when Redis may already have run it: a take would be charged
// twice. NoRetry stops that on every client type; redirects (MOVED, ASK)
// and a READONLY node, which mean the command did not run, are still
// followed, and NOSCRIPT and TRYAGAIN are retried here.
//
// Its errors are told to the Store that sent it (see Store.sawErr).
type scriptCmd struct {
	*redis.IntSliceCmd
	s *Store // nil: none to tell
}

// NoRetry implements redis.Cmder.
func (scriptCmd) NoRetry() bool { return true }

// SetErr implements redis.Cmder, telling the Store each error as go-redis
// sets it, on every try.
func (c scriptCmd) SetErr(err error) {
	c.IntSliceCmd.SetErr(err)
	c.s.sawErr(err)
}

// intCmd is an IntCmd whose errors are told to s (nil: none), as
// scriptCmd's are.
type intCmd struct {
	*redis.IntCmd
	s *Store
}

// SetErr implements redis.Cmder, as scriptCmd's does.
func (c intCmd) SetErr(err error) {
	c.IntCmd.SetErr(err)
	c.s.sawErr(err)
}

func newCmd(ctx context.Context, s *Store, args []any) scriptCmd {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3) // a cluster routes by the first key, after numkeys
	cmd.SetStepCount(1)   // see keyed
	return scriptCmd{cmd, s}
}

// keyed marks cmd with its key step, as newCmd does: go-redis's Cluster
// client reads it otherwise from its command table, which it loads on the
// first ClusterClient.Process (COMMAND, from nodes one at a time) under a
// lock every later Process takes, so a stopped node asked first held every
// call of a new client for the read timeout (3 s). With it set the table
// is never needed: the key's position is set too, and no command sluice
// sends has a routing policy of its own.
func keyed[C redis.Cmder](cmd C) C {
	cmd.SetStepCount(1)
	return cmd
}

// evalCmd is EVALSHA (or EVAL) of script on keys, as go-redis's EvalSha
// builds it, marked by keyed.
func evalCmd(ctx context.Context, verb, script string, keys []string, args ...any) *redis.Cmd {
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, verb, script, len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	cmd := redis.NewCmd(ctx, append(argv, args...)...)
	cmd.SetFirstKeyPos(3)
	return keyed(cmd)
}

// evalArgs are args, an EVALSHA of s, as an EVAL: the script's source in
// place of its digest. EVAL also caches the script, so the next EVALSHA
// finds it.
func evalArgs(s *script, args []any) []any {
	return append([]any{"eval", s.src}, args[2:]...)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// Past its caller's deadline a command runs on for lateRTTs of Redis's
// round trips (as its answered sends measure it), at least lateMin and at
// most lateMax times what its caller had (see sendContext): room for a
// late reply and a new connection's handshake and first command (about
// five round trips),
// while a Redis that answers nothing holds a connection 3 times its
// caller's time. A fixed 10 times held each one 500 ms for a 50 ms caller.
const (
	lateRTTs = 8
	lateMin  = 2
	lateMax  = 9
)

// sendContext returns the context to send a command on for a caller with
// budget left (0: no deadline), Redis's answered round trip being rtt (0:
// not known): base's values, not its end, and a deadline of its own past
// the caller's (see lateRTTs). The caller stops waiting at its own
// deadline; the command runs on. With ContextTimeoutEnabled go-redis
// closes a connection whose read the deadline cuts, so a caller's deadline
// would close a connection for every reply a little late, and each next
// call would pay a new connection's handshake (several round trips) and
// time out in turn. A reply a few round trips late returns its connection
// to the pool; a Redis that never answers is still cut off.
func sendContext(base context.Context, budget, rtt time.Duration) (context.Context, context.CancelFunc) {
	ctx := base
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(base)
	}
	if budget <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, budget+min(max(lateRTTs*rtt, lateMin*budget), lateMax*budget))
}

// budgetOf is what ctx has left, or 0 if it has no deadline.
func budgetOf(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return max(time.Until(dl), time.Nanosecond)
}

// runOne sends c on its own, on ctx: EVALSHA, and EVAL if the server has
// lost the script; s (nil: none) is told its errors.
func runOne(ctx context.Context, client redis.UniversalClient, s *Store, c *call) {
	cmd := newCmd(ctx, s, c.args)
	err := client.Process(ctx, cmd)
	if isNoScript(err) {
		cmd = newCmd(ctx, s, evalArgs(c.script, c.args))
		err = client.Process(ctx, cmd)
	}
	c.val, c.err = cmd.Val(), err
}

// bounded runs send on a goroutine of its own and returns when it is done,
// or with ctx.Err() as soon as ctx ends, whichever comes first: a caller's
// deadline bounds its call whatever the client's own timeouts (go-redis
// applies a context's deadline to reads and writes only with
// ContextTimeoutEnabled). An abandoned send runs on until its own deadline
// (sendContext) or the client's timeouts end it, and a take it carried may
// still be charged. send always
// runs. done (buffered, empty) receives one signal when send returns. A
// context that can never end costs no goroutine: send runs on the caller's.
// Once shut is closed (nil: never), it returns redis.ErrClosed at once,
// leaving send to go-redis's retries (see Store.sawErr).
func bounded(ctx context.Context, shut <-chan struct{}, done chan struct{}, send func()) error {
	if ctx == nil || ctx.Done() == nil {
		send()
		return nil
	}
	go func() {
		send()
		done <- struct{}{}
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-shut:
		return redis.ErrClosed
	}
}

// ended is ctx.Err(), and context.DeadlineExceeded once ctx's deadline
// has passed even if its timer has not fired yet: go-redis, with
// ContextTimeoutEnabled, may end a read at the deadline just before it.
func ended(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return context.DeadlineExceeded
	}
	return nil
}

// atEnd is err, a finished call's, or once ctx has ended, ctx's error
// wrapping it: with ContextTimeoutEnabled go-redis ends a read at ctx's
// deadline as a network timeout, a hair before ctx's own timer fires, and
// the caller was promised ctx's error.
func atEnd(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if end := ended(ctx); end != nil && !errors.Is(err, end) {
		return fmt.Errorf("%w: %w", end, err)
	}
	return err
}

// boundedErr is bounded for a command that returns only an error: f's
// error, or ctx.Err() as soon as ctx ends. Every call that talks to Redis
// outside the decision path (Check, CheckAccess, Membership) goes through
// it, so that it keeps the same promise; and one that finishes once ctx
// has ended is not a success (a heartbeat past its deadline is stale).
func boundedErr(ctx context.Context, f func() error) error {
	var err error
	if berr := bounded(ctx, nil, make(chan struct{}, 1), func() { err = f() }); berr != nil {
		return berr
	}
	if err != nil {
		return atEnd(ctx, err) // what failed stays in the chain (a stalled script)
	}
	return ended(ctx)
}

// await is bounded for c: on ctx's end, or shut's, c is left to its
// sender.
func (c *call) await(ctx context.Context, shut <-chan struct{}, send func()) error {
	if c.done == nil {
		c.done = make(chan struct{}, 1)
	}
	err := bounded(ctx, shut, c.done, send)
	if err != nil {
		c.gone = true
	}
	return err
}

// A Cluster answers TRYAGAIN, without running the script, to a call whose
// keys a slot migration has split between two nodes (a grant's state and
// epoch, a ReleaseOnce's holders and released holders): Redis asks clients
// to try again after a short delay. A call tries again, after a backoff
// from tryAgainFirst doubling up to tryAgainMost, for up to tryAgainFor and
// never past its context's deadline: it then fails with the TRYAGAIN (see
// ErrResharding), before the deadline rather than at it.
const (
	tryAgainFirst = 2 * time.Millisecond
	tryAgainMost  = 50 * time.Millisecond
	tryAgainFor   = time.Second
)

// tryAgain is one call's retries of TRYAGAIN; the zero value has made none.
type tryAgain struct {
	start time.Time
	wait  time.Duration
}

// again reports whether c, just answered, met TRYAGAIN and is to be sent
// again: it then waits out the backoff and clears c's reply. It reports
// false, with c's error as it is, when the retries' time is up, when the
// next one would start past ctx's deadline, or when ctx ends meanwhile.
func (r *tryAgain) again(ctx context.Context, c *call) bool {
	if !isTryAgain(c.err) || ended(ctx) != nil {
		return false
	}
	now := time.Now()
	if r.start.IsZero() {
		r.start, r.wait = now, tryAgainFirst
	} else {
		r.wait = min(2*r.wait, tryAgainMost)
	}
	next := now.Add(r.wait)
	if next.Sub(r.start) > tryAgainFor {
		return false
	}
	if dl, ok := ctx.Deadline(); ok && !next.Before(dl) {
		return false
	}
	t := time.NewTimer(r.wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	c.val, c.err = nil, nil
	return true
}

// isTryAgain reports whether err is Redis's TRYAGAIN.
func isTryAgain(err error) bool {
	return err != nil && strings.HasPrefix(replyText(err), "TRYAGAIN")
}

// failed is the error of a call on key that failed with err. A Cluster
// client closed by its owner makes it sluice.ErrStoreClosed, and every
// later call fail at once, whatever err is: go-redis's Cluster client
// takes a closed node for one a reload dropped and tries again after its
// retry backoff, three times, so a call on a closed client takes 100–145
// ms to return redis.ErrClosed, and a shorter deadline (resilient's 50 ms)
// cut it first, every time. Other failures may mean a node is gone: the
// slot map is reloaded (reloader.failed), never for a closed client.
func (s *Store) failed(key string, err error) error {
	closed, err := s.closedBy(key, err)
	if !closed {
		s.reload.failed(key, err)
	}
	return replyErr(err)
}

// closedBy reports whether the Store's Cluster client is closed (asked of
// key's master, with no round trip), and then records it (noteClosed),
// and makes err wrap redis.ErrClosed.
func (s *Store) closedBy(key string, err error) (bool, error) {
	if s.reload == nil || !s.reload.clientClosed(key) {
		return false, err
	}
	s.noteClosed()
	if !errors.Is(err, redis.ErrClosed) {
		err = fmt.Errorf("%w: %w", err, redis.ErrClosed)
	}
	return true, err
}

// sawErr is told each error go-redis sets on the Store's script calls, at
// every try, and notes a Cluster client its owner closed at the first
// try: go-redis fails each try on a closed client at once, but takes it
// for a node a reload dropped and tries again after its retry backoff,
// three times, so its caller would learn of the close only 100–145 ms
// later (resilient's 50 ms timeout cut it first). A closed client's
// error is rare, so the question (clientClosed, no round trip) is asked
// only then: a node's client that a reload closed fails so too, its key's
// master then being another.
func (s *Store) sawErr(err error) {
	if s == nil || s.reload == nil || err == nil || s.closed.Load() || !errors.Is(err, redis.ErrClosed) {
		return
	}
	if s.reload.clientClosed("") {
		s.noteClosed()
	}
}

// noteClosed records that the Store's client is closed: every later call
// fails at once, and every call waiting on it returns (shut).
func (s *Store) noteClosed() {
	s.closed.Store(true)
	if s.shut != nil {
		s.shutOnce.Do(func() { close(s.shut) })
	}
}

// CheckClosed returns an error wrapping sluice.ErrStoreClosed when the
// Store's client was closed by its owner, else nil, with no round trip.
// A call on a closed Cluster client fails only after go-redis's retries
// (100–145 ms): a wrapper whose own timeout cut it (package resilient)
// asks here, so that it returns the closure rather than count an outage.
func (s *Store) CheckClosed() error {
	if s == nil || s.client == nil {
		return nil
	}
	if s.closed.Load() {
		return replyErr(redis.ErrClosed)
	}
	if s.reload != nil {
		if closed, err := s.closedBy("", redis.ErrClosed); closed {
			return replyErr(err)
		}
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.client.Ping(ctx).Err(); errors.Is(err, redis.ErrClosed) {
		s.closed.Store(true)
		return replyErr(err)
	}
	return nil
}

// callKey is the key c's script runs on, which names its master.
func (c *call) callKey() string {
	if len(c.args) > argKey {
		if k, ok := c.args[argKey].(string); ok {
			return k
		}
	}
	return ""
}
