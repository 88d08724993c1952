package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Behind a load balancer a slot's release or extend may reach another
// instance than the one that acquired it, which counts the slot in its held
// figures (heldSlots) until it hears otherwise. So the instance that served
// such a call tells the fleet: it batches the slots (holder, policy and
// key, as a token names them) for up to noteEvery and publishes them on
// the fleet's channel, where every instance listens and applies the notes
// on the slots it counts. Notes are figures,
// never decisions: one lost (Redis away, a listener reconnecting, the queue
// full) leaves the slot counted until its hold timeout, as without them,
// and is counted in sluice_fleet_slot_notes_dropped_total.

const (
	noteEvery = 100 * time.Millisecond // the longest a note waits to be sent
	noteBatch = 512                    // notes in one message at most
	noteQueue = 4096                   // notes waiting at most; more are dropped
)

// slotNote is a slot released (hold 0) or extended (its new hold from now)
// through this instance, which did not acquire it; open for a grant of the
// open failure policy, which applies only to a slot held as one.
type slotNote struct {
	slot slotID
	hold time.Duration
	open bool
}

// noteOpen ends an open grant's note. Instances that predate it refuse
// such lines: their open grants' notes lack it, and so they let them
// expire at their hold rather than take them for a store's slot.
const noteOpen = "o"

// String is the note's line in a message: "r SLOT" or "e SLOT HOLD_µs",
// followed by " o" for an open grant. SLOT is a token's first three
// parts, HOLDER.POLICY.KEY: a note about a holder alone would move the
// figures of its slot for a call that named another key, and freed
// nothing. Instances that predate this sent the holder alone: their
// notes are refused, as ours are by them (they count no such holder), and
// those slots stay counted until their hold timeout, as with a lost note.
func (n slotNote) String() string {
	slot := slotToken{holder: n.slot.holder, policy: n.slot.policy, key: n.slot.key}.String()
	s := "r " + slot
	if n.hold != 0 {
		s = "e " + slot + " " + strconv.FormatInt(n.hold.Microseconds(), 10)
	}
	if n.open {
		s += " " + noteOpen
	}
	return s
}

// parseNote reads a line String wrote.
func parseNote(line string) (slotNote, bool) {
	f := strings.Fields(line)
	var n slotNote
	if len(f) > 2 && f[len(f)-1] == noteOpen {
		f, n.open = f[:len(f)-1], true
	}
	if len(f) < 2 {
		return slotNote{}, false
	}
	t, err := parseToken(f[1])
	if err != nil || t.open || t.member != "" {
		return slotNote{}, false
	}
	n.slot = t.id()
	switch {
	case len(f) == 2 && f[0] == "r":
		return n, true
	case len(f) == 3 && f[0] == "e":
		us, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || us <= 0 {
			return slotNote{}, false
		}
		n.hold = time.Duration(us) * time.Microsecond
		return n, true
	}
	return slotNote{}, false
}

// tellFleet queues n for the fleet, if there is one; a full queue drops it.
func (s *Service) tellFleet(n slotNote) {
	if s.notes == nil {
		return
	}
	select {
	case s.notes <- n:
	default:
		if s.mon.fleet != nil {
			s.mon.fleet.notesDropped.Inc()
		}
	}
}

func (f *Fleet) noteChannel() string { return "{" + f.opts.Prefix + "}:slots" }

// relay sends the service's notes until stop, in batches.
func (f *Fleet) relay(notes <-chan slotNote, stop <-chan struct{}) {
	defer f.wg.Done()
	t := time.NewTicker(noteEvery)
	defer t.Stop()
	var batch []string
	failing := false
	flush := func() {
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := f.client.Publish(ctx, f.noteChannel(), strings.Join(batch, "\n")).Err()
		cancel()
		switch {
		case err != nil:
			f.notesDropped.Add(float64(len(batch)))
			if !failing {
				f.log.Warn("fleet: slot notes not sent: slots released or extended here stay counted where they were acquired until their hold timeout", "error", err)
			}
		case failing:
			f.log.Info("fleet: slot notes sent again")
		}
		failing = err != nil
		batch = batch[:0]
	}
	for {
		select {
		case n := <-notes:
			if batch = append(batch, n.String()); len(batch) == noteBatch {
				flush()
			}
		case <-t.C:
			flush()
		case <-stop:
			flush()
			return
		}
	}
}

