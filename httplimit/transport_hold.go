package httplimit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logpace"
)

// ErrProviderHold is wrapped, with context.DeadlineExceeded, by the error
// of a Transport request whose deadline ends before the provider's hold on
// its key (a 429 or 503 with Retry-After) does.
var ErrProviderHold = errors.New("httplimit: the provider asked to wait (Retry-After)")

// MaxProviderHold is the longest hold a Transport keeps for one
// Retry-After: a longer one is cut to it, so that a provider's mistake
// cannot stop a key for good.
const MaxProviderHold = 24 * time.Hour

// retryAfter is how long a response with header h asks its client to wait:
// its Retry-After in seconds, or as an HTTP-date read against the
// response's Date (the provider's clock, not ours) or, without one, now;
// at most MaxProviderHold. Zero when it asks nothing.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseUint(v, 10, 64); err == nil {
		return time.Duration(min(secs, uint64(MaxProviderHold/time.Second))) * time.Second
	} else if errors.Is(err, strconv.ErrRange) {
		return MaxProviderHold
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if date, err := http.ParseTime(h.Get("Date")); err == nil {
		now = date
	}
	return min(max(at.Sub(now), 0), MaxProviderHold)
}

// The shared hold is a GCRA key in the limiter's store whose TAT is the
// hold's end: one unit is a millisecond (holdRate per holdPeriod), so a
// take of n units on a free key holds it n ms, and a peek of the whole
// capacity is denied exactly until the end, with that wait. A long period
// keeps it clear of stores that refuse short ones (a lease store's
// staleness).
const (
	holdPeriod = MaxProviderHold
	holdRate   = int64(MaxProviderHold / time.Millisecond)
	holdUnit   = time.Millisecond
	// holdWriteTimeout bounds the store calls sharing a hold: they run
	// after the provider answered, whatever the request's context says,
	// in the background once that context ends.
	holdWriteTimeout = time.Second
	// holdRecheck is how often a process's waiters on a held key look at
	// the store again, so that a hold cleared elsewhere (ClearHold) lifts
	// here too: at most one look per key and period.
	holdRecheck = time.Second
	// holdSame is how much later than a hold already seen in the store
	// one read there may end and still be that hold: reads of one hold
	// differ by their round trips.
	holdSame = time.Second
)

// holdLook is the limit holds are read under: its span covers the longest
// hold, so no hold is read as another span's state (see
// sluice.MaxClockSkew).
var holdLook = sluice.Limit{Rate: holdRate, Period: holdPeriod, Burst: holdRate}

// holds are a Transport's holds: this process's own, and the store's,
// which the fleet shares.
type holds struct {
	store  sluice.Store
	prefix string
	logger *slog.Logger
	pace   logpace.Pacer // the store's failures' lines, per kind

	max time.Duration // the longest hold kept; 0: MaxProviderHold

	mu    sync.Mutex
	until map[string]held      // by key; expired entries are swept
	seen  map[string]storeHold // by key, under a MaxHold; ended ones are swept
	wake  chan struct{}        // closed when a hold is cleared here
	// writes are the holds being shared through the store, by key: one
	// writer per key, so that a burst of 429s on a slow store costs one
	// write at a time, not one each.
	writes map[string]*write
	idle   chan struct{} // closed when writes empties (nil: nobody waits)
}

// write is a key's writer: the hold it is writing and the one to write
// next, each with a channel closed once written (or given up).
type write struct {
	cur      time.Time // the end being written
	curDone  chan struct{}
	next     time.Time // the longest end still to write; zero: none
	nextCtx  context.Context
	nextDone chan struct{}
	cleared  bool // ClearHold ran since the current write started
}

// storeHold is a hold in the store as this Transport first saw it: MaxHold
// counts from then, so that each look at the store, by a waiter or a new
// request, does not start it again.
type storeHold struct {
	end   time.Time // when the store's hold ends
	first time.Time // when this Transport first saw it
}

// held is a key's hold in this process.
type held struct {
	end time.Time
	// shared is when the store was last seen to hold it as long (zero:
	// not yet, or it could not): a look at the store started after it
	// that finds no hold means the hold was cleared.
	shared  time.Time
	checked time.Time // when a waiter last looked at the store
}

