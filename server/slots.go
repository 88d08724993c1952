package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/server/config"
)

// In-flight slots through the service: Acquire, Extend and Release by a
// token, so that programs in any language can bound their requests in
// progress. The token is self-describing, so that any instance sharing
// the store can extend or release it, whichever instance acquired it:
//
//	<holder>.<policy>.<key>[.<member>|.-]
//
// holder is the slot's 128-bit random holder id (32 hex digits, the part
// nobody can guess); policy and key travel beside it in unpadded base64url.
// A forged token names a holder nobody holds, so the store frees nothing
// for it. Clients treat the token as opaque.
//
// member, also in base64url, marks a slot the local failure policy granted
// (Redis away, or too slow): it is held in the granting instance's memory,
// named by member, and only there can it be extended or released. Another
// instance passes such a call on to it over the fleet's channel
// (fleetslots.go). A forged member gains nothing: the holder still has to
// be held where the call lands.
//
// A fourth part "-" (never a base64url name: one character encodes no
// byte) marks a slot the open failure policy granted: nothing holds it,
// anywhere, so any instance answers its extend and release at once, as the
// granting instance's store would (held), without asking Redis, which has
// never heard of the holder. Such a token's holder is not the store's but
// one of its own whose last 8 hex digits check the first 24 (openHolder):
// a store holder's token marked "-" fails the check (but once in 2^32)
// and is answered as not held, by every instance, with no state to
// consult. And what an instance counts keeps open grants apart from the
// store's (heldSlots), so that even a token crafted to pass the check
// frees and extends nothing.
//
// A release that frees a slot is remembered for the policy's hold, at
// most rememberRelease, so that releasing the token again answers
// "released before" rather than "unknown": a client retrying a release it
// saw fail is told it succeeded. The store remembers it in the same step as it frees the slot
// (ReleaseOnce: one script on Redis, one lock in the memory store,
// resilient's where the slot is held), so a release whose answer was lost
// is remembered too, and releases racing each other all see the slot
// freed. The record lives with the slot's key (Redis: in its hash slot;
// memory: in its state), bound to the holder and the key, and costs no
// key of its own: one each would fill the memory store's key bound
// (memory.Options.MaxKeys) with releases, not with slots in use.

// SlotResult is the answer to an Acquire.
type SlotResult struct {
	Policy   *config.Policy
	Key      string
	Weight   int64
	Priority sluice.Priority
	// Decision is the store's, reported under the policy's full Max
	// (Limit, Remaining); RetryAfter is an estimate (see
	// sluice.SlotDecision). A failure policy's answer (Source) has Limit
	// the policy's too, but InUse and Remaining its own.
	Decision sluice.SlotDecision
	// Token releases or extends the slot; set when Decision.Allowed.
	Token string
	// Shed reports a denial by priority: the key had room under Max, but
	// not outside the shares reserved for more important requests. The
	// client did nothing wrong (503, not 429).
	Shed bool
}

// slotToken is what a token names.
type slotToken struct {
	holder, policy, key string
	member              string // the instance whose fallback holds it; "" for the store
	open                bool   // granted by the open failure policy: nothing held
}

// openMark is a token's fourth part for a grant of the open failure policy.
const openMark = "-"

// newOpenHolder returns a holder id for an open grant's token: 96 random
// bits, then 32 that check them.
func newOpenHolder() string {
	r := sluice.NewHolderID()[:24]
	return r + openCheck(r)
}

func openCheck(r string) string {
	sum := sha256.Sum256([]byte("sluice open grant\x00" + r))
	return hex.EncodeToString(sum[:4])
}

// isOpenHolder reports whether h is a holder newOpenHolder returned.
func isOpenHolder(h string) bool {
	return len(h) == 32 && openCheck(h[:24]) == h[24:]
}

var b64 = base64.RawURLEncoding

