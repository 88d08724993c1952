package server

import (
	"context"
	"strconv"
	"strings"
	"time"
)

// Behind a load balancer a slot's release or extend may reach another
// instance than the one that acquired it, which counts the slot in its held
// figures (heldSlots) until it hears otherwise. So the instance that served
// such a call tells the fleet: it batches the holder ids for up to
// noteEvery and publishes them on the fleet's channel, where every instance
// listens and applies the notes on the slots it counts. Notes are figures,
// never decisions: one lost (Redis away, a listener reconnecting, the queue
// full) leaves the slot counted until its hold timeout, as without them,
// and is counted in sluice_fleet_slot_notes_dropped_total.

const (
	noteEvery = 100 * time.Millisecond // the longest a note waits to be sent
	noteBatch = 512                    // notes in one message at most
	noteQueue = 4096                   // notes waiting at most; more are dropped
)

// slotNote is a slot released (hold 0) or extended (its new hold from now)
// through this instance, which did not acquire it.
type slotNote struct {
	holder string
	hold   time.Duration
}

// String is the note's line in a message: "r HOLDER" or "e HOLDER HOLD_µs".
func (n slotNote) String() string {
	if n.hold == 0 {
		return "r " + n.holder
	}
	return "e " + n.holder + " " + strconv.FormatInt(n.hold.Microseconds(), 10)
}

// parseNote reads a line String wrote.
func parseNote(line string) (slotNote, bool) {
	f := strings.Fields(line)
	switch {
	case len(f) == 2 && f[0] == "r":
		return slotNote{holder: f[1]}, true
	case len(f) == 3 && f[0] == "e":
		us, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil || us <= 0 {
			return slotNote{}, false
		}
		return slotNote{holder: f[1], hold: time.Duration(us) * time.Microsecond}, true
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

// apply applies one message's notes; holders this instance does not count
// (its own notes among them) are ignored.
func (f *Fleet) apply(msg string) {
	svc := f.mon.svc
	for line := range strings.Lines(msg) {
		n, ok := parseNote(line)
		switch {
		case !ok:
		case n.hold == 0:
			svc.holds.drop(n.holder)
		default:
			svc.holds.extend(n.holder, svc.clock().Add(n.hold))
		}
	}
}