// left returns how long key is held in this process.
func (h *holds) left(key string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.until) == 0 {
		return 0
	}
	e, ok := h.until[key]
	if !ok {
		return 0
	}
	left := time.Until(e.end)
	if left <= 0 {
		delete(h.until, key)
	}
	return left
}

// extend holds key in this process until end, unless it is held longer.
// shared is when the store was seen to hold it so (zero: not yet).
func (h *holds) extend(key string, end, shared time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.extendLocked(key, end, shared)
}

// extendLocked is extend with h.mu held.
func (h *holds) extendLocked(key string, end, shared time.Time) {
	if h.until == nil {
		h.until = make(map[string]held)
	}
	if cur, ok := h.until[key]; ok && !cur.end.Before(end) {
		if !shared.IsZero() && cur.end.Equal(end) {
			cur.shared = shared
			h.until[key] = cur
		}
		return
	}
	if len(h.until) >= 64 {
		now := time.Now()
		for k, e := range h.until {
			if !e.end.After(now) {
				delete(h.until, k)
			}
		}
	}
	h.until[key] = held{end: end, shared: shared}
}

// cap is d cut to the longest hold kept.
func (h *holds) cap(d time.Duration) time.Duration {
	if h.max > 0 {
		return min(d, h.max)
	}
	return d
}

// fromStore returns when a hold the store has on key, read at now with d
// left, ends in this process: at most MaxHold after this Transport first
// saw that hold. One ending later than the hold seen (by over holdSame),
// or seen after that one ended, is a new hold.
func (h *holds) fromStore(key string, now time.Time, d time.Duration) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fromStoreLocked(key, now, d)
}

// fromStoreLocked is fromStore with h.mu held.
func (h *holds) fromStoreLocked(key string, now time.Time, d time.Duration) time.Time {
	end := now.Add(d)
	if h.max == 0 {
		return end // the store's holds are no longer than MaxProviderHold
	}
	s, ok := h.seen[key]
	switch {
	case !ok || !s.end.After(now) || end.After(s.end.Add(holdSame)):
		if h.seen == nil {
			h.seen = make(map[string]storeHold)
		}
		if len(h.seen) >= 64 {
			for k, e := range h.seen {
				if !e.end.After(now) {
					delete(h.seen, k)
				}
			}
		}
		s = storeHold{end: end, first: now}
	case end.After(s.end):
		s.end = end
	}
	h.seen[key] = s
	if capped := s.first.Add(h.max); capped.Before(end) {
		return capped
	}
	return end
}

// gone drops key's hold in this process when the store, looked at from
// since, no longer has it though it had it before: it was cleared.
func (h *holds) gone(key string, since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.seen, key) // the store has no hold: the next one is new
	if e, ok := h.until[key]; ok && !e.shared.IsZero() && e.shared.Before(since) {
		delete(h.until, key)
	}
}

// clear drops key's hold in this process and wakes its waiters.
func (h *holds) clear(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.until, key)
	delete(h.seen, key)
	if h.wake != nil {
		close(h.wake)
		h.wake = nil
	}
}

// waiting returns the channel closed when a hold is cleared here, and
// whether key's waiters are due to look at the store again (the caller
// then does).
func (h *holds) waiting(key string) (<-chan struct{}, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.wake == nil {
		h.wake = make(chan struct{})
	}
	e, ok := h.until[key]
	due := ok && time.Since(e.checked) >= holdRecheck
	if due {
		e.checked = time.Now()
		h.until[key] = e
	}
	return h.wake, due
}

// wait returns once key is not held in this process, or at once with an
// error when ctx ends first or its deadline would.
func (h *holds) wait(ctx context.Context, key string) error {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		left := h.left(key)
		if left <= 0 {
			return nil
		}
		wake, due := h.waiting(key)
		if due {
			h.recheck(ctx, key)
			continue
		}
		if d, ok := ctx.Deadline(); ok && time.Until(d) < left {
			return fmt.Errorf("httplimit: %q is held for %v more, past the request's deadline: %w (%w)",
				key, left.Round(time.Millisecond), ErrProviderHold, context.DeadlineExceeded)
		}
		sleep := min(left, holdRecheck)
		if timer == nil {
			timer = time.NewTimer(sleep)
		} else {
			timer.Reset(sleep)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("httplimit: waiting out the provider's hold on %q: %w", key, ctx.Err())
		case <-timer.C:
		case <-wake:
		}
	}
}

