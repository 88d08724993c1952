package resilient

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
)

// A backend that is a sluice.Partitioner (redisstore's on a Cluster: a
// partition is a master, named by its address) has a breaker per
// partition, made at its first key: one master down sends its own keys to
// the failure policy, and the others' go on deciding on the backend. Keys
// whose partition the backend cannot tell ("") share the Store's own
// breaker, the only one of any other backend.
//
// Breakers are keyed by master rather than by slot range: a breaker
// measures a server's health, and a slot's keys follow its master as the
// client's slot map does (the map go-redis routes the calls by). A
// failover that promotes a replica thus sends the failed master's keys to
// the new master's breaker, closed, as soon as the map names it, with no
// probes to wait for; resharding moves a slot's keys to its new owner's
// breaker the same way. A partition no key maps to any more (a failed-over
// master, one whose slots all moved) is found by Probe, which closes its
// breaker and forgets it.

// breakerFor returns the breaker of key's partition.
func (s *Store) breakerFor(key string) *breaker {
	if s.parter == nil {
		return &s.br
	}
	p := s.parter.Partition(key)
	if p == "" {
		return &s.br
	}
	if m := s.parts.Load(); m != nil {
		if b := (*m)[p]; b != nil {
			return b
		}
	}
	return s.addPartition(p)
}

// addPartition returns p's breaker, making one if it has none, and
// announces a new one (its sluice_breaker_state series from the start).
func (s *Store) addPartition(p string) *breaker {
	s.partMu.Lock()
	old := s.parts.Load()
	if old != nil {
		if b := (*old)[p]; b != nil {
			s.partMu.Unlock()
			return b
		}
	}
	b := new(breaker)
	*b = newBreaker(&s.opts, s.name)
	b.forPartition(p)
	m := make(map[string]*breaker, 1)
	if old != nil {
		m = make(map[string]*breaker, len(*old)+1)
		for k, v := range *old {
			m[k] = v
		}
	}
	m[p] = b
	s.parts.Store(&m)
	s.partMu.Unlock()
	b.announce()
	return b
}

// forget drops p's breaker b, if it is still p's, and tells the
// observer, whose series for it would otherwise stay for good.
func (s *Store) forget(b *breaker) {
	s.partMu.Lock()
	old := s.parts.Load()
	if old == nil || (*old)[b.partition] != b {
		s.partMu.Unlock()
		return
	}
	m := make(map[string]*breaker, len(*old))
	for k, v := range *old {
		if v != b {
			m[k] = v
		}
	}
	s.parts.Store(&m)
	s.partMu.Unlock()
	// A new generation: calls still out on it count for nothing, so they
	// cannot open it and bring back what the observer just dropped.
	b.mu.Lock()
	b.state.Store((b.state.Load()>>8+1)<<8 | uint64(sluice.BreakerClosed))
	b.mu.Unlock()
	if b.observer != nil {
		b.observer.ObserveBreaker(sluice.BreakerEvent{Store: b.name, Partition: b.partition, From: sluice.BreakerClosed, To: sluice.BreakerClosed, Forgotten: true})
	}
}

// breakers returns every breaker: the Store's own first, then the
// partitions' by name.
func (s *Store) breakers() []*breaker {
	out := []*breaker{&s.br}
	if m := s.parts.Load(); m != nil {
		for _, b := range *m {
			out = append(out, b)
		}
		slices.SortFunc(out[1:], func(a, b *breaker) int { return cmp.Compare(a.partition, b.partition) })
	}
	return out
}

// BreakerStatus is one breaker's state (see Store.Breakers).
type BreakerStatus struct {
	// Partition names the backend's partition the breaker guards (a
	// Redis Cluster master's address), "" for the Store's own breaker.
	Partition string
	State     sluice.BreakerState
}

// Breakers returns the state of each breaker: the Store's own (Partition
// ""), then, over a backend that is a sluice.Partitioner, one per
// partition its keys were found on, by name. A partition no key maps to
// any more is dropped by the next Probe that finds it so.
func (s *Store) Breakers() []BreakerStatus {
	if s == nil {
		return []BreakerStatus{{State: sluice.BreakerClosed}}
	}
	bs := s.breakers()
	out := make([]BreakerStatus, len(bs))
	for i, b := range bs {
		out[i] = BreakerStatus{Partition: b.partition, State: b.current()}
	}
	return out
}

