package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/redis/go-redis/v9"
)

// reloader asks a ClusterClient for a fresh slot map when calls fail with
// connection errors. go-redis reloads it on MOVED and READONLY, which a
// dead master never sends, and every ClusterStateReloadInterval (60 s by
// default): without this, a client keeps dialling a failed-over master
// until then. A nil *reloader does nothing.
//
// From the first failure until the episode ends it reloads every every, on
// a goroutine of its own rather than when calls fail: a caller's circuit
// breaker may keep every call off Redis meanwhile. A reload that finds
// other masters than the one before (a replica promoted) calls onFailover.
type reloader struct {
	cluster *redis.ClusterClient
	every   time.Duration
	quiet   time.Duration // quietAfter when zero (tests shorten it)
	log     *slog.Logger
	count   atomic.Uint64 // reloads asked for
	failing atomic.Bool   // since the first failure after a success
	lastBad atomic.Int64  // UnixNano of the last failure that may mean a node is gone
	polling atomic.Bool   // the reloading goroutine runs
	// inFlight counts reloads running, those abandoned by hedgedReload too.
	inFlight atomic.Int32
	// onFailover is Store.OnFailover's hook.
	onFailover atomic.Pointer[func()]
	// runMu guards runs: per master address, its calls' timeouts since it
	// last answered one (isolated). runCount is len(runs), read without
	// the lock by answered.
	runMu    sync.Mutex
	runs     map[string]timeoutRun
	runCount atomic.Int32
	// lookMu guards masters, the masters the slot map in memory named
	// when last looked at (look), and samples, a key of each.
	lookMu  sync.Mutex
	masters string
	samples []clusterMaster
	// lookDue: a look is scheduled (look), lookEvery after a call.
	lookDue atomic.Bool
	// readSlots, when set, replaces clusterMasters in look (tests).
	readSlots func(context.Context, *redis.ClusterClient, string) ([]clusterMaster, error)
	// firstLoad's mapped: a call or a reload has succeeded, so the client
	// has a slot map and MasterForKey answers from memory (Partition).
	firstLoad
	// quit, closed once the Store is garbage, stops the watch; nil (a
	// reloader of the package-level functions, or a test's) runs none.
	quit chan struct{}
	// watching: the watch runs. Its own allocation, so that the watch
	// holds it without holding the reloader (see watch).
	watching *atomic.Bool
}

// firstLoad is the loading of a client's first slot map (awaitMap).
type firstLoad struct {
	mapped atomic.Bool
	// first is closed when the round loading the map ends; nil while
	// none runs.
	firstMu sync.Mutex
	first   chan struct{}
}

// awaitMap waits until the client has a slot map, or ctx ends. go-redis
// loads a new client's map on the first calls, each asking the nodes one
// at a time in random order: a call that asked a stopped node (SIGSTOP, a
// hung host) first waited out its deadline, or the read timeout (3 s).
// Here one round of hedged reloads, firstReloads of them at once, loads
// it for every caller: with one node of three stopped, all of them ask it
// first one time in 3^8. If the round fails (no node answers in time), the
// callers go on and go-redis loads the map as before; the next call starts
// another round.
func (r *reloader) awaitMap(ctx context.Context) error {
	if r == nil || r.mapped.Load() { // no closure to allocate per call
		return nil
	}
	return r.firstLoad.await(ctx, func() bool {
		_, err := r.hedgedReload(cmp.Or(r.every, DefaultReloadInterval), firstReloads, false)
		if err == nil {
			r.setMapped()
		}
		return err == nil
	})
}

// firstReloads is how many reloads awaitMap's round starts at once.
const firstReloads = 8

