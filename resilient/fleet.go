package resilient

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/tick"
)

// Membership is a shared registry of the processes in a fleet, kept by the
// backend they share (redisstore.Store.Membership is the Redis one).
type Membership interface {
	// Heartbeat registers member as alive until ttl from now, on the
	// registry's own clock, drops members whose time has passed, and
	// returns how many are alive, member included. It must be one atomic
	// step, so that two members joining at once each count the other.
	Heartbeat(ctx context.Context, member string, ttl time.Duration) (alive int, err error)
}

// Roster is a Membership that names the members, so that one that stops
// can withdraw (Leave) and the others drop it from their size at once: a
// member that left is certainly gone, where a silent one may still be
// running and is counted until Shrink has passed (redisstore.Membership is
// one).
type Roster interface {
	Membership
	// Roster is Heartbeat naming the members alive, member included, and
	// those that withdrew within the last ttl they gave.
	Roster(ctx context.Context, member string, ttl time.Duration) (alive, left []string, err error)
	// Leave withdraws member's registration at once, and lists it as
	// withdrawn for ttl.
	Leave(ctx context.Context, member string, ttl time.Duration) error
}

// Fleet discovery defaults; see FleetOptions.
const (
	DefaultFleetRefresh = time.Second
	DefaultFleetTTL     = 3 * time.Second
	DefaultFleetShrink  = 5 * time.Minute
	// DefaultFleetSize is the size assumed by a process that starts while
	// the registry is unreachable and has no FleetOptions.Size. Until the
	// registry answers such a process is not counted (see Fleet.Counted),
	// so its fallback takes no share.
	DefaultFleetSize = 1
)

// FleetOptions configures a Fleet. A nil *FleetOptions gives every default.
type FleetOptions struct {
	// Size, when positive, is the fleet size Size reports, whatever the
	// registry counts: an explicit setting wins. The process still
	// registers, so that processes discovering the size count it.
	// Default: 0, discover.
	Size int

	// Default is the size assumed when the registry cannot be reached at
	// start and Size is not set; a warning says so. Default:
	// DefaultFleetSize (1).
	Default int

	// Member names this process in the registry. Default: the host name,
	// the process id and a random suffix, so that a restarted process is a
	// new member.
	Member string

	// Refresh is how often the process renews its registration and
	// recounts. Default: 1s.
	Refresh time.Duration

	// TTL is how long a registration lasts without renewal. It must exceed
	// Refresh. Default: 3s.
	TTL time.Duration

	// Shrink is how long every count must stay below the current size
	// before the size falls (to the largest of those counts). A size that
	// is too small over-admits under the fallback, so it grows at once and
	// shrinks slowly; a failed heartbeat restarts the wait. It is also how
	// long a process cut off from the registry keeps its share (see
	// Fleet.Counted): every process of a fleet must use the same TTL and
	// Shrink. Default: 5m.
	Shrink time.Duration

	// Timeout bounds each heartbeat. Default: Refresh.
	Timeout time.Duration

	// Logger receives one line per change of size and per loss and return
	// of the registry. Default: slog.Default().
	Logger *slog.Logger

	// OnChange, when set, is called with the new state after each change
	// of Size or Reachable (from the Fleet's own goroutine, never
	// concurrently): the hook for a fleet-size gauge. Default: none.
	OnChange func(FleetEvent)

	// Clock returns the current time, for the shrink wait. Default:
	// time.Now.
	Clock func() time.Time

	// Deferred: NewFleet does not register; Start does. For a process
	// that may still fail to start (a listener's address in use): a
	// registration would make the others count it until Shrink has
	// passed. Default: false, NewFleet starts.
	Deferred bool
}

// FleetEvent is a Fleet's state after a change.
type FleetEvent struct {
	// Size is what Fleet.Size reports: the size the fallback divides by.
	Size int
	// Members is the registry's last count, 0 before the first one.
	Members int
	// Reachable reports whether the last heartbeat succeeded.
	Reachable bool
	// Counted reports Fleet.Counted: whether the fallback may take a share.
	Counted bool
}