// listen applies the fleet's notes to the slots this instance counts until
// stop. go-redis resubscribes after a lost connection.
func (f *Fleet) listen(stop <-chan struct{}) {
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	ps := f.client.Subscribe(ctx, f.noteChannel())
	_, _ = ps.Receive(ctx) // the subscription's confirmation, when Redis answers
	cancel()
	defer ps.Close()
	msgs := ps.Channel()
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return
			}
			f.apply(m.Payload)
		case <-stop:
			return
		}
	}
}

// apply applies one message's notes; slots this instance does not count
// (its own notes among them) are ignored.
func (f *Fleet) apply(msg string) {
	svc := f.mon.svc
	for line := range strings.Lines(msg) {
		if f.passedOn(line) {
			continue
		}
		n, ok := parseNote(line)
		switch {
		case !ok:
		case n.hold == 0:
			svc.holds.drop(n.slot, n.open)
		default:
			svc.holds.extend(n.slot, n.open, svc.clock(), n.hold)
		}
	}
}

// A slot the local failure policy granted is held in the granting
// instance's memory (its token names the instance, slots.go). Another
// instance passes an extend or release of it on over the same channel,
// one message each, and waits for the answer, so that the client is told
// what the granting instance decided wherever its call lands. Instances
// that predate this ignore the lines (parseNote refuses them).
//
//	F <id> <member> <op> <token> <until_ms>   a call passed on to member (base64url)
//	A <id> <outcome> <hold_µs>                its answer: ok, gone (not held) or err
//
// until_ms is the forwarder's wall clock (Unix ms) when it stops waiting
// and answers 503. Redis may hold a message past that (a stalled server
// delivers its queue when it resumes), so the member carries out a call
// only before until_ms less forwardSkew by its own clock: none is carried
// out after its 503, with the hosts' clocks up to forwardSkew (less the
// answer's trip) apart. One carried out before may still end in a 503 (its
// answer lost on the way back), so a 503 leaves the outcome unknown;
// retrying is safe. A line without until_ms comes from an older forwarder
// and is carried out as before.

const (
	opExtend  = "e"
	opRelease = "r"
	// forwardTimeout bounds the wait for the granting instance's answer.
	forwardTimeout = time.Second
	// forwardSkew is the margin for the hosts' clocks and the answer's
	// trip back before the forwarder's wait ends.
	forwardSkew = 250 * time.Millisecond
)

type fwdAnswer struct {
	outcome string
	hold    time.Duration
}

// errGrantorStopped: the instance a call was passed on to has stopped
// (Fleet.gone), and the slot its fallback held with it.
var errGrantorStopped = errors.New("the granting instance has stopped")

// forward passes an extend or release of t, held in another instance's
// fallback, on to that instance and returns its answer. answered reports
// that the instance answered: it carried the call out, and counted it.
func (f *Fleet) forward(ctx context.Context, op string, t slotToken) (hold time.Duration, answered bool, err error) {
	held := fmt.Sprintf("the slot was granted by instance %s while Redis was away and is held there", t.member)
	if f.mon.storeHealth().FallbackActive {
		// No channel to pass it on: the client must reach that instance
		// (or wait for Redis).
		return 0, false, fmt.Errorf("%w: %s; Redis is unreachable, so only that instance can extend or release it: send the call there (route a token's calls to the instance that acquired it), or retry once Redis is back", ErrSlotElsewhere, held)
	}
	var b [16]byte
	rand.Read(b[:])
	id := hex.EncodeToString(b[:])
	ch := make(chan fwdAnswer, 1)
	f.fwdMu.Lock()
	if f.fwd == nil {
		f.fwd = map[string]chan fwdAnswer{}
	}
	f.fwd[id] = ch
	f.fwdMu.Unlock()
	defer func() {
		f.fwdMu.Lock()
		delete(f.fwd, id)
		f.fwdMu.Unlock()
	}()
	until := time.Now().Add(forwardTimeout)
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	msg := strings.Join([]string{"F", id, b64.EncodeToString([]byte(t.member)), op, t.String(), strconv.FormatInt(until.UnixMilli(), 10)}, " ")
	if err := f.client.Publish(ctx, f.noteChannel(), msg).Err(); err != nil {
		// A timeout may come after Redis passed the call on: it may have
		// been carried out.
		return 0, false, fmt.Errorf("%w: %s; passing the call on through Redis failed (%v), so it may or may not have been carried out: retry, or send the call there", ErrSlotElsewhere, held, err)
	}
	select {
	case a := <-ch:
		switch a.outcome {
		case "ok":
			return a.hold, true, nil
		case "gone":
			return 0, true, fmt.Errorf("%w: instance %s, whose fallback granted it, does not hold it (expired at its hold timeout, or released)", ErrSlotNotHeld, t.member)
		}
		return 0, true, fmt.Errorf("%w: %s; that instance could not answer for it: retry", ErrSlotElsewhere, held)
	case <-ctx.Done():
		if f.gone(t.member) {
			return 0, false, errGrantorStopped
		}
		return 0, false, fmt.Errorf("%w: %s; it did not answer within %v (it may have stopped, and the slot with it): retry, or send the call there", ErrSlotElsewhere, held, forwardTimeout)
	}
}