// await runs load, once for all callers at a time, until it reports the
// map loaded, and waits for the round, or for ctx's end.
func (f *firstLoad) await(ctx context.Context, load func() bool) error {
	if f.mapped.Load() {
		return nil
	}
	f.firstMu.Lock()
	done := f.first
	if done == nil {
		done = make(chan struct{})
		f.first = done
		go func() {
			if load() {
				f.mapped.Store(true)
			}
			f.firstMu.Lock()
			f.first = nil
			f.firstMu.Unlock()
			close(done)
		}()
	}
	f.firstMu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// clientLoads is the first-map loading of each ClusterClient the
// package-level Check and Masters were given, by a weak pointer, so that
// a client dropped is dropped here too.
var clientLoads sync.Map // weak.Pointer[redis.ClusterClient] → *firstLoad

// awaitClientMap is awaitMap for the package-level functions: a client
// has its first map loaded as a Store's is, once.
func awaitClientMap(ctx context.Context, cc *redis.ClusterClient) error {
	key := weak.Make(cc)
	v, ok := clientLoads.Load(key)
	if !ok {
		var loaded bool
		if v, loaded = clientLoads.LoadOrStore(key, new(firstLoad)); !loaded {
			runtime.AddCleanup(cc, func(k weak.Pointer[redis.ClusterClient]) { clientLoads.Delete(k) }, key)
		}
	}
	return v.(*firstLoad).await(ctx, func() bool {
		_, err := (&reloader{cluster: cc}).hedgedReload(DefaultReloadInterval, firstReloads, false)
		return err == nil
	})
}

// setMapped notes that the client has a slot map, and starts the watch.
func (r *reloader) setMapped() {
	if !r.mapped.Load() && !r.mapped.Swap(true) {
		r.startWatch()
	}
}

// recoveredAfter is how long calls must succeed with no node failing before
// an episode of failures ends. One dead master among healthy ones fails
// some calls while others succeed: ending the episode at the first success
// logged a pair of lines every reload for as long as it stayed dead.
const recoveredAfter = 5 * time.Second

// failed starts an episode of reloads if err, a call's on key, says a
// node may be gone: at once for a refused dial, a lost connection,
// CLUSTERDOWN, MASTERDOWN or MOVED (nodeTrouble), and for a timeout only
// when it is not isolated (see isolated).
func (r *reloader) failed(key string, err error) {
	if r == nil || !nodeTrouble(err) || (timedOut(err) && r.isolated(key, time.Now())) {
		return
	}
	r.lastBad.Store(time.Now().UnixNano())
	if !r.failing.Swap(true) {
		r.log.Warn("redisstore: cluster calls failing; reloading the slot map", "err", err, "reloads", r.count.Load()+1)
	}
	if !r.polling.Swap(true) {
		go r.poll()
	}
}

// A timeout is node trouble only once its master has timed out calls for
// outageSpan with none of its calls answered in between, and no gap of
// more than outageGap between two of its timeouts; before that it is
// isolated. A master that is gone or cut off (a partition, a hung host)
// times out call after call; a busy machine (2 CPUs under load, a GC
// pause) times out a call here and there, or a burst of calls at one
// moment, while the master answers the calls around them. Counted as node
// trouble, each such timeout started an episode or put its end
// (recoveredAfter) 5 s further away: on a loaded 2-CPU host one episode
// lasted over 2 minutes, 352 reloads, while calls succeeded. The figures
// are resilient's breaker's defaults (DeadAfter 500 ms, over at least
// FailureThreshold calls in a row) and server's partialGap: a run of
// timeouts that opens a master's breaker starts the reloads too, and the
// breaker's next probe (a second later) keeps the run going. A timeout's
// master is its key's in the map in memory; with no map yet, every
// timeout counts, as before.
const (
	outageSpan = 500 * time.Millisecond
	outageGap  = recoveredAfter
)

// timeoutRun is a master's timeouts since it last answered a call.
type timeoutRun struct {
	first, last time.Time
}

// isolated records a timeout, at now, of a call on key, and reports
// whether it is isolated: its master has not timed out calls for
// outageSpan, with none answered in between (see outageSpan).
func (r *reloader) isolated(key string, now time.Time) bool {
	addr := r.masterOf(key)
	if addr == "" {
		return false
	}
	r.runMu.Lock()
	defer r.runMu.Unlock()
	if r.runs == nil {
		r.runs = make(map[string]timeoutRun)
	}
	for a, run := range r.runs { // masters that left the map keep no run
		if now.Sub(run.last) > outageGap {
			delete(r.runs, a)
		}
	}
	run, ok := r.runs[addr]
	if !ok {
		run.first = now
	}
	run.last = now
	r.runs[addr] = run
	r.runCount.Store(int32(len(r.runs)))
	return now.Sub(run.first) < outageSpan
}

// answered notes that key's master answered a call: its timeouts so far
// were isolated. No lookup unless some master has timed out.
func (r *reloader) answered(key string) {
	if r == nil || r.runCount.Load() == 0 {
		return
	}
	addr := r.masterOf(key)
	if addr == "" {
		return
	}
	r.runMu.Lock()
	defer r.runMu.Unlock()
	delete(r.runs, addr)
	r.runCount.Store(int32(len(r.runs)))
}

// masterOf returns the address of key's master in the client's slot map
// in memory, or "" with no map yet (no round trip).
func (r *reloader) masterOf(key string) string {
	if !r.mapped.Load() {
		return ""
	}
	node, err := r.cluster.MasterForKey(context.Background(), key)
	if err != nil {
		return ""
	}
	return node.Options().Addr
}

// quietAfter is how long an episode's reloads go on with no call failing:
// a store nobody calls (its client closed, as go-redis's cached slot map
// hides from a reload) must not reload forever. The next failure starts
// them again.
const quietAfter = time.Minute

// poll reloads the slot map every r.every while the episode lasts, and
// tells a change of masters.
func (r *reloader) poll() {
	for {
		if r.pollEpisode() {
			// The client is closed, or no call failed for quietAfter.
			r.polling.Store(false)
			return
		}
		r.polling.Store(false)
		// A failure between the loop's end and here found it polling.
		if !r.failing.Load() || r.polling.Swap(true) {
			return
		}
	}
}

// pollEpisode is poll's loop; it reports whether it stopped with the
// episode still on: the client closed, or quiet for quietAfter.
func (r *reloader) pollEpisode() bool {
	every := cmp.Or(r.every, DefaultReloadInterval)
	quiet := cmp.Or(r.quiet, quietAfter)
	// A round starts every every, or at once after one that took that long.
	tick := time.NewTicker(every)
	defer tick.Stop()
	for r.failing.Load() {
		if time.Now().UnixNano()-r.lastBad.Load() > int64(quiet) {
			return true
		}
		// A reload on a closed client answers from the map it holds.
		if r.clientClosed("") {
			return true
		}
		_, err := r.hedgedReload(every, 1, true)
		if errors.Is(err, redis.ErrClosed) {
			return true
		}
		if err == nil {
			r.setMapped()
			r.look(true)
		}
		<-tick.C
	}
	return false
}

// A reload that asks a hung node (a stopped process, a hung host: its port
// accepts connections, nothing answers) waits out its deadline, or
// go-redis's ReadTimeout (3 s by default) on a client without
// ContextTimeoutEnabled: go-redis asks the nodes for CLUSTER SLOTS one at a
// time, in random order, under one context. So hedgedReload starts another
// reload every hedgeAfter until one returns, at most hedges per round and
// maxReloads at once: one that asks a live node first wins, and since the
// client keeps the map the last successful reload loaded, any reload's
// answer is the client's map at that time.
const (
	hedgeAfter = 50 * time.Millisecond
	hedges     = 4
	maxReloads = 8 * hedges
)

// hedgedReload reloads the slot map as reload does, atOnce reloads at
// first and hedges as above, and returns the first answer, or an error if
// none came within every. Reloads it no longer waits for run on to their
// own end. counted: ClusterReloads counts them.
func (r *reloader) hedgedReload(every time.Duration, atOnce int, counted bool) (string, error) {
	type answer struct {
		masters string
		err     error
	}
	answers := make(chan answer, atOnce+hedges)
	start := func() {
		if r.inFlight.Load() >= maxReloads {
			return
		}
		r.inFlight.Add(1)
		go func() {
			defer r.inFlight.Add(-1)
			ctx, cancel := context.WithTimeout(context.Background(), max(every, time.Second))
			defer cancel()
			masters, err := r.reload(ctx, counted)
			answers <- answer{masters, err}
		}()
	}
	for range atOnce {
		start()
	}
	tick := time.NewTicker(hedgeAfter)
	defer tick.Stop()
	giveUp := time.After(every)
	for started := atOnce; ; {
		select {
		case a := <-answers:
			return a.masters, a.err
		case <-tick.C:
			if started < atOnce+hedges-1 {
				started++
				start()
			}
		case <-giveUp:
			return "", errNoReload
		}
	}
}

// errNoReload: no reload of a round answered in time.
var errNoReload = errors.New("redisstore: no slot-map reload answered")

// reload loads the slot map now and returns its masters' addresses.
func (r *reloader) reload(ctx context.Context, counted bool) (string, error) {
	if counted {
		r.count.Add(1)
	}
	var (
		mu    sync.Mutex
		addrs []string
	)
	// ForEachMaster reloads first, then visits the new map's masters.
	err := r.cluster.ForEachMaster(ctx, func(_ context.Context, node *redis.Client) error {
		mu.Lock()
		addrs = append(addrs, node.Options().Addr)
		mu.Unlock()
		return nil
	})
	slices.Sort(addrs)
	return strings.Join(addrs, ","), err
}

// lookEvery is how long after a call the slot map in memory is looked at
// (look), and so how often while calls go on.
const lookEvery = 100 * time.Millisecond

// look tells a change of the masters of the client's slot map in memory
// (a replica promoted): one line, and OnFailover's hook. A planned
// failover (CLUSTER FAILOVER) fails no call, so no reload episode starts;
// go-redis reloads its map itself on the MOVED a call to the demoted
// master meets, or the watch reloads it, and a look finds it. force (a
// reload, a check) reads every slot's master now. A call
// (!force) only makes sure that a look runs lookEvery later, on a timer,
// at most one pending: the redirected call succeeds before go-redis's
// reload, which it started, lands, so a look right after it found
// nothing, and with one call a second the failover was told a second
// late. That look reads a key of each master it knew (a promotion moves
// every slot of its master), and all 16,384 slots (about a millisecond)
// only when one moved; never on the caller's goroutine.
func (r *reloader) look(force bool) {
	if r == nil || !r.mapped.Load() {
		return
	}
	if !force {
		if !r.lookDue.Load() && !r.lookDue.Swap(true) {
			time.AfterFunc(lookEvery, r.lookLater)
		}
		return
	}
	r.lookMu.Lock()
	defer r.lookMu.Unlock()
	r.readMasters(context.Background())
}

// lookLater is the look a call scheduled.
func (r *reloader) lookLater() {
	// A call from here on schedules another: this look may run before
	// its answer's redirect reloads the map.
	r.lookDue.Store(false)
	ctx := context.Background() // with a map, MasterForKey answers from memory
	r.lookMu.Lock()
	defer r.lookMu.Unlock()
	if r.samples != nil && !r.moved(ctx) {
		return
	}
	r.readMasters(ctx)
}

// readMasters reads the masters of the slot map in memory and tells a
// change. r.lookMu is held.
func (r *reloader) readMasters(ctx context.Context) {
	read := clusterMasters
	if r.readSlots != nil {
		read = r.readSlots
	}
	ms, err := read(ctx, r.cluster, "")
	if err != nil || len(ms) == 0 {
		return
	}
	addrs := make([]string, len(ms))
	for i, m := range ms {
		addrs[i] = m.addr
	}
	slices.Sort(addrs)
	masters := strings.Join(addrs, ",")
	r.samples = ms
	if masters == r.masters {
		return
	}
	changed := r.masters != ""
	if changed && midFailover(r.masters, addrs) {
		// The promoted replica holds some slots, its old master the
		// rest: told once the old master has none.
		return
	}
	r.masters = masters
	if !changed {
		return
	}
	r.log.Info("redisstore: cluster masters changed; a failover completed", "masters", masters)
	if fn := r.onFailover.Load(); fn != nil {
		go (*fn)()
	}
}

// midFailover reports whether addrs (sorted) are the masters last told
// and more: a map read in the middle of a failover, where the old master
// still owns slots beside the replica taking them over.
func midFailover(last string, addrs []string) bool {
	old := strings.Split(last, ",")
	if len(addrs) <= len(old) {
		return false
	}
	for _, a := range old {
		if _, ok := slices.BinarySearch(addrs, a); !ok {
			return false
		}
	}
	return true
}

// moved reports whether a sample key's slot has another master now.
func (r *reloader) moved(ctx context.Context) bool {
	for _, m := range r.samples {
		node, err := r.cluster.MasterForKey(ctx, m.key)
		if err != nil || node.Options().Addr != m.addr {
			return true
		}
	}
	return false
}

// watchEvery is how often a Store on a Cluster client asks a node for
// the slot map (watch), so that a change of masters is told within about
// that time of the promotion with no call at all: a planned failover
// fails no call, and go-redis reloads its map only on a redirect, and on
// a call once the map is ClusterStateReloadInterval old (a minute by
// default).
const watchEvery = time.Second

// watchTries is how many reloads the watch makes for one answer the map
// in memory still differs from: a reload may ask a node that has not heard
// of the change yet, but a difference no reload ends must not reload every
// second.
const watchTries = 3

// startWatch starts the watch, once, on a Store's reloader.
func (r *reloader) startWatch() {
	if r.quit != nil && !r.watching.Swap(true) {
		go watchSlots(weak.Make(r), r.quit, r.watching)
	}
}

// watchState is what the watch keeps between its questions.
type watchState struct {
	next  int    // the sample master asked next
	seen  string // the last answer that differed
	tries int    // reloads for it
	out   sync.Map
}

// watchSlots asks the masters of the map in memory in turn for CLUSTER
// SLOTS, one every watchEvery, and, when a range's master differs from the
// map's, reloads the map and looks at it (look), which tells a change of
// masters. A node that does not answer within watchEvery is left. It
// ends when the Store is garbage (quit) or the client is closed. It holds
// the reloader only while it asks: an OnFailover hook that refers to its
// Store (the reloader holds the hook) must not keep the Store, and the
// watch, alive.
func watchSlots(wr weak.Pointer[reloader], quit chan struct{}, watching *atomic.Bool) {
	defer watching.Store(false)
	tick := time.NewTicker(watchEvery)
	defer tick.Stop()
	// Stores on one client ask their masters in turn, each from its own
	// start, rather than all the first one.
	st := watchState{next: rand.IntN(1 << 16)}
	for {
		select {
		case <-quit:
			return
		case <-tick.C:
		}
		r := wr.Value()
		if r == nil || r.watchOnce(&st) {
			return
		}
	}
}

// watchOnce asks once, and reports whether the watch should end: the
// client is closed.
func (r *reloader) watchOnce(st *watchState) (done bool) {
	samples := r.sampled()
	if len(samples) == 0 { // no look yet: the masters a change is told from
		r.look(true)
		if samples = r.sampled(); len(samples) == 0 {
			return false
		}
	}
	slots, origin, err := r.askSlots(samples[st.next%len(samples)].node, &st.out)
	st.next++
	if errors.Is(err, redis.ErrClosed) && r.closed() {
		return true
	}
	if err != nil {
		// go-redis closes a node's client a minute after the node
		// left the map: look again for the masters to ask.
		if errors.Is(err, redis.ErrClosed) {
			r.look(true)
		}
		return false
	}
	answer, differs := r.differs(slots, origin)
	if !differs {
		st.tries = 0
		return false
	}
	if answer != st.seen {
		st.seen, st.tries = answer, 0
	}
	if st.tries >= watchTries {
		return false
	}
	st.tries++
	_, err = r.hedgedReload(cmp.Or(r.every, DefaultReloadInterval), 1, false)
	if errors.Is(err, redis.ErrClosed) {
		return true
	}
	if err == nil {
		r.look(true)
	}
	return false
}

// clientClosed reports whether the cluster client is closed, with no
// round trip: the PING of the master of key, in the map in memory, is
// sent on a context already ended, so a live node's fails unsent and a
// closed one's with redis.ErrClosed (a closed client has no map to load
// either). go-redis closes a node's client only when it closes, or when a
// reload drops the node from the map, which MasterForKey then no longer
// names.
func (r *reloader) clientClosed(key string) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	node, err := r.cluster.MasterForKey(ctx, key)
	if err == nil {
		err = node.Ping(ctx).Err()
	}
	return errors.Is(err, redis.ErrClosed)
}

