package server

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/nilclient"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/redisstore"
)

// A fleet is every instance publishing its figures to the same Redis under
// the same prefix. Each instance writes its report (last minute's counts
// per policy, latency counts, top keys) every Interval to a key of its own
// that expires unless renewed, and lists itself in a sorted set scored by
// time, trimmed of stale and surplus members; it then reads the others'
// reports, so the dashboard's figures cost no Redis call. All keys share
// one hash tag, so they live on one Cluster slot.

// FleetOptions configures a Fleet. A nil *FleetOptions is valid.
type FleetOptions struct {
	// Interval is how often the instance publishes its report and reads
	// the others'. Default 2s.
	Interval time.Duration
	// Prefix names the fleet's keys; instances using the same prefix on
	// the same Redis are one fleet. Default "sluice:fleet".
	Prefix string
	// MaxInstances bounds the fleet's listing and what one round reads.
	// Default 256.
	MaxInstances int
	// Logger receives one line per change between publishing and failing
	// to. Default slog.Default().
	Logger *slog.Logger
}

// Fleet publishes this instance's figures to Redis and sums the fleet's.
// Build it with NewFleet; Start and Stop run it in the background, or call
// Publish to run one round. Safe for concurrent use.
type Fleet struct {
	// unusable: built without a client or a service, so it publishes
	// nothing (every method says so instead of dereferencing them).
	unusable error
	client   redis.UniversalClient
	mon      *monitor
	opts     FleetOptions
	ttl      time.Duration
	log      *slog.Logger

	instances    prometheus.GaugeFunc
	failures     prometheus.Counter
	notesDropped prometheus.Counter
	lateCalls    prometheus.Counter

	mu      sync.Mutex // guards others and failing
	others  []instanceReport
	failing bool

	stop chan struct{}
	done chan struct{}
	wg   sync.WaitGroup // the slot notes' relay and listener (fleetslots.go)

	fwdMu sync.Mutex
	fwd   map[string]chan fwdAnswer // calls passed on, by request id (fleetslots.go)
}

// instanceReport is what an instance publishes.
type instanceReport struct {
	Instance string `json:"instance"`
	AtMS     int64  `json:"at_ms"`
	// Bucket is the number (Unix time / StatsBucket) of the last bucket
	// in Policies' counts, so instances' buckets line up.
	Bucket   int64         `json:"bucket"`
	Policies []fleetPolicy `json:"policies"`
	Top      TopLists      `json:"top"`
}

type fleetPolicy struct {
	Policy string `json:"policy"`
	// Allowed and Denied are the overview window's buckets, oldest first.
	Allowed []int64 `json:"allowed"`
	Denied  []int64 `json:"denied"`
	// Local is the overview window's decisions a lease answered, oldest
	// first (absent from an instance that predates it).
	Local []int64 `json:"local,omitempty"`
	// Errors is the overview window's checks the store failed, oldest
	// first (absent from an instance that predates it).
	Errors []int64 `json:"errors,omitempty"`
	// Latency counts decisions per LatencyBoundsMS bucket.
	Latency []int64 `json:"latency"`
	// InFlight and Held: as PolicyFigures'.
	InFlight bool  `json:"in_flight,omitempty"`
	Held     int64 `json:"held,omitempty"`
	// HeldEnds is Held by when it ends (heldSlots.heldEnds), so that
	// readers count each weight no longer than its hold (absent from an
	// instance that predates it: Held counts until the report expires).
	HeldEnds []heldEnd `json:"held_ends,omitempty"`
}

// NewFleet returns svc's Fleet over client. Call it before svc serves:
// from then on svc's figures are the fleet's.
func NewFleet(client redis.UniversalClient, svc *Service, opts *FleetOptions) *Fleet {
	var o FleetOptions
	if opts != nil {
		o = *opts
	}
	o.Interval = cmp.Or(o.Interval, 2*time.Second)
	o.Prefix = cmp.Or(o.Prefix, "sluice:fleet")
	o.MaxInstances = cmp.Or(o.MaxInstances, 256)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case nilclient.Or(client) == nil:
		return &Fleet{unusable: fmt.Errorf("server: fleet figures: %w", redisstore.ErrNoClient), opts: o, log: o.Logger}
	case svc == nil || svc.mon == nil:
		return &Fleet{unusable: fmt.Errorf("server: fleet figures: %w", ErrZeroService), opts: o, log: o.Logger}
	}
	f := &Fleet{
		client: client, mon: svc.mon, opts: o, log: o.Logger,
		// Long enough to survive two missed rounds, short enough that a
		// stopped instance leaves the figures within seconds.
		ttl:      5 * o.Interval,
		failures: newCounter("sluice_fleet_publish_failures_total", "Rounds in which this instance could not publish its figures to Redis or read the fleet's."),
		notesDropped: newCounter("sluice_fleet_slot_notes_dropped_total",
			"Notes of slots released or extended through this instance but acquired through another that were not sent (Redis away, or the queue full): the other instance counts those slots held until their hold timeout."),
		lateCalls: newCounter("sluice_fleet_slot_calls_late_total",
			"Releases and extends of slots this instance's fallback granted, passed on here by another instance after it had stopped waiting (and answered 503): not carried out."),
	}
	f.instances = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_fleet_instances",
		Help: "Instances whose figures the dashboard sums, this one included: those whose reports have not expired."},
		func() float64 { return float64(1 + len(f.fresh())) })
	svc.mon.fleet = f
	svc.notes = make(chan slotNote, noteQueue)
	return f
}

