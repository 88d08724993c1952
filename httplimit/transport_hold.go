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
	// after the provider answered, whatever the request's context says.
	holdWriteTimeout = time.Second
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

	mu    sync.Mutex
	until map[string]time.Time // by key; expired entries are swept
}

// left returns how long key is held in this process.
func (h *holds) left(key string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.until) == 0 {
		return 0
	}
	end, ok := h.until[key]
	if !ok {
		return 0
	}
	left := time.Until(end)
	if left <= 0 {
		delete(h.until, key)
	}
	return left
}

// extend holds key in this process until end, unless it is held longer.
func (h *holds) extend(key string, end time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.until == nil {
		h.until = make(map[string]time.Time)
	}
	if cur, ok := h.until[key]; ok && !cur.Before(end) {
		return
	}
	if len(h.until) >= 64 {
		now := time.Now()
		for k, e := range h.until {
			if !e.After(now) {
				delete(h.until, k)
			}
		}
	}
	h.until[key] = end
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
		if d, ok := ctx.Deadline(); ok && time.Until(d) < left {
			return fmt.Errorf("httplimit: %q is held for %v more, past the request's deadline: %w (%w)",
				key, left.Round(time.Millisecond), ErrProviderHold, context.DeadlineExceeded)
		}
		if timer == nil {
			timer = time.NewTimer(left)
		} else {
			timer.Reset(left)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("httplimit: waiting out the provider's hold on %q: %w", key, ctx.Err())
		case <-timer.C:
		}
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
	d, err := h.store.Peek(ctx, h.storeKey(key), holdLook, holdLook.Capacity())
	if err != nil {
		if ctx.Err() == nil {
			h.log("httplimit: could not look up the provider's hold in the store", key, err)
		}
		return h.left(key) > 0
	}
	if d.Allowed || d.RetryAfter <= 0 || madeUp(d) {
		// A 429 may have come back here while the store was asked.
		return h.left(key) > 0
	}
	h.extend(key, time.Now().Add(d.RetryAfter))
	return true
}

// hold holds key for d: in this process at once, then in the store for
// the fleet.
func (h *holds) hold(ctx context.Context, key string, d time.Duration) {
	h.extend(key, time.Now().Add(d))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holdWriteTimeout)
	defer cancel()
	if err := h.share(ctx, h.storeKey(key), d); err != nil {
		h.log("httplimit: could not share the provider's hold through the store; this process holds alone", key, err)
	}
}

// share raises the store's hold on k to at least d from now, never
// lowering a longer one. The take is a compare-and-set: under a limit
// whose capacity is the hold wanted, taking that less the hold seen is
// admitted only while the hold is no longer than seen, so holds set at
// once by several requests or processes do not add up. A denial tells
// the hold as it is, and the take is tried again on it. (The take reads a
// hold more than a minute longer than its capacity as expired, as GCRA
// reads another span's state: one set by another process between the look
// and the take would be cut to d. Only Retry-Afters a minute apart, within
// one round trip, meet that.)
func (h *holds) share(ctx context.Context, k string, d time.Duration) error {
	units := func(d time.Duration) int64 { return int64((d + holdUnit - 1) / holdUnit) }
	want := units(d) + 1 // +1: have rounds the hold seen up
	seen, err := h.store.Peek(ctx, k, holdLook, holdLook.Capacity())
	if err != nil || madeUp(seen) {
		return err
	}
	var have int64
	if !seen.Allowed {
		have = units(seen.RetryAfter)
	}
	set := sluice.Limit{Rate: holdRate, Period: holdPeriod, Burst: want}
	for range 3 {
		if have >= want {
			return nil
		}
		took, err := h.store.Take(ctx, k, set, want-have)
		if err != nil || took.Allowed || madeUp(took) {
			return err
		}
		// Denied: the hold is longer than seen, by the wait.
		have += units(took.RetryAfter)
	}
	return errors.New("httplimit: the store's hold kept changing")
}

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