// closed reports whether the cluster client is closed: a node's client
// may be, the cluster's live on.
func (r *reloader) closed() bool {
	ctx, cancel := context.WithTimeout(context.Background(), watchEvery)
	defer cancel()
	return errors.Is(r.cluster.Ping(ctx).Err(), redis.ErrClosed)
}

// sampled returns the masters the last look found, a key of each.
func (r *reloader) sampled() []clusterMaster {
	r.lookMu.Lock()
	defer r.lookMu.Unlock()
	return r.samples
}

// askSlots asks node for CLUSTER SLOTS (or the client's ClusterSlots
// option, as its reloads do), within watchEvery, and returns the answer
// and the address its node addresses are relative to. A node whose last
// answer is still out (out holds its address) is not asked again.
func (r *reloader) askSlots(node *redis.Client, out *sync.Map) ([]redis.ClusterSlot, string, error) {
	origin := node.Options().Addr
	ask := func(ctx context.Context) ([]redis.ClusterSlot, error) {
		// CLUSTER SLOTS, as go-redis's reloads ask, and as the ACL
		// docs/deploy.md names allows (CLUSTER SHARDS is another permission).
		cmd := redis.NewClusterSlotsCmd(ctx, "cluster", "slots")
		_ = node.Process(ctx, cmd)
		return cmd.Result()
	}
	if fn := r.cluster.Options().ClusterSlots; fn != nil {
		origin, ask = "", fn
	}
	if _, busy := out.LoadOrStore(origin, true); busy {
		return nil, "", errAskOut
	}
	type answer struct {
		slots []redis.ClusterSlot
		err   error
	}
	answers := make(chan answer, 1)
	ctx, cancel := context.WithTimeout(context.Background(), watchEvery)
	defer cancel()
	go func() {
		defer out.Delete(origin)
		slots, err := ask(ctx)
		answers <- answer{slots, err}
	}()
	select {
	case a := <-answers:
		return a.slots, origin, a.err
	case <-ctx.Done():
		return nil, "", ctx.Err()
	}
}