// Fleet discovers how many processes share the backend, so that the local
// fallback can give each process its share of a limit (Options.Fleet).
// Every process registers in a Membership, renews every Refresh and
// expires after TTL. The size grows as soon as a count is larger and falls
// only after every count for Shrink was smaller; while the registry is
// unreachable it is kept. Build one with NewFleet and Close it when done.
// Its methods are safe for concurrent use. A zero Fleet, and a nil *Fleet,
// discover nothing: Size reports 0 (a Store reading it divides by 1) and
// Close does nothing.
type Fleet struct {
	reg      Membership
	member   string
	explicit int
	refresh  time.Duration
	ttl      time.Duration
	shrink   time.Duration
	timeout  time.Duration
	log      *slog.Logger
	onChange func(FleetEvent)
	clock    func() time.Time

	size atomic.Int64
	// base is the clock's reading at NewFleet; lastOK is when the last
	// answered heartbeat was sent, as a duration since base (monotonic,
	// with the default clock); answered: one was.
	base     time.Time
	lastOK   atomic.Int64
	answered atomic.Bool

	// Owned by the loop (and NewFleet before it starts).
	beats     int  // heartbeats so far, answered or not
	wasCount  bool // counted after some heartbeat before this one
	members   int
	reachable bool
	counted   bool
	lowSince  time.Time // zero: no count below size since the last change
	lowMax    int       // the largest count since lowSince
	// With a Roster: when each member was last seen alive (those seen
	// within TTL + Shrink), and the members known to have withdrawn.
	seen map[string]time.Time
	gone map[string]time.Time

	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	started sync.Once // Start, or Close before it
	joined  atomic.Bool

	// stopping ends at Close: a heartbeat under way (a registry not
	// answering) is cut, not waited for, so Leave keeps its ctx's bound.
	stopping context.Context
	stopNow  context.CancelFunc
}

// NewFleet registers this process in reg, counts the fleet once (bounded
// by Timeout) and keeps both up to date until Close; with
// FleetOptions.Deferred, Start does that. A registry that cannot be
// reached then is no error: the Fleet starts at Size, or Default with a
// warning, and keeps trying. A registry never built (a nil pointer, a zero
// redisstore.Membership: see sluice.CheckBuilt) is refused with
// ErrInvalidOptions.
func NewFleet(reg Membership, opts *FleetOptions) (*Fleet, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil membership", ErrInvalidOptions)
	}
	if err := sluice.CheckBuilt(reg); err != nil {
		// A zero redisstore.Membership has no client: it could only ever
		// warn that the registry is unreachable.
		return nil, fmt.Errorf("%w: membership: %w", ErrInvalidOptions, err)
	}
	var o FleetOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Size < 0:
		return nil, fmt.Errorf("%w: negative fleet size %d", ErrInvalidOptions, o.Size)
	case o.Default < 0:
		return nil, fmt.Errorf("%w: negative default fleet size %d", ErrInvalidOptions, o.Default)
	case o.Refresh < 0 || o.TTL < 0 || o.Shrink < 0 || o.Timeout < 0:
		return nil, fmt.Errorf("%w: negative fleet interval", ErrInvalidOptions)
	}
	f := &Fleet{
		reg:      reg,
		member:   o.Member,
		explicit: o.Size,
		refresh:  orDefault(o.Refresh, DefaultFleetRefresh),
		ttl:      orDefault(o.TTL, DefaultFleetTTL),
		shrink:   orDefault(o.Shrink, DefaultFleetShrink),
		log:      o.Logger,
		onChange: o.OnChange,
		clock:    o.Clock,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		seen:     map[string]time.Time{},
		gone:     map[string]time.Time{},
	}
	f.timeout = orDefault(o.Timeout, f.refresh)
	f.stopping, f.stopNow = context.WithCancel(context.Background())
	if f.ttl <= f.refresh {
		return nil, fmt.Errorf("%w: fleet TTL %v must exceed refresh %v", ErrInvalidOptions, f.ttl, f.refresh)
	}
	if f.member == "" {
		f.member = memberName()
	}
	if f.log == nil {
		f.log = slog.Default()
	}
	if f.clock == nil {
		f.clock = time.Now
	}
	f.base = f.clock()
	start := f.explicit
	if start == 0 {
		start = orDefault(o.Default, DefaultFleetSize)
	}
	f.size.Store(int64(start))
	if !o.Deferred {
		f.Start()
	}
	return f, nil
}

