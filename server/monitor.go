package server

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/server/config"
)

// The operator's figures behind /v1/stats' overview, /v1/top and the
// dashboard: decisions and denials over the last minute, per-policy
// decision latency, the top keys, store health and the configuration's
// age. Each instance keeps its own; a fleet's are the sum of what its
// instances publish (fleetstats.go).

// OverviewWindow is the span of the overview's counts: the last 12
// statistics buckets, the current partial one included.
const OverviewWindow = 12 * StatsBucket

// LatencyBoundsMS are the upper bounds, in milliseconds, of the buckets
// that per-policy decision latency is counted in; a percentile is reported
// as the bound of its bucket. The last bucket has no bound.
var LatencyBoundsMS = [...]float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000}

// latencyWindow is a generation of the latency counts; figures cover the
// current generation and the one before.
const latencyWindow = time.Minute

// latencyHist counts one policy's decisions by latency bucket, for the
// current and the previous generation, without a lock: a counter holds its
// generation's number with its count (see counter in stats.go).
type latencyHist [2][len(LatencyBoundsMS) + 1]counter

func (h *latencyHist) add(gen int64, d time.Duration) {
	ms := float64(d) / float64(time.Millisecond)
	i := 0
	for i < len(LatencyBoundsMS) && ms > LatencyBoundsMS[i] {
		i++
	}
	h[gen&1][i].add(gen)
}

// counts sums the current and previous generation.
func (h *latencyHist) counts(gen int64) []int64 {
	out := make([]int64, len(LatencyBoundsMS)+1)
	for i := range out {
		out[i] = h[gen&1][i].get(gen) + h[(gen-1)&1][i].get(gen-1)
	}
	return out
}

// percentileMS is the bound of the bucket holding the q-th quantile of
// counts, or -1 without counts. The last bucket reports twice the last
// bound: more than a second.
func percentileMS(counts []int64, q float64) float64 {
	var total int64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return -1
	}
	rank := int64(q*float64(total-1)) + 1
	for i, c := range counts {
		if rank -= c; rank <= 0 && i < len(LatencyBoundsMS) {
			return LatencyBoundsMS[i]
		}
	}
	return 2 * LatencyBoundsMS[len(LatencyBoundsMS)-1]
}

// StoreHealth is the store as the dashboard shows it.
type StoreHealth struct {
	// Store is "memory" or "redis".
	Store string `json:"store"`
	// Mode is Redis's deployment: "standalone", "sentinel" or "cluster";
	// empty for the memory store.
	Mode string `json:"mode,omitempty"`
	// Breaker is the failure policy's circuit breaker: "closed",
	// "half_open" or "open"; empty without a failure policy.
	Breaker string `json:"breaker,omitempty"`
	// FallbackActive is true while the failure policy decides instead of
	// Redis (the breaker open or half-open, or every Cluster master's).
	FallbackActive bool `json:"fallback_active"`
	// OpenPartitions names the Redis Cluster masters (by address) whose
	// own breakers are open or half-open: the failure policy decides
	// their keys only (every key once all are: FallbackActive).
	OpenPartitions []string `json:"open_partitions,omitempty"`
}

// PolicyFigures is one policy's overview line.
type PolicyFigures struct {
	Policy  string `json:"policy"`
	Allowed int64  `json:"allowed"`
	// Denied counts shadow denials too.
	Denied int64 `json:"denied"`
	// Local counts the decisions of Allowed and Denied that a lease
	// answered in memory, without the store.
	Local int64 `json:"local"`
	// Errors counts the checks (or acquires) the store failed, apart from
	// Allowed and Denied: outcome="error" in the metrics, a shadow
	// policy's included though its requests were let through.
	Errors int64 `json:"errors"`
	// LatencyP50MS and LatencyP99MS are the decision latency percentiles
	// over the last one to two minutes, as the upper bound of their
	// bucket in LatencyBoundsMS; -1 when there were no decisions.
	LatencyP50MS float64 `json:"latency_p50_ms"`
	LatencyP99MS float64 `json:"latency_p99_ms"`
	// InFlight marks an in-flight policy, whose Allowed and Denied count
	// acquires; Held is the weight its slots hold now, acquired through
	// the instances counted (see heldSlots).
	InFlight bool  `json:"in_flight,omitempty"`
	Held     int64 `json:"held,omitempty"`
	// latency is the bucket counts the percentiles come from, kept to sum
	// a fleet's.
	latency []int64
}

// Overview is decisions and denials over the last minute, for this
// instance or for a fleet.
type Overview struct {
	// Scope is "instance" when the figures are this instance's, "fleet"
	// when they sum every instance publishing to the same Redis.
	Scope string `json:"scope"`
	// Instances is how many instances the figures sum (1 for "instance").
	Instances int   `json:"instances"`
	WindowMS  int64 `json:"window_ms"`
	Allowed   int64 `json:"allowed"`
	Denied    int64 `json:"denied"`
	// Local counts the decisions that leases answered in memory.
	Local int64 `json:"local"`
	// Errors counts the checks the store failed (PolicyFigures.Errors).
	Errors int64 `json:"errors"`
	// DecisionsPerSecond is (Allowed+Denied) / the window.
	DecisionsPerSecond float64 `json:"decisions_per_second"`
	// DeniedRatio is Denied / (Allowed+Denied), 0 without decisions.
	DeniedRatio float64 `json:"denied_ratio"`
	// ErrorRatio is Errors / (Allowed+Denied+Errors): the share of checks
	// the store failed, 0 without checks.
	ErrorRatio float64         `json:"error_ratio"`
	Policies   []PolicyFigures `json:"policies"`
}