// recheck looks at key's hold in the store, for a waiter: a hold cleared
// there is dropped here. A store that cannot say changes nothing.
func (h *holds) recheck(ctx context.Context, key string) {
	start := time.Now()
	d, err := h.store.Peek(ctx, h.storeKey(key), holdLook, holdLook.Capacity())
	if err != nil || madeUp(d) {
		return
	}
	if d.Allowed || d.RetryAfter <= 0 {
		h.gone(key, start)
		return
	}
	now := time.Now()
	if end := h.fromStore(key, now, d.RetryAfter); end.After(now) {
		h.extend(key, end, now)
	}
}

// held reports whether key is held, here or in the store (a hold another
// process or an earlier request set): then it is held here too, until
// then. A store that cannot say is logged and counts as no hold but this
// process's own: the quota, just taken, still bounds the request.
func (h *holds) held(ctx context.Context, key string) bool {
	if h.left(key) > 0 {
		return true
	}
	start := time.Now()
	d, err := h.store.Peek(ctx, h.storeKey(key), holdLook, holdLook.Capacity())
	if err != nil {
		if ctx.Err() == nil {
			h.log("httplimit: could not look up the provider's hold in the store", key, err)
		}
		return h.left(key) > 0
	}
	if madeUp(d) {
		return h.left(key) > 0
	}
	if d.Allowed || d.RetryAfter <= 0 {
		// A 429 may have come back here while the store was asked: its
		// hold stands until shared, unless it was cleared since.
		h.gone(key, start)
		return h.left(key) > 0
	}
	now := time.Now()
	end := h.fromStore(key, now, d.RetryAfter)
	if !end.After(now) {
		// This Transport has waited MaxHold for it already.
		return h.left(key) > 0
	}
	h.extend(key, end, now)
	return true
}

// hold holds key for d: in this process at once, then in the store for
// the fleet. It waits for the store's write until ctx ends, no longer:
// the write goes on without it (see holdWriteTimeout).
func (h *holds) hold(ctx context.Context, key string, d time.Duration) {
	end := time.Now().Add(h.cap(d))
	h.extend(key, end, time.Time{})
	select {
	case <-h.queue(ctx, key, end):
	case <-ctx.Done():
	}
}

// queue has key's hold until end written to the store, by key's writer
// (started if there is none), and returns a channel closed once it is.
// An end no later than the one being written waits for that.
func (h *holds) queue(ctx context.Context, key string, end time.Time) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.writes[key]
	if w != nil && w.curDone != nil && !end.After(w.cur) {
		return w.curDone
	}
	if w == nil {
		if h.writes == nil {
			h.writes = make(map[string]*write)
		}
		w = &write{}
		h.writes[key] = w
		go h.writer(key, w)
	}
	if w.nextDone == nil {
		w.nextDone = make(chan struct{})
	}
	if end.After(w.next) {
		w.next, w.nextCtx = end, ctx
	}
	return w.nextDone
}

// writer writes key's holds to the store, one at a time, until none is
// left to write.
func (h *holds) writer(key string, w *write) {
	for {
		h.mu.Lock()
		if w.curDone != nil {
			close(w.curDone)
			w.cur, w.curDone = time.Time{}, nil
		}
		if w.nextDone == nil {
			delete(h.writes, key)
			if len(h.writes) == 0 && h.idle != nil {
				close(h.idle)
				h.idle = nil
			}
			h.mu.Unlock()
			return
		}
		end, ctx := w.next, w.nextCtx
		w.cur, w.curDone, w.cleared = end, w.nextDone, false
		w.next, w.nextCtx, w.nextDone = time.Time{}, nil, nil
		h.mu.Unlock()
		h.write(ctx, key, end, w)
	}
}