// Collectors returns the fleet's metrics, for a Prometheus registry.
func (f *Fleet) Collectors() []prometheus.Collector {
	if f.unusable != nil {
		return nil
	}
	return []prometheus.Collector{f.instances, f.failures, f.notesDropped, f.lateCalls}
}

func (f *Fleet) setKey() string { return "{" + f.opts.Prefix + "}:instances" }
func (f *Fleet) reportKey(id string) string {
	return "{" + f.opts.Prefix + "}:i:" + id
}

// Start publishes every Interval until Stop, and relays and applies the
// fleet's slot notes.
func (f *Fleet) Start() {
	if f.unusable != nil {
		f.log.Error("fleet figures not published", "err", f.unusable)
		return
	}
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	f.wg.Add(2)
	go f.relay(f.mon.svc.notes, f.stop)
	go f.listen(f.stop)
	go func() {
		defer close(f.done)
		publish := func() {
			ctx, cancel := context.WithTimeout(context.Background(), f.opts.Interval)
			defer cancel()
			_ = f.Publish(ctx)
		}
		publish()
		tick.Every(f.stop, f.opts.Interval, publish)
	}()
}

// Stop ends publishing and withdraws this instance's report, so the fleet's
// figures drop it at once rather than when it expires.
func (f *Fleet) Stop() {
	if f.stop == nil {
		return
	}
	close(f.stop)
	<-f.done
	f.wg.Wait()
	f.stop = nil
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, _ = f.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, f.reportKey(f.mon.instance))
		p.ZRem(ctx, f.setKey(), f.mon.instance)
		return nil
	})
}

// report is this instance's report now.
func (f *Fleet) report() instanceReport {
	stats := f.mon.svc.Stats()
	bucket := stats.now()
	snap := stats.Snapshot()
	o := f.mon.local(snap)
	const n = int(OverviewWindow / StatsBucket)
	now := f.mon.svc.clock()
	ends := f.mon.svc.holds.heldEnds(now)
	r := instanceReport{
		Instance: f.mon.instance, AtMS: now.UnixMilli(), Bucket: bucket,
		Top: f.mon.top.Lists(2 * TopN), // more than shown, so the fleet's merge ranks well
	}
	for i, s := range snap {
		p := fleetPolicy{Policy: s.Policy, Allowed: s.Allowed[len(s.Allowed)-n:], Denied: s.Denied[len(s.Denied)-n:], Local: s.Local[len(s.Local)-n:], Errors: s.Errors[len(s.Errors)-n:]}
		if i < len(o.Policies) && o.Policies[i].Policy == s.Policy {
			p.Latency = o.Policies[i].latency
			p.InFlight = o.Policies[i].InFlight
			if p.InFlight {
				p.HeldEnds = ends[s.Policy]
				p.Held = heldAfter(p.HeldEnds, 0)
			}
		}
		r.Policies = append(r.Policies, p)
	}
	return r
}

// Publish runs one round: write this instance's report, renew its listing,
// drop stale listings and read the other instances' reports.
func (f *Fleet) Publish(ctx context.Context) error {
	if f.unusable != nil {
		return f.unusable
	}
	err := f.publish(ctxutil.OrBackground(ctx))
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil && !f.failing:
		f.log.Warn("fleet figures unavailable: the dashboard shows this instance's until Redis answers", "err", err)
	case err == nil && f.failing:
		f.log.Info("fleet figures available again")
	}
	f.failing = err != nil
	if err != nil {
		f.failures.Inc()
	}
	return err
}