// gone reports whether Redis says that instance member has stopped: every
// running instance renews its fleet report every Interval, and one that
// stops withdraws it (one killed, or cut off from Redis, lets it expire
// after 5 Intervals). Asked only once member failed to answer, so that an
// instance yet to publish its first report is not taken for stopped.
func (f *Fleet) gone(member string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), forwardTimeout/2)
	defer cancel()
	n, err := f.client.Exists(ctx, f.reportKey(member)).Result()
	return err == nil && n == 0
}

// passedOn handles a line of a call passed on (F, when this instance is
// its member) or of an answer (A, when this instance waits for it), and
// reports whether line was one.
func (f *Fleet) passedOn(line string) bool {
	fl := strings.Fields(line)
	switch {
	case (len(fl) == 5 || len(fl) == 6) && fl[0] == "F":
		member, err := b64.DecodeString(fl[2])
		if err != nil || string(member) != f.mon.instance || (fl[3] != opExtend && fl[3] != opRelease) {
			return true
		}
		until := time.Now().Add(forwardTimeout)
		if len(fl) == 6 {
			ms, err := strconv.ParseInt(fl[5], 10, 64)
			if err != nil {
				return true
			}
			until = time.UnixMilli(ms).Add(-forwardSkew)
			if !time.Now().Before(until) {
				f.log.Warn("fleet: an in-flight call passed on here came after its forwarder stopped waiting (answered 503): not carried out", "op", fl[3], "late_by", time.Since(until.Add(forwardSkew)).Round(time.Millisecond))
				f.lateCalls.Inc()
				return true
			}
		}
		f.wg.Add(1)
		go f.answer(fl[1], fl[3], fl[4], until)
		return true
	case len(fl) == 4 && fl[0] == "A":
		us, err := strconv.ParseInt(fl[3], 10, 64)
		if err != nil {
			return true
		}
		f.fwdMu.Lock()
		ch := f.fwd[fl[1]]
		f.fwdMu.Unlock()
		if ch != nil {
			select {
			case ch <- fwdAnswer{outcome: fl[2], hold: time.Duration(us) * time.Microsecond}:
			default:
			}
		}
		return true
	}
	return false
}

// answer runs a call passed on to this instance and publishes its outcome.
func (f *Fleet) answer(id, op, token string, until time.Time) {
	defer f.wg.Done()
	svc := f.mon.svc
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	var hold time.Duration
	t, p, err := svc.token(token)
	if err == nil {
		if op == opExtend {
			hold, err = svc.extend(ctx, t, p)
		} else {
			err = svc.release(ctx, t, p)
		}
	}
	outcome := "ok"
	switch {
	case errors.Is(err, ErrSlotNotHeld), errors.Is(err, ErrBadToken):
		outcome = "gone"
	case err != nil:
		outcome = "err"
	}
	msg := fmt.Sprintf("A %s %s %d", id, outcome, hold.Microseconds())
	if err := f.client.Publish(ctx, f.noteChannel(), msg).Err(); err != nil {
		f.log.Warn("fleet: the answer to an in-flight call passed on here was not sent", "op", op, "error", err)
	}
}