func (t slotToken) String() string {
	s := t.holder + "." + b64.EncodeToString([]byte(t.policy)) + "." + b64.EncodeToString([]byte(t.key))
	switch {
	case t.open:
		s += "." + openMark
	case t.member != "":
		s += "." + b64.EncodeToString([]byte(t.member))
	}
	return s
}

// id is the slot t names, as the store knows it.
func (t slotToken) id() slotID { return slotID{holder: t.holder, policy: t.policy, key: t.key} }

// parseToken reads a token as String writes it.
func parseToken(s string) (slotToken, error) {
	parts := strings.Split(s, ".")
	if (len(parts) != 3 && len(parts) != 4) || len(parts[0]) != 32 || strings.ToLower(parts[0]) != parts[0] {
		return slotToken{}, fmt.Errorf("%w: want the token acquire returned", ErrBadToken)
	}
	if _, err := hex.DecodeString(parts[0]); err != nil {
		return slotToken{}, fmt.Errorf("%w: want the token acquire returned", ErrBadToken)
	}
	policy, err1 := b64.DecodeString(parts[1])
	key, err2 := b64.DecodeString(parts[2])
	// A key Acquire refuses was never issued: not a slot that is not held.
	if err1 != nil || err2 != nil || len(policy) == 0 || sluice.ValidateKey(string(key)) != nil {
		return slotToken{}, fmt.Errorf("%w: want the token acquire returned", ErrBadToken)
	}
	t := slotToken{holder: parts[0], policy: string(policy), key: string(key)}
	if len(parts) == 4 && parts[3] == openMark {
		t.open = true
	} else if len(parts) == 4 {
		member, err := b64.DecodeString(parts[3])
		if err != nil || !isInstanceID(string(member)) {
			return slotToken{}, fmt.Errorf("%w: want the token acquire returned", ErrBadToken)
		}
		t.member = string(member)
	}
	return t, nil
}

// inFlightPolicy returns the named in-flight policy.
func (s *Service) inFlightPolicy(name string) (*config.Policy, error) {
	if s == nil || s.engine == nil {
		return nil, ErrZeroService
	}
	p := s.Config().Policy(name)
	switch {
	case name == "":
		return nil, fmt.Errorf("%w: policy is required", ErrBadRequest)
	case p == nil:
		return nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, name)
	case p.InFlight == nil:
		return nil, fmt.Errorf("%w: policy %q limits a rate, not requests in flight: use /v1/check", ErrBadRequest, name)
	case s.slots == nil:
		return nil, ErrNoSlots
	}
	return p, nil
}

// slotKey returns the store key of key's slots under p. The key is the
// client's, escaped as request text is (enforce.EscapeKey), so that it
// never chooses its Redis Cluster slot with a hash tag.
func (s *Service) slotKey(p *config.Policy, key string) string {
	k, _ := s.keyer.Keys(s.policyBase(p), enforce.EscapeKey(key), false)
	return k
}