func (f *Fleet) publish(ctx context.Context) error {
	rep := f.report()
	body, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("server: fleet report: %w", err)
	}
	now := rep.AtMS
	var ids *redis.StringSliceCmd
	_, err = f.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, f.reportKey(rep.Instance), body, f.ttl)
		p.ZAdd(ctx, f.setKey(), redis.Z{Score: float64(now), Member: rep.Instance})
		p.ZRemRangeByScore(ctx, f.setKey(), "-inf", "("+strconv.FormatInt(now-f.ttl.Milliseconds(), 10))
		p.ZRemRangeByRank(ctx, f.setKey(), 0, int64(-f.opts.MaxInstances-1))
		p.PExpire(ctx, f.setKey(), f.ttl)
		ids = p.ZRevRange(ctx, f.setKey(), 0, int64(f.opts.MaxInstances-1))
		return nil
	})
	if err != nil {
		return fmt.Errorf("server: fleet publish: %w", err)
	}
	var keys []string
	for _, id := range ids.Val() {
		if id != rep.Instance {
			keys = append(keys, f.reportKey(id))
		}
	}
	var others []instanceReport
	if len(keys) > 0 {
		vals, err := f.client.MGet(ctx, keys...).Result()
		if err != nil {
			return fmt.Errorf("server: fleet read: %w", err)
		}
		for _, v := range vals {
			s, ok := v.(string)
			if !ok { // expired since the listing was read
				continue
			}
			var r instanceReport
			if json.Unmarshal([]byte(s), &r) == nil {
				others = append(others, r)
			}
		}
	}
	f.mu.Lock()
	f.others = others
	f.mu.Unlock()
	return nil
}

// fresh returns the other instances' reports that have not expired.
func (f *Fleet) fresh() []instanceReport {
	now := f.mon.svc.clock().UnixMilli()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []instanceReport
	for _, r := range f.others {
		if now-r.AtMS <= f.ttl.Milliseconds() {
			out = append(out, r)
		}
	}
	return out
}

// overview adds the other instances' counts to own, this instance's.
func (f *Fleet) overview(own Overview) Overview {
	others := f.fresh()
	own.Scope, own.Instances = f.scope(others), 1+len(others)
	at := map[string]int{}
	for i, p := range own.Policies {
		at[p.Policy] = i
	}
	last := f.mon.svc.Stats().now()
	nowMS := f.mon.svc.clock().UnixMilli()
	const n = int64(OverviewWindow / StatsBucket)
	for _, r := range others {
		for _, p := range r.Policies {
			i, ok := at[p.Policy]
			if !ok { // another instance's configuration: shown after this one's
				i = len(own.Policies)
				at[p.Policy] = i
				own.Policies = append(own.Policies, PolicyFigures{Policy: p.Policy, latency: make([]int64, len(LatencyBoundsMS)+1)})
			}
			f := &own.Policies[i]
			first := r.Bucket - int64(len(p.Allowed)) + 1
			for j := range p.Allowed {
				if b := first + int64(j); b > last-n && b <= last && j < len(p.Denied) {
					f.Allowed += p.Allowed[j]
					f.Denied += p.Denied[j]
					if j < len(p.Local) {
						f.Local += p.Local[j]
					}
					if j < len(p.Errors) {
						f.Errors += p.Errors[j]
					}
				}
			}
			f.InFlight = f.InFlight || p.InFlight
			if p.HeldEnds != nil {
				f.Held += heldAfter(p.HeldEnds, nowMS-r.AtMS)
			} else {
				f.Held += p.Held
			}
			for j := range min(len(p.Latency), len(f.latency)) {
				f.latency[j] += p.Latency[j]
			}
		}
	}
	own.finish()
	return own
}

// top merges this instance's lists with the other instances'.
func (f *Fleet) top(own TopLists, n int) (TopLists, string, int) {
	others := f.fresh()
	den, near := [][]TopEntry{own.Denials}, [][]TopEntry{own.NearLimit}
	for _, r := range others {
		den, near = append(den, r.Top.Denials), append(near, r.Top.NearLimit)
	}
	return TopLists{Denials: mergeTop(n, den...), NearLimit: mergeTop(n, near...)}, f.scope(others), 1 + len(others)
}

// scope is "fleet", or "instance" while Redis does not answer this
// instance's rounds and no other's report is left: the figures are then
// this instance's alone, whatever other instances still serve.
func (f *Fleet) scope(others []instanceReport) string {
	f.mu.Lock()
	failing := f.failing
	f.mu.Unlock()
	if failing && len(others) == 0 {
		return "instance"
	}
	return "fleet"
}