// monitor keeps one instance's operator figures.
type monitor struct {
	svc      *Service
	instance string
	top      *topKeys
	latency  atomic.Pointer[map[string]*latencyHist]
	mu       sync.Mutex // guards loadedAt and health
	loadedAt time.Time
	health   func() StoreHealth
	fleet    *Fleet
}

func newMonitor(svc *Service) *monitor {
	m := &monitor{svc: svc, instance: instanceID(), top: newTopKeys(svc.clock)}
	m.latency.Store(&map[string]*latencyHist{})
	return m
}

// instanceID names this process among a fleet's: host, process id and a
// random suffix (two services in one process stay apart).
func instanceID() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	var b [3]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// isInstanceID reports whether id has instanceID's form: a host of UTF-8
// text without control characters, a process id and 6 lower-case hex
// digits. A token naming anything else was never issued.
func isInstanceID(id string) bool {
	rest, suffix, ok := cutLast(id)
	if !ok || len(suffix) != 6 || strings.ToLower(suffix) != suffix {
		return false
	}
	if _, err := hex.DecodeString(suffix); err != nil {
		return false
	}
	host, pid, ok := cutLast(rest)
	if !ok || host == "" || !utf8.ValidString(host) || strings.ContainsFunc(host, unicode.IsControl) {
		return false
	}
	_, err := strconv.ParseUint(pid, 10, 63)
	return err == nil
}

// cutLast splits s around its last ':'.
func cutLast(s string) (before, after string, found bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// setPolicies keeps the latency of policies that survive a reload and
// notes when the configuration was loaded.
func (m *monitor) setPolicies(ps []*config.Policy) {
	old := *m.latency.Load()
	next := make(map[string]*latencyHist, len(ps))
	for _, p := range ps {
		if next[p.Name] = old[p.Name]; next[p.Name] == nil {
			next[p.Name] = new(latencyHist)
		}
	}
	m.latency.Store(&next)
	m.mu.Lock()
	m.loadedAt = m.svc.clock()
	m.mu.Unlock()
}

func (m *monitor) latencyGen() int64 { return m.svc.clock().UnixNano() / int64(latencyWindow) }

// record notes the engine's decisions of checks, which took lat together;
// keys are the checks' client keys. Looks and made-up checks (an Envoy
// descriptor blocked by requests_per_unit: 0) are not decisions of a key.
func (m *monitor) record(checks []enforce.Check, keys []string, lat time.Duration) {
	gen := m.latencyGen()
	hists := *m.latency.Load()
	for i := range checks {
		c := &checks[i]
		if c.Cost == 0 || c.Over || i >= len(keys) {
			continue
		}
		if h := hists[c.Rule.Name]; h != nil {
			h.add(gen, lat)
		}
		m.top.record(c.Rule.Name, keys[i], c.Decision)
	}
}

// recordSlot notes the latency of an in-flight policy's acquire that the
// store (or its failure policy) answered.
func (m *monitor) recordSlot(policy string, lat time.Duration) {
	if h := (*m.latency.Load())[policy]; h != nil {
		h.add(m.latencyGen(), lat)
	}
}

func (m *monitor) configLoadedAt() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loadedAt
}

func (m *monitor) setHealth(f func() StoreHealth) {
	m.mu.Lock()
	m.health = f
	m.mu.Unlock()
}

func (m *monitor) storeHealth() StoreHealth {
	m.mu.Lock()
	f := m.health
	m.mu.Unlock()
	if f == nil {
		return StoreHealth{Store: "memory"}
	}
	return f()
}

// breakerHealth reads the breaker of a failure-policy store, if store has
// one: its own (Breaker, FallbackActive), and its Cluster masters' apart.
func breakerHealth(h StoreHealth, store sluice.Store) StoreHealth {
	if b, ok := store.(interface {
		Breakers() []resilient.BreakerStatus
	}); ok {
		for _, p := range b.Breakers() {
			switch {
			case p.Partition == "":
				h.Breaker, h.FallbackActive = p.State.String(), p.State != sluice.BreakerClosed
			case p.State != sluice.BreakerClosed:
				h.OpenPartitions = append(h.OpenPartitions, p.Partition)
			}
		}
		return h
	}
	if b, ok := store.(interface{ State() sluice.BreakerState }); ok {
		st := b.State()
		h.Breaker, h.FallbackActive = st.String(), st != sluice.BreakerClosed
	}
	return h
}

