package resilient

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logpace"
)

// breaker is a circuit breaker that tells a slow backend from a dead one.
//
// Closed: every call goes to the backend. It opens when the calls of the
// last window fail at rate or more (at least minCalls of them), or when
// every call has failed for deadAfter (at least threshold in a row).
// Open: no calls until interval has passed. Half-open: one call at a time
// probes; closeAfter successes in a row close it, one failure opens it
// for another interval.
//
// The hysteresis: opening takes a failure rate over many calls or a long
// unbroken run of failures; closing takes several good probes and clears
// the window, so a closed breaker reopens only on new evidence.
//
// New evidence only: every transition starts a generation, each call is
// let through under one (its turn), and the outcome of a call let through
// under an older generation is ignored. Calls sent before the breaker
// opened that fail after probes closed it (still dialling a master that
// failed over) tell of the backend before the probes judged it anew.
type breaker struct {
	rate       float64
	minCalls   int64
	slice      time.Duration // window / windowSlices
	deadAfter  time.Duration
	threshold  int64
	interval   time.Duration
	closeAfter int
	name       string
	partition  string // the backend's partition it guards; "": the whole store
	policy     Policy
	observer   sluice.Observer
	log        *slog.Logger
	cause      func(error) string // Options.Cause; nil: none
	jitter     func() float64     // in [0, 1); nil: none (tests)

	// state is generation<<8 | sluice.BreakerState, read without the
	// lock on the hot path: one word, so that a turn's generation is
	// that of the state that let the call through.
	state atomic.Uint64
	run   atomic.Int64 // consecutive failures while closed
	// lastGood is the UnixNano send time of the latest call the backend
	// answered: a call that spans partitions and failed is not charged to
	// one that answered a call sent after it (see MultiStore.TakeAll).
	lastGood atomic.Int64
	window   [windowSlices]slot

	mu       sync.Mutex
	runStart time.Time // the first failure of the run
	runLast  time.Time // the last failure of the run
	retryAt  time.Time // open: when the next probe may go
	probing  bool      // half-open: a probe is in flight
	// dueAgain: the backend was said to be back (due) while a probe was
	// in flight, so should that probe fail, the next is due at once.
	dueAgain bool
	good     int // half-open: probes that succeeded in a row
	// Logging an outage's probe cycles (set): transitions between open and
	// half-open since it closed last, the time before which the next is
	// not logged, and how many went unlogged.
	cycles     int
	quietUntil time.Time
	unlogged   int

	// closed logs the failure policy's answers while the breaker is
	// closed (policyAnswered).
	closed closedAnswers

	// probeKey is a key found on the partition, for Probe; "": none yet.
	probeKey string
	// confirming: Store.confirm's probes run.
	confirming atomic.Bool
}

// windowSlices is how many parts the failure-rate window is kept in: the window
// slides by a tenth of its span.
const windowSlices = 10

// slot counts one slice of the window; epoch says which.
type slot struct {
	epoch, calls, fails atomic.Int64
}

func newBreaker(o *Options, name string) breaker {
	window := orDefault(o.Window, 10*time.Second)
	log := orDefault(o.Logger, slog.Default())
	return breaker{
		rate:       orDefault(o.FailureRate, 0.5),
		minCalls:   int64(orDefault(o.MinCalls, 20)),
		slice:      max(window/windowSlices, time.Nanosecond),
		deadAfter:  orDefault(o.DeadAfter, 500*time.Millisecond),
		threshold:  int64(orDefault(o.FailureThreshold, 3)),
		interval:   orDefault(o.ProbeInterval, time.Second),
		closeAfter: orDefault(o.CloseAfter, 3),
		name:       name,
		policy:     o.Policy,
		observer:   o.Observer,
		log:        log,
		cause:      o.Cause,
		jitter:     rand.Float64,
		closed:     closedAnswers{log: log, store: name, policy: o.Policy, pace: logpace.Pacer{Gather: closedGather, Every: closedQuiet}},
	}
}

// forPartition names the partition b guards, in its lines and events.
func (b *breaker) forPartition(p string) {
	b.partition, b.closed.partition = p, p
}

func (b *breaker) current() sluice.BreakerState { return sluice.BreakerState(b.state.Load() & 0xff) }

// turn is a call's pass through the breaker: whether it is a probe, and
// the generation it was let through under.
type turn struct {
	probe bool
	gen   uint64
}

// stale reports whether the breaker has changed state since t was given.
func (b *breaker) stale(t turn) bool { return b.state.Load()>>8 != t.gen }

// answeredAt notes that the backend answered a call sent at sent.
func (b *breaker) answeredAt(sent time.Time) {
	if t := sent.UnixNano(); t > b.lastGood.Load() {
		b.lastGood.Store(t)
	}
}

// announce tells the observer the breaker's initial state, closed, as an
// event from closed to closed: a gauge of its state (promsluice's
// sluice_breaker_state) then has its series before the first transition,
// for an alert on "open" to read.
func (b *breaker) announce() {
	if b.observer != nil {
		b.observer.ObserveBreaker(sluice.BreakerEvent{Store: b.name, Partition: b.partition, From: sluice.BreakerClosed, To: sluice.BreakerClosed})
	}
}

