package server

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/server/config"
)

// The top keys: which clients are denied most, and which keep pressing on
// their limit, from a bounded heavy-hitters sketch (Space-Saving) rather
// than a map that an attacker sending random keys could grow without end.
const (
	// TopN is how many keys each list reports (/v1/top, the dashboard, the
	// metrics).
	TopN = 20
	// TopCounters is the sketch's size: any key with more than 1/TopCounters
	// of a list's weight in a window is sure to be tracked, and a count
	// overstates the truth by at most the reported overcount.
	TopCounters = 128
	// TopWindow is how long a generation of the sketch lasts: lists cover
	// the current generation and the one before, one to two windows.
	TopWindow = time.Minute
	// NearLimitShare: a decision that leaves at most this share of the
	// limit's capacity (or is denied) counts as pressing on the limit.
	NearLimitShare = 0.2
)

// TopEntry is one key in a top list.
type TopEntry struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	// Count is the key's denials (top by denials) or its decisions at or
	// near the limit (top by utilisation) in the window. Example: 42.
	Count int64 `json:"count"`
	// Overcount bounds the sketch's error: the true count is between
	// Count-Overcount and Count. 0 while the key has been tracked since
	// the window began.
	Overcount int64 `json:"overcount"`
	// Utilisation is the largest share of the limit in use the key
	// reached in the window, 0 to 1 (1 when it was denied). Example: 0.95.
	Utilisation float64 `json:"utilisation"`
}

// TopLists are the two lists, largest count first.
type TopLists struct {
	Denials   []TopEntry `json:"denials"`
	NearLimit []TopEntry `json:"near_limit"`
}

type topID struct{ policy, key string }

// sketch is Space-Saving with a fixed number of counters: an untracked key
// takes over the smallest counter and inherits its count as overcount.
type sketch struct {
	gen      int64
	counters map[topID]*TopEntry
}

func newSketch(gen int64) *sketch {
	return &sketch{gen: gen, counters: make(map[topID]*TopEntry, TopCounters)}
}

func (s *sketch) add(id topID, util float64) {
	e := s.counters[id]
	if e == nil {
		if len(s.counters) < TopCounters {
			e = &TopEntry{Policy: id.policy, Key: id.key}
		} else {
			var victim topID
			for k, c := range s.counters { // TopCounters is small: a scan beats a heap's upkeep
				if e == nil || c.Count < e.Count {
					victim, e = k, c
				}
			}
			delete(s.counters, victim)
			*e = TopEntry{Policy: id.policy, Key: id.key, Count: e.Count, Overcount: e.Count}
		}
		s.counters[id] = e
	}
	e.Count++
	e.Utilisation = max(e.Utilisation, util)
}

// topKeys keeps the two sketches over two generations. Safe for concurrent
// use; a decision far from its limit takes no lock.
type topKeys struct {
	mu        sync.Mutex
	cur, prev [2]*sketch // listDenials, listNearLimit
	clock     func() time.Time
}

const (
	listDenials = iota
	listNearLimit
)

func newTopKeys(clock func() time.Time) *topKeys {
	t := &topKeys{clock: clock}
	t.rotate(t.generation())
	return t
}

func (t *topKeys) generation() int64 { return t.clock().UnixNano() / int64(TopWindow) }

// rotate moves to generation g; callers hold mu (or own t).
func (t *topKeys) rotate(g int64) {
	if t.cur[0] != nil && t.cur[0].gen == g {
		return
	}
	if t.cur[0] != nil && t.cur[0].gen == g-1 {
		t.prev = t.cur
	} else {
		t.prev = [2]*sketch{newSketch(g - 1), newSketch(g - 1)}
	}
	t.cur = [2]*sketch{newSketch(g), newSketch(g)}
}

// forget drops the policies' keys from both generations, so that a
// policy a reload removed leaves /v1/top and the top-key metrics at once,
// as its other series do.
func (t *topKeys) forget(policies []string) {
	if len(policies) == 0 {
		return
	}
	gone := make(map[string]bool, len(policies))
	for _, p := range policies {
		gone[p] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range append(t.cur[:], t.prev[:]...) {
		for id := range s.counters {
			if gone[id.policy] {
				delete(s.counters, id)
			}
		}
	}
}

// utilisation is the share of d's limit in use after it: 1 when denied.
func utilisation(d sluice.Decision) float64 {
	c := d.Limit.Capacity()
	if !d.Allowed || c <= 0 {
		return 1
	}
	return float64(c-max(d.Remaining, 0)) / float64(c)
}

// record counts one decision d of key under policy.
func (t *topKeys) record(policy, key string, d sluice.Decision) {
	u := utilisation(d)
	if u < 1-NearLimitShare {
		return
	}
	g := t.generation()
	id := topID{policy, clipTopKey(key)}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rotate(g)
	if !d.Allowed { // shadow denials too
		t.cur[listDenials].add(id, u)
	}
	t.cur[listNearLimit].add(id, u)
}

// MaxTopKey is the longest key the top lists hold whole, in bytes: a
// longer one (a descriptor value can be megabytes) is held, listed and
// published to the fleet as its first MaxTopKey bytes, "…" and the hex
// SHA-256 of the whole key, so that the sketch, /v1/top and the fleet
// reports stay small whatever keys clients send.
const MaxTopKey = 512

func clipTopKey(key string) string {
	if len(key) <= MaxTopKey {
		return key
	}
	cut := MaxTopKey
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	sum := sha256.Sum256([]byte(key))
	return key[:cut] + "…sha256:" + hex.EncodeToString(sum[:])
}

// Lists returns this instance's top keys over the last one to two windows.
func (t *topKeys) Lists(n int) TopLists {
	t.mu.Lock()
	t.rotate(t.generation())
	var all [2][]TopEntry
	for i := range all {
		for _, s := range []*sketch{t.prev[i], t.cur[i]} {
			for _, e := range s.counters {
				all[i] = append(all[i], *e)
			}
		}
	}
	t.mu.Unlock()
	return TopLists{Denials: mergeTop(n, all[listDenials]), NearLimit: mergeTop(n, all[listNearLimit])}
}

// mergeTop sums entries of the same key (two generations, or a fleet's
// instances) and returns the n largest.
func mergeTop(n int, lists ...[]TopEntry) []TopEntry {
	sum := map[topID]*TopEntry{}
	for _, l := range lists {
		for _, e := range l {
			id := topID{e.Policy, e.Key}
			if s := sum[id]; s != nil {
				s.Count += e.Count
				s.Overcount += e.Overcount
				s.Utilisation = max(s.Utilisation, e.Utilisation)
				continue
			}
			c := e
			sum[id] = &c
		}
	}
	out := make([]TopEntry, 0, len(sum))
	for _, e := range sum {
		out = append(out, *e)
	}
	slices.SortFunc(out, func(a, b TopEntry) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(b.Utilisation, a.Utilisation),
			cmp.Compare(a.Policy, b.Policy), cmp.Compare(a.Key, b.Key))
	})
	return out[:min(n, len(out))]
}