// Start registers this process and starts the heartbeat, once, for a
// Fleet made with FleetOptions.Deferred (NewFleet starts the others). It
// does nothing after Close.
func (f *Fleet) Start() {
	if f == nil || f.stop == nil {
		return
	}
	f.started.Do(func() {
		f.joined.Store(true)
		if !f.beat(f.clock()) && f.explicit == 0 {
			f.log.Warn("resilient: fleet registry unreachable at start; not counted by the fleet, so FallbackLocal takes no share until the registry answers (FleetOptions.Size takes one without it)",
				"member", f.member, "size", f.Size())
		}
		f.counted = f.Counted()
		go f.loop()
	})
}

// Size returns the fleet size: FleetOptions.Size when set, else the
// discovered size. It is at least 1, but for a zero Fleet.
func (f *Fleet) Size() int {
	if f == nil {
		return 0
	}
	return int(f.size.Load())
}

// Counted reports whether the rest of the fleet counts this process, so
// that its fallback may take a share of a limit: FleetOptions.Size is set,
// or a heartbeat sent less than TTL + Shrink ago was answered. (The others
// count a new registration at their next heartbeat, within Refresh.) The
// others count a process for TTL after its last heartbeat and keep their
// size for Shrink more; past that, a process cut off from
// the registry while they are not is missing from the size they divide
// by, and any share it took would come on top of the fleet's bound. A
// Store's FallbackLocal refuses while it is false (as FailClosed). A zero
// Fleet is always counted.
func (f *Fleet) Counted() bool {
	if f == nil || f.stop == nil || f.explicit > 0 {
		return true
	}
	return f.answered.Load() && f.clock().Sub(f.base)-time.Duration(f.lastOK.Load()) < f.ttl+f.shrink
}

// Member returns this process's name in the registry.
func (f *Fleet) Member() string {
	if f == nil {
		return ""
	}
	return f.member
}

// Close stops the heartbeat. The registration expires after TTL, and the
// others count this process until Shrink after that (it might still be
// running); Size keeps its last value. A process that stops for good
// calls Leave instead.
func (f *Fleet) Close() error {
	if f == nil || f.stop == nil {
		return nil
	}
	f.once.Do(func() { f.stopNow(); close(f.stop) })
	f.started.Do(func() { close(f.done) }) // never started: no loop to end
	<-f.done
	return nil
}

// Leave stops the heartbeat as Close does and, on a Roster, withdraws the
// registration, so that the others drop this process from their size at
// their next heartbeat instead of after TTL + Shrink. Call it once this
// process makes no more decisions: the others' shares grow at once.
func (f *Fleet) Leave(ctx context.Context) error {
	if f == nil || f.stop == nil {
		return nil
	}
	f.Close()
	r, ok := f.reg.(Roster)
	if !ok || !f.joined.Load() {
		return nil
	}
	return r.Leave(ctx, f.member, f.ttl)
}

func (f *Fleet) loop() {
	defer close(f.done)
	tick.Every(f.stop, f.refresh, func() { f.beat(f.clock()) })
}

// beat renews the registration and applies the count at now. It reports
// whether the registry answered.
func (f *Fleet) beat(now time.Time) bool {
	ctx, cancel := context.WithTimeout(f.stopping, f.timeout)
	defer cancel()
	r, ok := f.reg.(Roster)
	if !ok {
		n, err := f.reg.Heartbeat(ctx, f.member, f.ttl)
		if f.stopping.Err() != nil {
			return false // cut by Close: nothing learnt
		}
		f.apply(now, n, err, 0)
		return err == nil
	}
	alive, left, err := r.Roster(ctx, f.member, f.ttl)
	if f.stopping.Err() != nil {
		return false
	}
	f.apply(now, len(alive), err, f.roster(now, alive, left))
	return err == nil
}