// policyAnswered notes a decision the failure policy answered, for a call
// that failed with err (nil: none was sent). While the breaker is closed
// no transition tells it: closedAnswers logs it.
func (b *breaker) policyAnswered(err error) {
	if b.current() == sluice.BreakerClosed {
		b.closed.note(err)
	}
}

// allow reports whether this call may go to the backend, and its turn.
func (b *breaker) allow(now time.Time) (bool, turn) {
	if v := b.state.Load(); sluice.BreakerState(v&0xff) == sluice.BreakerClosed {
		return true, turn{gen: v >> 8}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.current() {
	case sluice.BreakerClosed:
		return true, turn{gen: b.state.Load() >> 8}
	case sluice.BreakerOpen:
		if now.Before(b.retryAt) {
			return false, turn{}
		}
		b.set(now, sluice.BreakerHalfOpen, "probe", nil)
	}
	if b.probing {
		return false, turn{}
	}
	b.probing = true
	return true, turn{probe: true, gen: b.state.Load() >> 8}
}

// due makes an open breaker's next probe due at now, or, with a probe in
// flight, the one after it should it fail: a probe sent to the backend
// that failed over (a dead master's address) says nothing of the new one.
func (b *breaker) due(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.current() {
	case sluice.BreakerOpen:
		if now.Before(b.retryAt) {
			b.retryAt = now
		}
	case sluice.BreakerHalfOpen:
		b.dueAgain = b.probing
	}
}

// success records a call sent at sent that the backend answered. Only
// probes close the breaker; a stale call counts for nothing but lastGood.
func (b *breaker) success(t turn, sent time.Time) {
	b.answeredAt(sent)
	if !t.probe {
		if b.stale(t) {
			return
		}
		b.count(sent, false)
		if b.run.Load() != 0 {
			b.run.Store(0)
		}
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stale(t) {
		return // its half-open ended without it (Probe closed the breaker)
	}
	b.probing = false
	if b.good++; b.good >= b.closeAfter {
		b.set(sent, sluice.BreakerClosed, fmt.Sprintf("%d probes succeeded", b.good), nil)
	}
}

// failure records a call sent at sent that failed (or timed out) at now
// with err, which the line logged if the breaker opens names.
//
// A run of failures is timed by when its calls were sent, not when they
// failed: calls sent DeadAfter apart that all failed, with no quiet gap
// longer than the window between them, show a dead backend,
// while a process that stalled (a long GC or CPU throttling) sees the
// calls it had in flight fail together, sent at about the same time.
//
// A stale call is ignored: sent before the breaker opened, it must not
// reopen it once probes have closed it; a probe whose half-open ended
// without it must not reopen a breaker Probe closed.
func (b *breaker) failure(t turn, sent, now time.Time, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stale(t) {
		return
	}
	if t.probe {
		b.probing = false
		b.reopen(now, "probe failed", err)
		if b.dueAgain {
			b.dueAgain = false
			b.retryAt = now
		}
		return
	}
	// Neither stale nor a probe: let through by, and sent under, this
	// closed state.
	calls, fails := b.count(sent, true)
	// A run spans no quiet gap longer than the window: calls that failed
	// minutes apart, with none sent between, say nothing of the backend
	// in between, and a lone failure after them must not open the breaker.
	if b.run.Load() > 0 && sent.Sub(b.runLast) > b.slice*windowSlices {
		b.run.Store(0)
	}
	if b.run.Add(1) == 1 {
		b.runStart = sent
	}
	if sent.After(b.runLast) || b.run.Load() == 1 {
		b.runLast = sent
	}
	var why string
	switch span := sent.Sub(b.runStart); {
	case calls >= b.minCalls && float64(fails) >= b.rate*float64(calls):
		why = fmt.Sprintf("%d of %d calls failed in %v", fails, calls, b.slice*windowSlices)
	case b.run.Load() >= b.threshold && span >= b.deadAfter:
		why = fmt.Sprintf("every call sent over %v failed (%d calls)", span, b.run.Load())
	default:
		return
	}
	b.reopen(now, why, err)
}

// reopen opens the breaker until the next probe: after ProbeInterval and
// up to a quarter more at random, so that probes do not fall in step with
// a backend that stalls periodically.
func (b *breaker) reopen(now time.Time, why string, err error) {
	wait := b.interval
	if b.jitter != nil {
		wait += time.Duration(b.jitter() * float64(b.interval) / 4)
	}
	b.retryAt = now.Add(wait)
	b.set(now, sluice.BreakerOpen, why, err)
}

// answered records a call sent at sent that the backend answered. A probe
// that wrote nothing (a peek, a denial, a release of a slot not held)
// proves reads only: a backend that refuses writes (out of memory, a
// replica) answers those. It neither closes nor opens the breaker, and
// gives its turn to the next call; it reports true, so that the caller
// sends a probe that writes at once (Store.confirm): a backend that
// answered most likely works, and calls that only read (releases retried
// with nothing else calling) would otherwise never close it.
func (b *breaker) answered(t turn, sent time.Time, wrote bool) (confirm bool) {
	if t.probe && !wrote {
		b.answeredAt(sent)
		b.release(t)
		return true
	}
	b.success(t, sent)
	return false
}

// release ends a call that taught nothing about the backend (the caller
// gave up, or sent bad input). A probe gives its turn to the next call.
func (b *breaker) release(t turn) {
	if !t.probe {
		return
	}
	b.mu.Lock()
	if !b.stale(t) { // else the probe in flight, if any, is another's
		b.probing = false
	}
	b.mu.Unlock()
}

// count adds a call to the window's slice at now and returns the window's
// totals. A slice from an older turn of the ring is cleared first; the rare
// call counted into a slice while another clears it is lost, which only
// blurs the rate.
func (b *breaker) count(now time.Time, failed bool) (calls, fails int64) {
	e := now.UnixNano() / int64(b.slice)
	sl := &b.window[e%windowSlices]
	if old := sl.epoch.Load(); old != e && sl.epoch.CompareAndSwap(old, e) {
		sl.calls.Store(0)
		sl.fails.Store(0)
	}
	sl.calls.Add(1)
	if failed {
		sl.fails.Add(1)
	}
	if !failed {
		return 0, 0 // only failures ask for the totals
	}
	for i := range b.window {
		s := &b.window[i]
		if ep := s.epoch.Load(); ep > e-windowSlices && ep <= e {
			calls += s.calls.Load()
			fails += s.fails.Load()
		}
	}
	return calls, fails
}

// set changes state under b.mu and reports the change: one log line for
// the transition (with the error of the call that opened it, so that a
// cause such as NOPERM is on the line) and an Observer event. The failure
// policy starts answering every call as the breaker leaves closed and
// stops as it closes: the same moment, so that transition's line names the
// policy (policy) rather than a line of its own saying so, and the
// opening one counts the decisions the policy answered while the breaker
// was still closed (answered_while_closed), whose own line would be
// pending then.
func (b *breaker) set(now time.Time, to sluice.BreakerState, why string, err error) {
	from := b.current()
	if from == to {
		return
	}
	var answered int64
	var firstErr error
	if from == sluice.BreakerClosed {
		answered, firstErr = b.closed.take()
	}
	// An outage probes every ProbeInterval: after its first probe cycle
	// (half_open, open again) is logged, the next ones are logged at most
	// once a minute, with how many were not. Every transition is observed.
	cycle := from != sluice.BreakerClosed && to != sluice.BreakerClosed
	quiet := cycle && b.cycles >= 2 && now.Before(b.quietUntil)
	if cycle {
		b.cycles++
		if !quiet && b.cycles > 2 {
			b.quietUntil = now.Add(time.Minute)
		}
	}
	b.state.Store((b.state.Load()>>8+1)<<8 | uint64(to))
	b.good = 0
	if to == sluice.BreakerClosed {
		b.dueAgain = false
	}
	if to == sluice.BreakerClosed {
		b.run.Store(0)
		for i := range b.window {
			b.window[i].epoch.Store(0)
			b.window[i].calls.Store(0)
			b.window[i].fails.Store(0)
		}
	}
	level := slog.LevelInfo
	if to == sluice.BreakerOpen {
		level = slog.LevelWarn
	}
	ctx := context.Background()
	attrs := b.attrs("from", from.String(), "reason", why)
	if err != nil {
		attrs = append(attrs, "error", err)
		if b.cause != nil && !quiet {
			attrs = append(attrs, "cause", b.cause(err))
		}
	}
	if from == sluice.BreakerClosed || to == sluice.BreakerClosed {
		attrs = append(attrs, "policy", b.policy.String())
	}
	if answered > 0 {
		attrs = append(attrs, "answered_while_closed", answered)
		if firstErr != nil && (err == nil || firstErr.Error() != err.Error()) {
			attrs = append(attrs, "first_error", firstErr)
		}
	}
	// Leaving closed and closing are never quiet: only probe cycles are.
	switch {
	case quiet:
		b.unlogged++
	case b.unlogged > 0:
		attrs = append(attrs, "transitions_not_logged", b.unlogged)
		b.unlogged = 0
		fallthrough
	default:
		b.log.Log(ctx, level, "resilient: breaker "+to.String(), attrs...)
	}
	if to == sluice.BreakerClosed {
		b.cycles = 0
	}
	if b.observer != nil {
		b.observer.ObserveBreaker(sluice.BreakerEvent{Store: b.name, Partition: b.partition, From: from, To: to, Err: err})
	}
}

// attrs are a line's attributes: the store, its partition if b guards
// one, then more.
func (b *breaker) attrs(more ...any) []any {
	a := []any{"store", b.name}
	if b.partition != "" {
		a = append(a, "partition", b.partition)
	}
	return append(a, more...)
}