// State returns the breaker's current state: over a backend that is a
// sluice.Partitioner, the worst of its breakers' (open, then half-open),
// so that any partition whose keys the failure policy answers shows.
// Breakers tells them apart.
func (s *Store) State() sluice.BreakerState {
	if s == nil {
		return sluice.BreakerClosed // a zero MultiStore
	}
	worst := sluice.BreakerClosed
	for _, b := range s.breakers() {
		switch st := b.current(); {
		case st == sluice.BreakerOpen:
			return st
		case st == sluice.BreakerHalfOpen:
			worst = st
		}
	}
	return worst
}

// probeKey and probeLimit are what Probe takes from: a key no decision
// uses, under a limit that always admits, so that the probe writes as an
// allowed take does (a backend that answers reads but refuses writes, out
// of memory or a replica, keeps the breaker open).
const probeKey = "sluice-breaker-probe"

var probeLimit = sluice.PerSecond(1_000_000) // one a microsecond, the finest a limit may be

// probeSearch bounds the keys tried to find one on a partition: enough for
// a master of a few slots among 16384.
const probeSearch = 1 << 17

// probeKeyFor returns a key no decision uses on b's partition: probeKey,
// or probeKey + "-" + a number; false when none maps to it any more.
func (s *Store) probeKeyFor(b *breaker) (string, bool) {
	if s.parter == nil {
		return probeKey, true
	}
	b.mu.Lock()
	k := b.probeKey
	b.mu.Unlock()
	if k != "" && s.parter.Partition(k) == b.partition {
		return k, true
	}
	for i := range probeSearch {
		k = probeKey
		if i > 0 {
			k += "-" + strconv.Itoa(i)
		}
		if s.parter.Partition(k) == b.partition {
			b.mu.Lock()
			b.probeKey = k
			b.mu.Unlock()
			return k, true
		}
	}
	return "", false
}

// Probe sends each breaker's probe itself, when one is due: the breaker is
// open past its probe interval, or half-open with no probe in flight. A
// store that no request reaches (an idle instance, traffic moved to
// others) would otherwise stay open, and its health degraded, until the
// next request after the backend came back. The probe is a Take of one
// unit of a key no decision uses, on the breaker's partition, under a
// limit that always admits (its state lasts a millisecond on Redis),
// bounded by Options.Timeout; its outcome counts as a request's probe
// would. A partition breaker whose partition no key maps to any more (its
// master failed over, or its slots moved) is forgotten, closed first, with
// its line, if it was not. Probe sends nothing for a closed breaker or one
// with no probe due, and reports whether it sent a probe and the first
// error. After Close it sends nothing and returns an error wrapping
// sluice.ErrStoreClosed.
func (s *Store) Probe(ctx context.Context) (bool, error) {
	ctx = ctxutil.OrBackground(ctx)
	if s == nil || s.backend == nil {
		return false, nil
	}
	if s.closed.Load() {
		return false, fmt.Errorf("resilient: probe: %w", sluice.ErrStoreClosed)
	}
	s.evict.check(s.clock())
	sent := false
	var first error
	for _, b := range s.breakers() {
		did, err := s.probeOne(ctx, b)
		sent = sent || did
		if first == nil {
			first = err
		}
	}
	return sent, first
}

// probeOne is Probe for b.
func (s *Store) probeOne(ctx context.Context, b *breaker) (bool, error) {
	if b.current() == sluice.BreakerClosed {
		// A closed breaker of a partition no key maps to any more (a
		// master failed over while its keys still answered) is forgotten
		// too, or such breakers would pile up with failovers.
		if b != &s.br {
			if _, ok := s.probeKeyFor(b); !ok {
				s.forget(b)
			}
		}
		return false, nil
	}
	key, ok := s.probeKeyFor(b)
	now := s.clock()
	if !ok {
		why := "no key lives on it any more (its slots moved: a failover or resharding)"
		if b == &s.br {
			why = "the backend now names each key's partition, whose own breaker guards it"
		}
		b.mu.Lock()
		b.probing = false
		b.set(now, sluice.BreakerClosed, why, nil)
		b.mu.Unlock()
		if b != &s.br {
			s.forget(b)
		}
		return false, nil
	}
	call, tn := b.allow(now)
	if !call || !tn.probe {
		return false, nil
	}
	_, _, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) (sluice.Decision, error) {
		return s.backend.Take(ctx, key, probeLimit, 1)
	})
	if err == nil {
		b.success(tn, now)
		return true, nil
	}
	// A probe cut by its caller, or sent on a backend whose client its
	// owner closed, says nothing of the backend's health, as for any call.
	if ferr := s.callerFault(ctx, "probe", err, gate{b, tn}); ferr != nil {
		return true, ferr
	}
	b.failure(tn, now, s.clock(), err)
	return true, err
}