// write shares key's hold until end through the store, bounded by
// holdWriteTimeout whatever ctx (the request's) says: the provider has
// answered, and the fleet should hold too.
func (h *holds) write(ctx context.Context, key string, end time.Time, w *write) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holdWriteTimeout)
	defer cancel()
	start := time.Now()
	d := end.Sub(start)
	if d <= 0 {
		return
	}
	stored, err := h.share(ctx, h.storeKey(key), d)
	if err != nil {
		h.log("httplimit: could not share the provider's hold through the store; this process holds alone", key, err)
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.cleared {
		return // this process's hold is gone: the write must not bring it back
	}
	// This 429 shows the store's hold too (another's, when longer):
	// MaxHold counts from it.
	h.fromStoreLocked(key, start, stored)
	h.extendLocked(key, end, time.Now())
}

// drop forgets key's holds not yet written, and returns a channel closed
// once the one being written, if any, is: ClearHold waits for it, so that
// a write started before the clear does not set the hold again after it.
func (h *holds) drop(key string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	w := h.writes[key]
	if w == nil {
		return nil
	}
	w.cleared = true
	if w.nextDone != nil {
		close(w.nextDone) // its waiters go: the hold is cleared
		w.next, w.nextCtx, w.nextDone = time.Time{}, nil, nil
	}
	return w.curDone
}

// flush returns once no hold is being written.
func (h *holds) flush() {
	for {
		h.mu.Lock()
		if len(h.writes) == 0 {
			h.mu.Unlock()
			return
		}
		if h.idle == nil {
			h.idle = make(chan struct{})
		}
		idle := h.idle
		h.mu.Unlock()
		<-idle
	}
}

// share raises the store's hold on k to at least d from now, never
// lowering a longer one, and returns the hold it left, from its start. The take is a compare-and-set: under a limit
// whose capacity is the hold wanted, taking that less the hold seen is
// admitted only while the hold is no longer than seen, so holds set at
// once by several requests or processes do not add up. A denial tells
// the hold as it is, and the take is tried again on it. (The take reads a
// hold more than a minute longer than its capacity as expired, as GCRA
// reads another span's state: one set by another process between the look
// and the take would be cut to d. Only Retry-Afters a minute apart, within
// one round trip, meet that.)
func (h *holds) share(ctx context.Context, k string, d time.Duration) (time.Duration, error) {
	units := func(d time.Duration) int64 { return int64((d + holdUnit - 1) / holdUnit) }
	want := units(d) + 1 // +1: have rounds the hold seen up
	seen, err := h.store.Peek(ctx, k, holdLook, holdLook.Capacity())
	if err != nil {
		return 0, err
	}
	if madeUp(seen) {
		return 0, errPolicyAnswered
	}
	var have int64
	if !seen.Allowed {
		have = units(seen.RetryAfter)
	}
	set := sluice.Limit{Rate: holdRate, Period: holdPeriod, Burst: want}
	for range 3 {
		if have >= want {
			return time.Duration(have) * holdUnit, nil
		}
		took, err := h.store.Take(ctx, k, set, want-have)
		if err != nil {
			return 0, err
		}
		if took.Allowed {
			return time.Duration(want) * holdUnit, nil
		}
		if madeUp(took) {
			return 0, errPolicyAnswered
		}
		// Denied: the hold is longer than seen, by the wait.
		have += units(took.RetryAfter)
	}
	return 0, errors.New("httplimit: the store's hold kept changing")
}

// errPolicyAnswered: the store's failure policy answered, so nothing was
// written.
var errPolicyAnswered = errors.New("httplimit: the store's failure policy answered in its place")

// madeUp reports whether d is a failure policy's answer, which says
// nothing about a hold.
func madeUp(d sluice.Decision) bool {
	return d.Source == sluice.SourceFailOpen || d.Source == sluice.SourceFailClosed
}

// storeKey is key's hold in the store: beside the quota's key under the
// limiter's prefix, its suffix starting with a NUL no host has. Too long a
// key is hashed.
func (h *holds) storeKey(key string) string {
	k := h.prefix + key + "\x00hold"
	if len(k) > sluice.MaxKeyLen {
		sum := sha256.Sum256([]byte(h.prefix + key))
		k = "\x00hold:" + hex.EncodeToString(sum[:])
	}
	return k
}

// log writes a line for a failure of the store's holds: per kind (msg),
// one at once, then at most one a minute, with the number not logged.
func (h *holds) log(msg, key string, err error) {
	h.pace.Log(msg, func(notLogged int64) {
		h.logger.Warn(msg, "key", key, "error", err.Error(), "failures_not_logged", notLogged)
	})
}