// keyLabels turns keys into top-key metric labels. API keys, user ids,
// phone numbers and IPs are easily guessed, so a bare hash of one can be
// reversed from a dictionary: the label is a keyed hash (HMAC-SHA-256),
// which only a holder of the secret can recompute.
type keyLabels struct{ secret []byte }

// newKeyLabels uses secret, or a random one when it is empty: labels then
// agree within this process only.
func newKeyLabels(secret []byte) keyLabels {
	if len(secret) == 0 {
		secret = make([]byte, 32)
		rand.Read(secret) // never fails (crypto/rand)
	}
	return keyLabels{secret: slices.Clone(secret)}
}

// hash is "hmac:" and 12 hex digits of the key's HMAC: short enough for a
// label, long enough that two keys of one top list hardly ever share one.
func (k keyLabels) hash(key string) string {
	m := hmac.New(sha256.New, k.secret)
	m.Write([]byte(key))
	return "hmac:" + hex.EncodeToString(m.Sum(nil)[:6])
}

// MaxExposedKey is the longest key an expose_keys label shows whole, in
// bytes; a longer one shows its first ExposedKeyPrefix bytes (fewer, to
// end on a whole character), "…" and its hash, so that a client sending
// huge keys cannot make every scrape carry them.
const (
	MaxExposedKey    = 128
	ExposedKeyPrefix = 96
)

// label is the key as a metric label shows it: the key itself (clipped)
// only for a policy whose configuration opts in (expose_keys), otherwise
// its hash, so clients' identities stay out of the metrics while a repeat
// offender is still recognisable.
func (k keyLabels) label(p *config.Policy, key string) string {
	if p == nil || !p.ExposeKeys {
		return k.hash(key)
	}
	// A key holding "…" is clipped too, whatever its length, so that only
	// clipped labels contain it and no key can be sent as another key's
	// clipped label (the series would merge). So is one with invalid UTF-8
	// or control characters: the prefix shown stops before them.
	cut, whole := 0, len(key) <= MaxExposedKey
	for i := 0; i < len(key); {
		r, size := utf8.DecodeRuneInString(key[i:])
		if r == '…' || unicode.IsControl(r) || (r == utf8.RuneError && size == 1) {
			whole = false
			break
		}
		i += size
		if i <= ExposedKeyPrefix {
			cut = i
		} else if !whole {
			break
		}
	}
	if whole {
		return key
	}
	return key[:cut] + "…" + k.hash(key)
}

// topCollector exports the current top lists (this instance's): a series
// per listed key, so the metric never holds more than TopN keys per list
// and a key that leaves the list leaves the metric.
type topCollector struct {
	svc       *Service
	denials   *prometheus.Desc
	nearLimit *prometheus.Desc
}

func newTopCollector(svc *Service) *topCollector {
	labels := []string{"policy", "key"}
	return &topCollector{
		svc: svc,
		denials: prometheus.NewDesc("sluice_top_key_denials",
			"Denials of the keys denied most in the last one to two minutes (the top 20 only). The key is a keyed hash (hmac:) unless its policy sets expose_keys.", labels, nil),
		nearLimit: prometheus.NewDesc("sluice_top_key_near_limit",
			"Decisions at or near the limit of the keys that press on their limit most in the last one to two minutes (the top 20 only). The key is a keyed hash (hmac:) unless its policy sets expose_keys.", labels, nil),
	}
}

func (c *topCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.denials
	ch <- c.nearLimit
}

func (c *topCollector) Collect(ch chan<- prometheus.Metric) {
	lists := c.svc.mon.top.Lists(TopN) // this instance's: a fleet sums them in PromQL
	cfg := c.svc.Config()
	emit := func(d *prometheus.Desc, l []TopEntry) {
		// Two keys can share a label (a hash prefix): their counts are
		// summed, one series, so that neither key is hidden.
		var ids []topID
		count := map[topID]float64{}
		for _, e := range l {
			id := topID{e.Policy, c.svc.keyLabels.label(cfg.Policy(e.Policy), e.Key)}
			if _, ok := count[id]; !ok {
				ids = append(ids, id)
			}
			count[id] += float64(e.Count)
		}
		for _, id := range ids {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, count[id], id.policy, id.key)
		}
	}
	emit(c.denials, lists.Denials)
	emit(c.nearLimit, lists.NearLimit)
}