// errAskOut: the watch's last question to a node is still unanswered.
var errAskOut = errors.New("redisstore: slot map question still out")

// differs reports whether a slot range of slots (a node's CLUSTER SLOTS,
// origin its address) has another master in the client's map in memory,
// with the answer as text.
func (r *reloader) differs(slots []redis.ClusterSlot, origin string) (string, bool) {
	var b strings.Builder
	differs := false
	keys := slotKeys("")
	for _, sl := range slots {
		if len(sl.Nodes) == 0 || sl.Start < 0 || sl.End >= len(keys) || sl.Start > sl.End {
			continue
		}
		addr := clientAddr(sl.Nodes[0].Addr, origin)
		fmt.Fprintf(&b, "%d-%d %s,", sl.Start, sl.End, addr)
		for _, at := range []int{sl.Start, sl.End} {
			node, err := r.cluster.MasterForKey(context.Background(), keys[at])
			if err != nil || node.Options().Addr != addr {
				differs = true
			}
		}
	}
	return b.String(), differs
}

// clientAddr is the address go-redis gives a node that CLUSTER SLOTS,
// answered by origin, names addr (newClusterState): a loopback host
// becomes origin's host unless that is loopback too, and port 0 (a
// TLS-only cluster) origin's port.
func clientAddr(addr, origin string) string {
	originHost, originPort, _ := net.SplitHostPort(origin)
	if !loopbackHost(originHost) {
		if host, port, err := net.SplitHostPort(addr); err == nil {
			if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
				addr = net.JoinHostPort(originHost, port)
			}
		}
	}
	if originPort != "" && originPort != "0" {
		if host, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
			addr = net.JoinHostPort(host, originPort)
		}
	}
	return addr
}