// local returns this instance's overview. series is a Stats snapshot.
func (m *monitor) local(series []Series) Overview {
	gen := m.latencyGen()
	hists := *m.latency.Load()
	o := Overview{Scope: "instance", Instances: 1, WindowMS: OverviewWindow.Milliseconds(), Policies: []PolicyFigures{}}
	const n = int(OverviewWindow / StatsBucket)
	cfg := m.svc.Config()
	held := m.svc.holds.held()
	for _, s := range series {
		f := PolicyFigures{Policy: s.Policy}
		if p := cfg.Policy(s.Policy); p != nil && p.InFlight != nil {
			f.InFlight, f.Held = true, held[s.Policy]
		}
		for i := len(s.Allowed) - n; i < len(s.Allowed); i++ {
			f.Allowed += s.Allowed[i]
			f.Denied += s.Denied[i]
			f.Local += s.Local[i]
			f.Errors += s.Errors[i]
		}
		if h := hists[s.Policy]; h != nil {
			f.latency = h.counts(gen)
		} else {
			f.latency = make([]int64, len(LatencyBoundsMS)+1)
		}
		o.Policies = append(o.Policies, f)
	}
	o.finish()
	return o
}

// finish derives the totals, rates and percentiles from the policies' counts.
func (o *Overview) finish() {
	o.Allowed, o.Denied, o.Local, o.Errors = 0, 0, 0, 0
	for i := range o.Policies {
		f := &o.Policies[i]
		o.Allowed += f.Allowed
		o.Denied += f.Denied
		o.Local += f.Local
		o.Errors += f.Errors
		f.LatencyP50MS, f.LatencyP99MS = percentileMS(f.latency, 0.5), percentileMS(f.latency, 0.99)
	}
	if total := o.Allowed + o.Denied; total > 0 {
		o.DecisionsPerSecond = float64(total) / (float64(o.WindowMS) / 1000)
		o.DeniedRatio = float64(o.Denied) / float64(total)
	}
	if checks := o.Allowed + o.Denied + o.Errors; checks > 0 {
		o.ErrorRatio = float64(o.Errors) / float64(checks)
	}
}

// overview is the fleet's when there is one, else this instance's.
func (m *monitor) overview(series []Series) Overview {
	o := m.local(series)
	if m.fleet != nil {
		return m.fleet.overview(o)
	}
	return o
}

// topLists is the fleet's top keys when there is a fleet, else this
// instance's, with the overview's scope and instance count.
func (m *monitor) topLists(n int) (TopLists, string, int) {
	l := m.top.Lists(TopCounters)
	if m.fleet != nil {
		return m.fleet.top(l, n)
	}
	return TopLists{Denials: l.Denials[:min(n, len(l.Denials))], NearLimit: l.NearLimit[:min(n, len(l.NearLimit))]}, "instance", 1
}

// addStats adds the operator's figures to a /v1/stats body: this
// instance's name, store health and configuration age, and the overview
// (the fleet's when there is one).
func (m *monitor) addStats(body map[string]any, series []Series) {
	body["instance"] = m.instance
	body["config_loaded_at"] = m.configLoadedAt().UTC().Format(time.RFC3339Nano)
	body["store"] = m.storeHealth()
	body["overview"] = m.overview(series)
}

// topResponse is the body of GET /v1/top.
type topResponse struct {
	Scope     string `json:"scope"`
	Instances int    `json:"instances"`
	// WindowMS is a generation's length: the lists cover one to two.
	WindowMS int64 `json:"window_ms"`
	TopLists
}

// top serves GET /v1/top, admin only: the keys are API keys, user ids and
// IPs as clients sent them.
func (a *api) top(w http.ResponseWriter, r *http.Request) {
	if !a.admin(w, r) {
		return
	}
	lists, scope, n := a.svc.mon.topLists(TopN)
	writeJSON(w, http.StatusOK, topResponse{Scope: scope, Instances: n, WindowMS: TopWindow.Milliseconds(), TopLists: lists})
}

// watchFleet hooks the operator's figures into the server: store health,
// the top-keys metrics and, on Redis, the fleet.
func (s *Server) watchFleet(store sluice.Store) {
	h := StoreHealth{Store: "memory"}
	if s.redis != nil {
		h = StoreHealth{Store: "redis", Mode: redisMode(s.redis)}
	}
	s.svc.mon.setHealth(func() StoreHealth {
		sh := breakerHealth(h, store)
		sh.FallbackActive = sh.FallbackActive || s.health.Status().FallbackActive
		return sh
	})
	s.metrics.Registry().MustRegister(newTopCollector(s.svc))
	if s.redis != nil {
		s.fleet = NewFleet(s.redis, s.svc, &FleetOptions{Logger: s.log})
		s.metrics.Registry().MustRegister(s.fleet.Collectors()...)
	}
}

// redisMode names a client's deployment. go-redis builds a Sentinel client
// as a plain client whose address is "FailoverClient".
func redisMode(c redis.UniversalClient) string {
	switch c := c.(type) {
	case *redis.ClusterClient:
		return "cluster"
	case *redis.Client:
		if c.Options().Addr == "FailoverClient" {
			return "sentinel"
		}
	}
	return "standalone"
}