// roster records who is alive and who withdrew, and returns how many
// withdrawals are new. A name alive is never gone: a member may leave and
// restart under the same name, and counting it short for even one
// heartbeat would break n ≥ N.
func (f *Fleet) roster(now time.Time, alive, left []string) int {
	live := make(map[string]bool, len(alive))
	for _, m := range alive {
		live[m] = true
		f.seen[m] = now
		delete(f.gone, m)
	}
	n := 0
	for _, m := range left {
		if _, ok := f.gone[m]; !ok && !live[m] && m != f.member {
			f.gone[m] = now
			delete(f.seen, m)
			n++
		}
	}
	// Past TTL + Shrink the fold has forgotten a member too.
	for m, at := range f.seen {
		if now.Sub(at) > f.ttl+f.shrink {
			delete(f.seen, m)
		}
	}
	for m, at := range f.gone {
		if now.Sub(at) > f.ttl+f.shrink {
			delete(f.gone, m)
		}
	}
	return n
}

// apply folds one heartbeat's result into the state, logging and reporting
// what changed.
// withdrawn is how many members the registry newly reports withdrawn.
func (f *Fleet) apply(now time.Time, n int, err error, withdrawn int) {
	old := FleetEvent{Size: f.Size(), Members: f.members, Reachable: f.reachable, Counted: f.counted}
	if err == nil {
		f.lastOK.Store(int64(now.Sub(f.base)))
		f.answered.Store(true)
	}
	if err != nil {
		f.lowSince = time.Time{}
		if f.reachable {
			f.log.Warn("resilient: fleet registry lost; keeping the fleet size", "member", f.member, "size", old.Size, "err", err)
		}
		f.reachable = false
	} else {
		if !f.reachable && f.beats > 0 {
			f.log.Info("resilient: fleet registry back", "member", f.member, "members", n)
		}
		f.reachable = true
		f.members = n
		if f.explicit == 0 {
			f.fold(now, n)
			if withdrawn > 0 {
				f.dropWithdrawn()
			}
		}
	}
	f.beats++
	f.counted = f.Counted()
	cur := FleetEvent{Size: f.Size(), Members: f.members, Reachable: f.reachable, Counted: f.counted}
	if cur.Size != old.Size {
		f.log.Info("resilient: fleet size changed", "member", f.member, "from", old.Size, "to", cur.Size, "members", cur.Members)
	}
	if cur.Counted != old.Counted && f.beats > 1 {
		switch {
		case cur.Counted && f.wasCount:
			f.log.Info("resilient: fleet counts this process again; FallbackLocal takes its share", "member", f.member)
		case cur.Counted: // unreachable since the start: never counted before
			f.log.Info("resilient: fleet counts this process; FallbackLocal takes its share", "member", f.member)
		default:
			f.log.Error("resilient: fleet registry unreachable for longer than the others count this process; FallbackLocal takes no share (refuses) until it answers",
				"member", f.member, "after", f.ttl+f.shrink)
		}
	}
	f.wasCount = f.wasCount || cur.Counted
	if (cur.Size != old.Size || cur.Reachable != old.Reachable || cur.Counted != old.Counted) && f.onChange != nil {
		f.onChange(cur)
	}
}

// fold applies a count: up at once, down only after Shrink of lower counts.
func (f *Fleet) fold(now time.Time, n int) {
	size := f.Size()
	n = max(n, 1)
	switch {
	case n >= size:
		f.lowSince = time.Time{}
		f.size.Store(int64(n))
	case f.lowSince.IsZero():
		f.lowSince, f.lowMax = now, n
	default:
		f.lowMax = max(f.lowMax, n)
		if now.Sub(f.lowSince) >= f.shrink {
			f.size.Store(int64(f.lowMax))
			f.lowSince = time.Time{}
		}
	}
}

// dropWithdrawn lowers the size at once to the members seen alive within
// TTL + Shrink that did not withdraw, when that is smaller: the fold's
// counts included the withdrawn ones, who take no share any more, while a
// silent member stays counted as long as the fold would keep it.
func (f *Fleet) dropWithdrawn() {
	u := max(len(f.seen), 1)
	if u < f.Size() {
		f.size.Store(int64(u))
	}
	f.lowMax = min(f.lowMax, u)
	if f.lowMax >= f.Size() {
		f.lowSince = time.Time{}
	}
}

// memberName is host-pid-random: unique per process start.
func memberName() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	var b [4]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