// loopbackHost is go-redis's isLoopback.
func loopbackHost(host string) bool {
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	host = strings.ToLower(host)
	return host == "localhost" || strings.HasSuffix(host, ".docker.internal")
}

// succeeded notes that a call on key succeeded: it ends an episode of
// failures, once no node has failed for recoveredAfter, and looks at the
// slot map.
func (r *reloader) succeeded(key string) {
	if r != nil {
		r.setMapped()
		r.answered(key)
	}
	r.look(false)
	if r != nil && r.failing.Load() && time.Now().UnixNano()-r.lastBad.Load() >= int64(recoveredAfter) && r.failing.Swap(false) {
		r.log.Info("redisstore: cluster calls succeeding again", "reloads", r.count.Load())
	}
}

// OnFailover makes fn be called, on a goroutine of its own, when the
// masters of a Cluster client's slot map change: a replica was promoted,
// and calls may succeed again (a circuit breaker holding calls off Redis
// may probe at once). The Store looks at the map in memory after each
// reload of a failure episode, at each CheckAccess, and 100 ms after a
// call that succeeds (at most every 100 ms while calls go on), so it
// tells a planned failover (which fails no call) about 100 ms after the
// first call the demoted master redirects: go-redis reloads its map on
// that MOVED. Once the client has a map, the Store also asks a master for
// the slot map every second and reloads the client's map when they
// differ, so a failover is told within about a second of the promotion
// with no call at all (a second more for each node asked that does not
// answer); that watch ends when the client is closed or the Store is
// garbage. It replaces any fn set before; nil removes it. On other
// clients it does nothing.
func (s *Store) OnFailover(fn func()) {
	if s == nil || s.reload == nil {
		return
	}
	if fn == nil {
		s.reload.onFailover.Store(nil)
		return
	}
	s.reload.onFailover.Store(&fn)
}