// Acquire acquires a slot of weight (1..the policy's Max) for key under
// the named in-flight policy at priority prio. A denial is no error:
// Decision.Allowed false, Shed when the priority's share was full.
func (s *Service) Acquire(ctx context.Context, policy, key string, weight int64, prio sluice.Priority) (SlotResult, error) {
	p, err := s.inFlightPolicy(policy)
	if err != nil {
		return SlotResult{}, err
	}
	f := p.InFlight
	if err := sluice.ValidateKey(key); err != nil {
		return SlotResult{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if prio > sluice.PrioritySheddable {
		return SlotResult{}, fmt.Errorf("%w: %w: %v", ErrBadRequest, sluice.ErrInvalidPriority, prio)
	}
	if weight <= 0 || weight > f.Limit.Max {
		return SlotResult{}, fmt.Errorf("%w: %w: weight %d outside 1..%d", ErrBadRequest, sluice.ErrInvalidWeight, weight, f.Limit.Max)
	}
	if !f.Limit.Admits(prio, f.Reserve, weight) {
		// No wait could admit it: what it needs is reserved above prio.
		return SlotResult{}, fmt.Errorf("%w: %w: weight %d can never be admitted at priority %v: policy %q keeps %d of %d for it (send a weight of at most that, or a higher priority)",
			ErrBadRequest, sluice.ErrInvalidWeight, weight, prio, p.Name, f.Reserve.Threshold(f.Limit.Max, prio), f.Limit.Max)
	}
	res := SlotResult{Policy: p, Key: key, Weight: weight, Priority: prio}
	skey := s.slotKey(p, key)
	// AcquireSlot releases a holder it gives up that the store may hold
	// all the same (an error, a failure policy's denial).
	start := time.Now()
	slot, d, err := sluice.AcquireSlot(ctx, s.slots, skey, f.Limit.For(prio, f.Reserve), weight)
	if d.ReleaseDropped {
		s.abandonDropped(p, prio)
	}
	if err != nil {
		if ended(ctx) == nil { // else its caller went away: no store failure, as the engine's
			s.observeSlot(res, sluice.SlotAcquire, sluice.OutcomeError)
		}
		return SlotResult{}, fmt.Errorf("server: store: %w", err)
	}
	s.mon.recordSlot(p.Name, time.Since(start))
	// Limit is always the policy's (the caller's units). A failure
	// policy's answer keeps its own InUse and Remaining (under the
	// fallback: the weight this instance holds of its share, and what the
	// share has left) and is never a shed: whether the key had room is
	// unknown.
	madeUp := d.Source == sluice.SourceFallback || d.Source == sluice.SourceFailClosed || d.Source == sluice.SourceFailOpen
	if !madeUp {
		d.Remaining = max(f.Limit.Max-d.InUse, 0)
	}
	d.Limit = f.Limit
	res.Decision = d
	switch {
	case d.Allowed:
		t := slotToken{holder: slot.Holder(), policy: p.Name, key: key}
		now := s.clock()
		held := heldSlot{priority: prio, weight: weight, until: now.Add(f.Limit.Hold), since: now}
		switch d.Source {
		case sluice.SourceFallback:
			t.member, held.fallback = s.mon.instance, true
		case sluice.SourceFailOpen:
			t.open, held.open, held.storeHolder = true, true, t.holder
			t.holder = newOpenHolder()
		}
		res.Token = t.String()
		s.holds.add(t.id(), held)
		s.observeSlot(res, sluice.SlotAcquire, sluice.OutcomeAllowed)
	case !madeUp && d.InUse+weight <= f.Limit.Max:
		res.Shed = true
		s.observeSlot(res, sluice.SlotAcquire, sluice.OutcomeShed)
	default:
		s.observeSlot(res, sluice.SlotAcquire, sluice.OutcomeDenied)
	}
	return res, nil
}

// observeSlot reports an in-flight call on res's policy to the statistics
// and metrics, as the middleware reports its own.
func (s *Service) observeSlot(res SlotResult, op sluice.SlotOp, o sluice.Outcome) {
	observer{s}.ObserveSlot(sluice.SlotEvent{Policy: res.Policy.Name, Op: op, Outcome: o, Priority: res.Priority, Weight: res.Weight, Decision: res.Decision})
}

// token parses a token and finds its policy and store keys.
func (s *Service) token(token string) (slotToken, *config.Policy, error) {
	if s == nil || s.engine == nil {
		return slotToken{}, nil, ErrZeroService
	}
	t, err := parseToken(token)
	if err != nil {
		return t, nil, err
	}
	p, err := s.inFlightPolicy(t.policy)
	if errors.Is(err, ErrUnknownPolicy) || errors.Is(err, ErrBadRequest) {
		return t, nil, fmt.Errorf("%w: policy %q is not an in-flight policy (any more)", ErrSlotNotHeld, t.policy)
	}
	return t, p, err
}

// Extend moves a held slot's hold timeout to now plus its policy's hold,
// which it returns. A slot not held is ErrSlotNotHeld.
func (s *Service) Extend(ctx context.Context, token string) (time.Duration, error) {
	t, p, err := s.token(token)
	if err != nil {
		return 0, err
	}
	if t.open {
		return s.extendOpen(t, p)
	}
	if s.elsewhere(t) {
		return s.passOn(ctx, opExtend, t, p)
	}
	return s.extend(ctx, t, p)
}

// extendOpen answers an extend of an open grant: held for another hold,
// as the granting instance's store says of it, since nothing can lose it.
func (s *Service) extendOpen(t slotToken, p *config.Policy) (time.Duration, error) {
	if err := s.openGrant(t, p, sluice.SlotExtend); err != nil {
		return 0, err
	}
	if !s.holds.extend(t.id(), true, s.clock(), p.InFlight.Limit.Hold) {
		s.tellFleet(slotNote{slot: t.id(), hold: p.InFlight.Limit.Hold, open: true})
	}
	s.observeSlot(SlotResult{Policy: p}, sluice.SlotExtend, sluice.OutcomeAllowed)
	return p.InFlight.Limit.Hold, nil
}

// openGrant refuses a token marked open whose holder no open grant has:
// a store holder's token marked "-", which must not pass for a slot that
// holds nothing.
func (s *Service) openGrant(t slotToken, p *config.Policy, op sluice.SlotOp) error {
	if isOpenHolder(t.holder) {
		return nil
	}
	s.observeSlot(SlotResult{Policy: p}, op, sluice.OutcomeDenied)
	return fmt.Errorf("%w: never acquired (a token marked open that the open failure policy did not grant)", ErrSlotNotHeld)
}

// extend is Extend on this instance.
func (s *Service) extend(ctx context.Context, t slotToken, p *config.Policy) (time.Duration, error) {
	skey := s.slotKey(p, t.key)
	res := SlotResult{Policy: p}
	ok, err := s.slots.Extend(ctx, skey, p.InFlight.Limit, t.holder)
	if err != nil {
		if ended(ctx) == nil {
			s.observeSlot(res, sluice.SlotExtend, sluice.OutcomeError)
		}
		return 0, fmt.Errorf("server: store: %w", err)
	}
	if !ok {
		s.notHeld(t)
		s.observeSlot(res, sluice.SlotExtend, sluice.OutcomeDenied)
		return 0, fmt.Errorf("%w: expired at its hold timeout, released, lost by the store (a Redis restart without persistence), or never acquired", ErrSlotNotHeld)
	}
	if !s.holds.extend(t.id(), false, s.clock(), p.InFlight.Limit.Hold) {
		s.tellFleet(slotNote{slot: t.id(), hold: p.InFlight.Limit.Hold})
	}
	s.observeSlot(res, sluice.SlotExtend, sluice.OutcomeAllowed)
	return p.InFlight.Limit.Hold, nil
}

// Release frees a token's slot. It returns nil when the slot was freed,
// now or by an earlier release of the same token; ErrSlotNotHeld, freeing
// nothing, when it expired or was never acquired.
func (s *Service) Release(ctx context.Context, token string) error {
	t, p, err := s.token(token)
	if err != nil {
		return err
	}
	if t.open {
		return s.releaseOpen(t, p)
	}
	if s.elsewhere(t) {
		_, err := s.passOn(ctx, opRelease, t, p)
		return err
	}
	return s.release(ctx, t, p)
}

// releaseOpen answers a release of an open grant: nothing held, nothing
// to free. On the granting instance an acquire that timed out may yet
// have run on Redis: its store frees it there, in the background.
func (s *Service) releaseOpen(t slotToken, p *config.Policy) error {
	if err := s.openGrant(t, p, sluice.SlotRelease); err != nil {
		return err
	}
	held := s.holds.release(t.id(), true)
	if a, ok := s.slots.(interface {
		TryAbandonSlot(key, holder string) error
	}); ok && held.storeHolder != "" {
		// Nothing unless this instance's acquire of it failed.
		if a.TryAbandonSlot(s.slotKey(p, t.key), held.storeHolder) != nil {
			s.abandonDropped(p, held.priority)
		}
	}
	res := SlotResult{Policy: p, Weight: held.weight}
	if res.Weight == 0 {
		s.tellFleet(slotNote{slot: t.id(), open: true})
	}
	s.observeSlot(res, sluice.SlotRelease, sluice.OutcomeAllowed)
	return nil
}

// elsewhere reports whether t's slot is held in another instance's
// fallback, which a fleet can reach.
func (s *Service) elsewhere(t slotToken) bool {
	return t.member != "" && t.member != s.mon.instance && s.mon.fleet != nil
}

// passOn passes an extend or release of t on to the instance whose
// fallback holds the slot (Fleet.forward) and returns its answer. Each
// call is counted once in the fleet: by the instance that carried it out,
// or here, as an error, when none answered (the client's 503).
func (s *Service) passOn(ctx context.Context, op string, t slotToken, p *config.Policy) (time.Duration, error) {
	hold, answered, err := s.mon.fleet.forward(ctx, op, t)
	switch {
	case errors.Is(err, errGrantorStopped):
		return s.grantorStopped(ctx, op, t, p)
	case err != nil && !answered && ended(ctx) == nil:
		sop := sluice.SlotRelease
		if op == opExtend {
			sop = sluice.SlotExtend
		}
		s.observeSlot(SlotResult{Policy: p}, sop, sluice.OutcomeError)
	}
	return hold, err
}

// grantorStopped carries out an extend or release of t, whose granting
// instance has stopped, on the store. Its fallback slot went with it, but
// its acquire on Redis, which timed out, may have run all the same (when
// Redis resumed), under the same holder: only the granting instance would
// have freed that, and so it would hold until its hold timeout. The store
// answers for it, as for a slot Redis granted: released (204) or extended
// (200) when it holds the holder, and not held otherwise.
func (s *Service) grantorStopped(ctx context.Context, op string, t slotToken, p *config.Policy) (time.Duration, error) {
	var hold time.Duration
	var err error
	if op == opExtend {
		hold, err = s.extend(ctx, t, p)
	} else {
		err = s.release(ctx, t, p)
	}
	if errors.Is(err, ErrSlotNotHeld) {
		err = fmt.Errorf("%w: instance %s, whose fallback granted it, has stopped (its fleet report is gone), and the slot with it", ErrSlotNotHeld, t.member)
	}
	return hold, err
}

// rememberRelease bounds how long a release is remembered. Each record
// costs about 140 bytes on Redis, all in one key per slot key, so a hold's
// worth at a high release rate could reach gigabytes; and a release sent
// again comes soon after the first (a client retrying its 503). The record
// decides nothing: acquires and extends never read it, so a release sent
// again after it is gone only answers not held (404) instead of released
// before, as after any hold timeout.
const rememberRelease = 5 * time.Minute

// onceReleaser is a store that remembers a release in the same step as
// it frees the slot: redisstore's, memory's and resilient's ReleaseOnce.
type onceReleaser interface {
	ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error)
}

// release is Release on this instance.
func (s *Service) release(ctx context.Context, t slotToken, p *config.Policy) error {
	skey := s.slotKey(p, t.key)
	var released, before bool
	var err error
	if r, ok := s.slots.(onceReleaser); ok {
		released, before, err = r.ReleaseOnce(ctx, skey, t.holder, min(p.InFlight.Limit.Hold, rememberRelease))
	} else {
		// Another store: nothing remembers the release (NewService).
		released, err = s.slots.Release(ctx, skey, t.holder)
	}
	if err != nil {
		retried := s.retryRelease(t, p, skey, err)
		observer{s}.ObserveSlot(sluice.SlotEvent{Policy: p.Name, Op: sluice.SlotRelease, Outcome: sluice.OutcomeError, NotRetried: !retried})
		return fmt.Errorf("server: store: %w", err)
	}
	return s.released(t, p, released, before)
}

// retryRelease sends a release that failed again in the background
// (sluice.RetryRelease), until the store answers or the slot's hold has
// passed, so that the slot does not stay held, refusing others, until its
// hold timeout when the client does not resend it. Its answer counts as a
// release of its own, unless the client's resend freed the slot first.
// Beyond RetryRelease's bound (sluice.ErrRetriesFull) the slot frees at
// its hold timeout: false, and a line, paced per policy, as the
// middleware's.
func (s *Service) retryRelease(t slotToken, p *config.Policy, skey string, failed error) bool {
	st := &onceSlots{Slots: s.slots, remember: min(p.InFlight.Limit.Hold, rememberRelease)}
	until := s.holdEnd(t, p)
	s.retrying.Store(t.holder, until)
	err := sluice.RetryRelease(st, skey, t.holder, until, func(held bool) {
		s.retrying.Delete(t.holder)
		if !st.before {
			s.released(t, p, held, false)
			return
		}
		// Freed by an earlier release: the one that failed here (Redis ran
		// it, its answer lost), counted now, or the client's resend,
		// counted then (nothing is left here to drop).
		if w := s.releasedBefore(t); w > 0 {
			observer{s}.ObserveSlot(sluice.SlotEvent{Policy: p.Name, Op: sluice.SlotRelease, Outcome: sluice.OutcomeAllowed, Again: true, Weight: w})
		}
	})
	if err == nil {
		return true
	}
	s.retrying.Delete(t.holder)
	s.dropped.Log(p.Name, func(notLogged int64) {
		s.log.Warn(enforce.DroppedReleaseMsg, "policy", p.Name, "dropped", notLogged+1, "max_background", sluice.MaxBackgroundReleases,
			"error", failed.Error(), "held_until", until.UTC().Format(time.RFC3339Nano), "not_retried", err.Error())
	})
	return false
}

// holdEnd returns when the store frees t's slot by itself, on the wall
// clock (RetryRelease's): its hold's end as this instance counts it, when
// it does (acquired or extended here, or extended through another instance
// that said so), else a whole hold from now, the latest any extend can
// have set. A release retried past it frees nothing, and would hold a
// stop (Server.waitReleases) for nothing.
func (s *Service) holdEnd(t slotToken, p *config.Policy) time.Time {
	now := time.Now()
	latest := now.Add(p.InFlight.Limit.Hold)
	if until, ok := s.holds.until(t.id()); ok {
		if end := now.Add(until.Sub(s.clock())); end.Before(latest) {
			return end
		}
	}
	return latest
}

// abandonDropped reports the release of an abandoned acquire (failed, or
// answered by the failure policy, perhaps after running on Redis) that
// was not sent (sluice.ErrRetriesFull): counted as not_retried and logged
// as retryRelease's, since the store may hold the slot to its hold
// timeout.
func (s *Service) abandonDropped(p *config.Policy, prio sluice.Priority) {
	observer{s}.ObserveSlot(sluice.SlotEvent{Policy: p.Name, Op: sluice.SlotRelease, Outcome: sluice.OutcomeError, Priority: prio, NotRetried: true})
	s.dropped.Log(p.Name, func(notLogged int64) {
		s.log.Warn(enforce.DroppedReleaseMsg, "policy", p.Name, "dropped", notLogged+1, "max_background", sluice.MaxBackgroundReleases,
			"abandoned", true, "not_retried", sluice.ErrRetriesFull.Error())
	})
}

// pendingReleases counts this service's releases being sent again in the
// background (retryRelease) whose answer has not come and whose hold has
// not passed (RetryRelease gives up then), and those it finds whose hold
// has passed since it was last called (ended: Redis freed their slots,
// unanswered). sluice.PendingReleases counts the whole process's, another
// service's too.
func (s *Service) pendingReleases() (n, ended int) {
	now := time.Now()
	s.retrying.Range(func(k, v any) bool {
		if now.Before(v.(time.Time)) {
			n++
		} else if _, ok := s.retrying.LoadAndDelete(k); ok {
			ended++
		}
		return true
	})
	return n, ended
}

// onceSlots releases through ReleaseOnce when the store has it, so that a
// release retried in the background is remembered as the client's is.
type onceSlots struct {
	sluice.Slots
	remember time.Duration
	before   bool // the last answer: released by an earlier release
}

func (o *onceSlots) Release(ctx context.Context, key, holder string) (bool, error) {
	r, ok := o.Slots.(onceReleaser)
	if !ok {
		return o.Slots.Release(ctx, key, holder)
	}
	released, before, err := r.ReleaseOnce(ctx, key, holder, o.remember)
	o.before = before
	return released, err
}

// released reports a release the store answered: freed now, freed by an
// earlier release of the token (before), or not held (neither).
func (s *Service) released(t slotToken, p *config.Policy, now, before bool) error {
	switch {
	case before:
		w := s.releasedBefore(t)
		observer{s}.ObserveSlot(sluice.SlotEvent{Policy: p.Name, Op: sluice.SlotRelease, Outcome: sluice.OutcomeAllowed, Again: true, Weight: w})
		return nil
	case now:
		res := SlotResult{Policy: p}
		if res.Weight = s.holds.release(t.id(), false).weight; res.Weight == 0 {
			s.tellFleet(slotNote{slot: t.id()})
		}
		s.observeSlot(res, sluice.SlotRelease, sluice.OutcomeAllowed)
		return nil
	}
	s.notHeld(t)
	s.observeSlot(SlotResult{Policy: p}, sluice.SlotRelease, sluice.OutcomeDenied)
	return fmt.Errorf("%w: expired at its hold timeout, lost by the store (a Redis restart without persistence), or never acquired", ErrSlotNotHeld)
}

// releasedBefore stops counting t's slot, which an earlier release of its
// token freed, and returns the weight counted here: still counted when
// the release that freed it failed here (its answer lost). A slot counted
// elsewhere (acquired through another instance, released through this one
// with its answer lost) is told to the fleet, as a release now is: else
// that instance would count it until its hold timeout. Only a holder the
// store remembers a release of gets here, never a forged token's.
func (s *Service) releasedBefore(t slotToken) int64 {
	w := s.holds.release(t.id(), false).weight
	if w == 0 && t.member == "" { // a fallback slot is counted where its token says
		s.tellFleet(slotNote{slot: t.id()})
	}
	return w
}

// storeLost stops counting the slots that Redis node lost, its keys gone
// by a restart without persistence or a flush (what says which, for the
// log), node by node: those on it (on tells whether a store key is) that
// the store last answered for before before (wall clock). Nothing would
// else drop them before their hold timeout: their holders may never call
// again. It logs them and returns how many.
func (s *Service) storeLost(node, what string, before time.Time, on func(skey string) bool) int64 {
	cfg := s.Config()
	slots, weight := s.holds.lose(s.clock().Add(time.Until(before)), func(id slotID) bool {
		p := cfg.Policy(id.policy)
		return p != nil && p.InFlight != nil && on(s.slotKey(p, id.key))
	})
	if slots > 0 {
		s.log.Warn("Redis "+what+": the in-flight slots acquired here that it held are gone; no longer counted as held",
			"node", node, "slots", slots, "weight", weight)
	}
	return int64(slots)
}

// notHeld stops counting t's slot, which the store found not held
// (expired, or lost by a Redis restart without persistence): at once when
// it was acquired here; else, for a slot Redis granted, the fleet is told
// as of a release elsewhere, so that the instance that acquired it stops
// counting it too. Any token names a holder, so such a note goes only
// while the queue is at most half full: 404s for forged tokens can never
// push out the notes of real releases and extends. A fallback slot's
// token names the instance that holds it: nobody else counts it.
func (s *Service) notHeld(t slotToken) {
	if s.holds.drop(t.id(), false) || t.member != "" {
		return
	}
	if len(s.notes) <= cap(s.notes)/2 {
		s.tellFleet(slotNote{slot: t.id()})
	}
}