// answered is b.answered, and sends the probes that write which a probe
// that wrote nothing asks for (confirm).
func (s *Store) answered(b *breaker, t turn, sent time.Time, wrote bool) {
	if b.answered(t, sent, wrote) {
		s.confirm(b)
	}
}

// confirm sends b's probes (Probe's, which write) on a goroutine of its
// own, one after another, until b closes, the Store is closed, a probe
// fails or another call holds the probe: a backend that answered a probe without writing closes
// the breaker within a few round trips if it takes writes, and opens it
// again for ProbeInterval if it does not. One runs per breaker at a time.
func (s *Store) confirm(b *breaker) {
	if !b.confirming.CompareAndSwap(false, true) {
		return
	}
	go func() {
		defer b.confirming.Store(false)
		for !s.closed.Load() && b.current() != sluice.BreakerClosed {
			if sent, err := s.probeOne(context.Background(), b); !sent || err != nil {
				return
			}
		}
	}()
}

// ProbeNow is for a backend known to have recovered (a Redis Cluster
// whose replica was promoted: redisstore.Store.OnFailover): each open
// breaker's probe is due at once rather than after ProbeInterval, and
// ProbeNow sends probes as Probe does until every breaker is closed, a
// probe fails (its breaker opens for another ProbeInterval), or none is
// sent (another is in flight: a request's, whose successors go on
// probing). It does nothing when every breaker is closed, and returns the
// error of a failed probe. After Close it does nothing and returns an
// error wrapping sluice.ErrStoreClosed.
func (s *Store) ProbeNow(ctx context.Context) error {
	if s == nil || s.backend == nil {
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("resilient: probe now: %w", sluice.ErrStoreClosed)
	}
	now := s.clock()
	for _, b := range s.breakers() {
		b.due(now)
	}
	for s.State() != sluice.BreakerClosed {
		sent, err := s.Probe(ctx)
		if !sent || err != nil {
			return err
		}
	}
	return nil
}

// gate is a call's pass through one breaker.
type gate struct {
	b *breaker
	t turn
}

// allowAll asks the breaker of each request's partition, once each,
// whether the call may go to the backend: all must let it, else the
// probes already taken are given back and it may not.
func (s *Store) allowAll(reqs []sluice.Request, now time.Time) ([]gate, bool) {
	gs := make([]gate, 0, 1)
next:
	for _, r := range reqs {
		b := s.breakerFor(r.Key)
		for _, g := range gs {
			if g.b == b {
				continue next
			}
		}
		call, tn := b.allow(now)
		if !call {
			for _, g := range gs {
				g.b.release(g.t)
			}
			return []gate{{b: b}}, false
		}
		gs = append(gs, gate{b, tn})
	}
	return gs, true
}

// failedAll charges a failed call sent at sent through gs: to its one
// breaker, or, for a call that spanned partitions, to the partition of the
// key the error names (sluice.KeyFailure), else to those it probed, else
// to those that have not answered a call sent since (one that did is up;
// the call failed for another's sake), giving the others' probes back. It returns the breakers
// charged, or all of gs when none was.
func (s *Store) failedAll(gs []gate, sent, now time.Time, err error) []gate {
	if len(gs) == 1 {
		gs[0].b.failure(gs[0].t, sent, now, err)
		return gs
	}
	var culprit *breaker
	if kf, ok := errors.AsType[sluice.KeyFailure](err); ok && s.parter != nil {
		if m := s.parts.Load(); m != nil {
			culprit = (*m)[s.parter.Partition(kf.FailedKey())]
		}
	}
	if !slices.ContainsFunc(gs, func(g gate) bool { return g.b == culprit }) {
		culprit = nil
	}
	// Unnamed, a failure of a call that probed some of its partitions (the
	// others closed) is theirs: they were open for failing, the others
	// answer their own calls.
	probing := culprit == nil && slices.ContainsFunc(gs, func(g gate) bool { return g.t.probe }) &&
		slices.ContainsFunc(gs, func(g gate) bool { return !g.t.probe })
	var charged []gate
	for _, g := range gs {
		var spared bool
		switch {
		case culprit != nil:
			spared = g.b != culprit
		case probing:
			spared = !g.t.probe
		default:
			spared = g.b.lastGood.Load() >= sent.UnixNano()
		}
		if spared {
			g.b.release(g.t)
			continue
		}
		g.b.failure(g.t, sent, now, err)
		charged = append(charged, g)
	}
	if len(charged) == 0 {
		return gs
	}
	return charged
}