// nodeTrouble reports whether err may come from a node that is gone or
// unreachable: anything but a Redis error reply, a cancellation or the
// Store's own verdicts, and the
// replies of a cluster that lost a master or moved a slot.
func nodeTrouble(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrWaitUnsupported) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return redis.HasErrorPrefix(err, "CLUSTERDOWN") || redis.HasErrorPrefix(err, "MASTERDOWN") ||
			redis.HasErrorPrefix(err, "MOVED") // only runWaited meets it: a stale map
	}
	return true
}

// ClusterReloads returns how many times the Store has asked its
// ClusterClient to reload the slot map after connection errors (see
// Options.ReloadInterval): a counter for a metric. It is 0 on other clients.
func (s *Store) ClusterReloads() uint64 {
	if s == nil || s.reload == nil {
		return 0
	}
	return s.reload.count.Load()
}

// takes reports whether c writes a take (Options.WaitReplicas waits for
// those only: a lost refund or peek cannot admit extra).
func (c *call) takes() bool {
	return c.alg < 0 || c.argv[argMode] == modeTake
}

// runWaited sends c and then WAIT on one connection to its master, since
// WAIT counts the writes of the connection it arrives on.
func (s *Store) runWaited(ctx context.Context, c *call) {
	var conn *redis.Client
	switch client := s.client.(type) {
	case *redis.Client: // a pipeline keeps to one connection
		conn = client
	case *redis.ClusterClient:
		node, err := client.MasterForKey(ctx, c.args[argKey].(string))
		if err != nil {
			c.err = err
			return
		}
		conn = node
	default:
		c.err = ErrWaitUnsupported
		return
	}
	args := c.args
	for {
		pipe := conn.Pipeline()
		cmd := newCmd(ctx, s, args)
		wait := redis.NewIntCmd(ctx, s.wait...)
		_ = pipe.Process(ctx, cmd)
		_ = pipe.Process(ctx, wait)
		_, _ = pipe.Exec(ctx) // each command keeps its own error
		if isNoScript(cmd.Err()) && args[0] == "evalsha" {
			args = evalArgs(c.script, args)
			continue
		}
		c.val, c.err = cmd.Val(), cmd.Err()
		if c.err == nil {
			c.err = s.replicated(wait)
		}
		return
	}
}

// replicated checks WAIT's answer.
func (s *Store) replicated(wait *redis.IntCmd) error {
	n, err := wait.Result()
	want := s.wait[1].(int)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrNotReplicated, err)
	case n < int64(want):
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %d ms", ErrNotReplicated, n, want, s.wait[2])
	}
	return nil
}
