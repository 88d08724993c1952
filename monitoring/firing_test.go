package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/model/value"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server"
)

// The alerts are evaluated here by Prometheus's rule engine against what
// a real sluice serve exposes, scraped before and after an event: each
// alert on a count (increase() > 0) must fire on the first such event of
// the process's life. A counter series born at 1 at its first event shows
// increase() nothing, so those alerts stayed silent until the second.

// firingConfig has a rate policy and an in-flight one.
const firingConfig = `
policies:
  - name: api
    key: "{user}"
    limit: 100/min
  - name: exports
    key: "{user}"
    in_flight:
      max: 10
      hold: 10s
`

// scrapeStep is the scrape (and rule evaluation) interval the scrapes
// are fed at; each scrape stands for scrapeRuns scrapes in a row, long
// enough for every alert's for: and increase() range.
const (
	scrapeStep = time.Minute
	scrapeRuns = 16
)

// sample is one series of a scrape.
type sample struct {
	lbls labels.Labels
	v    float64
}

// scrape reads the metrics endpoint of a serve at addr as Prometheus
// would: every series with job and instance labels, and "up".
func scrape(t *testing.T, addr string) []sample {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("/metrics: %d %s", resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := []sample{{labels.FromStrings("__name__", "up", "job", "sluice", "instance", addr), 1}}
	add := func(name string, m *dto.Metric, v float64, extra ...string) {
		b := labels.NewScratchBuilder(len(m.GetLabel()) + 4)
		b.Add("__name__", name)
		b.Add("job", "sluice")
		b.Add("instance", addr)
		for _, l := range m.GetLabel() {
			b.Add(l.GetName(), l.GetValue())
		}
		for i := 0; i+1 < len(extra); i += 2 {
			b.Add(extra[i], extra[i+1])
		}
		b.Sort()
		out = append(out, sample{b.Labels(), v})
	}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				add(name, m, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(name, m, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(name, m, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, b := range h.GetBucket() {
					add(name+"_bucket", m, float64(b.GetCumulativeCount()), "le", formatLe(b.GetUpperBound()))
				}
				add(name+"_bucket", m, float64(h.GetSampleCount()), "le", "+Inf")
				add(name+"_sum", m, h.GetSampleSum())
				add(name+"_count", m, float64(h.GetSampleCount()))
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				for _, q := range s.GetQuantile() {
					add(name, m, q.GetValue(), "quantile", formatLe(q.GetQuantile()))
				}
				add(name+"_sum", m, s.GetSampleSum())
				add(name+"_count", m, float64(s.GetSampleCount()))
			}
		}
	}
	return out
}

func formatLe(f float64) string {
	if math.IsInf(f, 1) {
		return "+Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// alertRule is one alert of alerts.yaml, with what its expression counts.
type alertRule struct {
	name     string
	rule     rulefmt.Rule
	counts   bool // its expression takes increase() of a counter
	selector []*parser.VectorSelector
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	var out []alertRule
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			a := alertRule{name: r.Alert, rule: r}
			e, err := parser.NewParser(parser.Options{}).ParseExpr(r.Expr)
			if err != nil {
				t.Fatal(err)
			}
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				if c, ok := n.(*parser.Call); ok && c.Func.Name == "increase" {
					a.counts = true
					parser.Inspect(c, func(n parser.Node, _ []parser.Node) error {
						if vs, ok := n.(*parser.VectorSelector); ok {
							a.selector = append(a.selector, vs)
						}
						return nil
					})
				}
				return nil
			})
			out = append(out, a)
		}
	}
	return out
}

// firing evaluates every alert with Prometheus's PromQL engine at each
// scrapeStep, over each of scrapes repeated scrapeRuns times in turn (a
// scrape before an event, any made during it, the one after), and holds
// each result for the alert's for: as Prometheus's rule manager does; it
// returns the alerts that reached firing, and of those the ones that fired
// before the last scrape's turn, and fails t on an evaluation error.
func firing(t *testing.T, alerts []alertRule, scrapes ...[]sample) (fired, firedBefore []string) {
	t.Helper()
	last := (len(scrapes) - 1) * scrapeRuns
	first := map[string]int{}
	for _, f := range firings(t, alerts, scrapeRuns, scrapes...) {
		if i, ok := first[f.alert]; !ok || f.at < i {
			first[f.alert] = f.at
		}
	}
	for _, a := range alerts {
		if i, ok := first[a.name]; ok {
			if i < last {
				firedBefore = append(firedBefore, a.name)
			}
			fired = append(fired, a.name)
		}
	}
	return fired, firedBefore
}

// fired is an alert's result (its labels) that reached firing, at the
// evaluation at: the scrapeStep since the first scrape's turn.
type fired struct {
	alert  string
	labels labels.Labels
	at     int
}

// firings evaluates every alert with Prometheus's PromQL engine at each
// scrapeStep, over each of scrapes repeated runs times in turn, and holds
// each result for the alert's for: as Prometheus's rule manager does; it
// returns each result that reached firing, at its first evaluation
// firing, and fails t on an evaluation error. (Prometheus's rules package
// would bring its notifier's cloud SDKs into this module: the hold is
// done here.)
func firings(t *testing.T, alerts []alertRule, runs int, scrapes ...[]sample) []fired {
	t.Helper()
	t0 := time.Unix(1_700_000_000, 0)
	at := func(i int) int64 { return t0.Add(time.Duration(i) * scrapeStep).UnixMilli() }
	points := map[string][]chunks.Sample{}
	series := map[string]labels.Labels{}
	total := len(scrapes) * runs
	for i := range total {
		scr := scrapes[i/runs]
		// A series this scrape lacks ends at its turn's start, as
		// Prometheus marks it.
		if i > 0 && i%runs == 0 {
			in := map[string]bool{}
			for _, s := range scr {
				in[s.lbls.String()] = true
			}
			for k, ps := range points {
				if n := len(ps); !in[k] && !value.IsStaleNaN(ps[n-1].F()) {
					points[k] = append(ps, point{at(i), math.Float64frombits(value.StaleNaN)})
				}
			}
		}
		for _, s := range scr {
			k := s.lbls.String()
			series[k] = s.lbls
			points[k] = append(points[k], point{at(i), s.v})
		}
	}
	var all []storage.Series
	for k, l := range series {
		all = append(all, storage.NewListSeries(l, points[k]))
	}
	slices.SortFunc(all, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
	st := storage.QueryableFunc(func(int64, int64) (storage.Querier, error) { return querier(all), nil })
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1e6, Timeout: 10 * time.Second, LookbackDelta: 5 * time.Minute})
	ctx := context.Background()
	var out []fired
alerts:
	for _, a := range alerts {
		active := map[string]int64{} // each result's first evaluation in a row
		done := map[string]bool{}
		for i := range total {
			q, err := engine.NewInstantQuery(ctx, st, nil, a.rule.Expr, time.UnixMilli(at(i)))
			if err != nil {
				t.Fatalf("%s: %v", a.name, err)
			}
			res := q.Exec(ctx)
			q.Close()
			vec, err := res.Vector()
			if err != nil {
				t.Errorf("%s: %v", a.name, err)
				continue alerts
			}
			now := map[string]int64{}
			for _, s := range vec {
				k := s.Metric.String()
				since, ok := active[k]
				if !ok {
					since = at(i)
				}
				now[k] = since
				if !done[k] && at(i)-since >= time.Duration(a.rule.For).Milliseconds() {
					done[k] = true
					out = append(out, fired{a.name, s.Metric, i})
				}
			}
			active = now
		}
	}
	return out
}

// point is one sample of a series.
type point struct {
	t int64
	v float64
}

func (p point) T() int64                      { return p.t }
func (p point) ST() int64                     { return 0 }
func (p point) F() float64                    { return p.v }
func (p point) H() *histogram.Histogram       { return nil }
func (p point) FH() *histogram.FloatHistogram { return nil }
func (p point) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (p point) Copy() chunks.Sample           { return p }

// querier answers from series held in memory, sorted by labels.
type querier []storage.Series

func (q querier) Select(_ context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	var out seriesSet
	for _, s := range q {
		if slices.IndexFunc(ms, func(m *labels.Matcher) bool { return !m.Matches(s.Labels().Get(m.Name)) }) < 0 {
			out.s = append(out.s, s)
		}
	}
	return &out
}

func (querier) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (querier) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (querier) Close() error { return nil }

type seriesSet struct {
	s []storage.Series
	i int
}

func (s *seriesSet) Next() bool                        { s.i++; return s.i <= len(s.s) }
func (s *seriesSet) At() storage.Series                { return s.s[s.i-1] }
func (s *seriesSet) Err() error                        { return nil }
func (s *seriesSet) Warnings() annotations.Annotations { return nil }

func startServe(t *testing.T, opts server.Options) *server.Server {
	t.Helper()
	opts.HTTPAddr, opts.GRPCAddr = "127.0.0.1:0", "127.0.0.1:0"
	opts.Logger = slog.New(slog.DiscardHandler)
	opts.WatchInterval = -1
	srv, err := server.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv
}

func post(t *testing.T, addr, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// await polls cond every 20ms until it holds, for at most 10s.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %s in 10s", what)
		}
	}
}

// TestAlertsFireOnFirstEvent makes, on a real serve over a private Redis,
// the first event of each kind an alert counts, and checks with the rule
// engine that the alert fires on the scrapes before and after it. An
// alert on a count that no step here makes must name its series, which
// must then exist at 0 before any event.
func TestAlertsFireOnFirstEvent(t *testing.T) {
	alerts := alertRules(t)
	r := redistest.StartServer(t)
	cfgFile := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfgFile, []byte(firingConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startServe(t, server.Options{ConfigFile: cfgFile, RedisURL: "redis://" + r.Addr, FleetSize: 1,
		StoreCheckInterval: 50 * time.Millisecond, DecisionTimeout: 100 * time.Millisecond})
	addr := srv.HTTPAddr()
	metric := func(name string, lbls map[string]string) float64 {
		v, _ := promtest.Value(t, srv.Metrics().Registry(), name, lbls)
		return v
	}
	rc := r.Client(t)
	ctx := context.Background()
	var memAddr string

	// Each step makes its event between two scrapes of serve (srv's
	// unless it says), after an outage, scraped while it lasts, if it has
	// one; want are the alerts that must fire.
	steps := []struct {
		name   string
		serve  func(t *testing.T) string
		outage func(t *testing.T)
		event  func(t *testing.T)
		undo   func(t *testing.T) // after the scrapes, so the next step starts clear
		want   []string
	}{{
		name: "a configuration reload rejected",
		event: func(t *testing.T) {
			if err := os.WriteFile(cfgFile, []byte("policies: [{name: api, limit: nonsense}]\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := srv.Reload(); err == nil {
				t.Fatal("a bad configuration reloaded")
			}
			if err := os.WriteFile(cfgFile, []byte(firingConfig), 0o600); err != nil {
				t.Fatal(err)
			}
		},
		undo: func(t *testing.T) {
			if err := srv.Reload(); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{"SluiceConfigReloadFailed"},
	}, {
		name: "Redis flushed",
		event: func(t *testing.T) {
			if err := rc.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			await(t, "flush seen", func() bool { return metric("sluice_redis_flushes_total", nil) > 0 })
		},
		want: []string{"SluiceRedisFlushed"},
	}, {
		name: "Redis evicting keys",
		event: func(t *testing.T) {
			// Room for about 32 of the 200 values.
			used, err := rc.Info(ctx, "memory").Result()
			if err != nil {
				t.Fatal(err)
			}
			base := parseInfoInt(used, "used_memory")
			for _, kv := range [][2]string{{"maxmemory-policy", "allkeys-random"}, {"maxmemory", strconv.FormatInt(base+256<<10, 10)}} {
				if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			val := strings.Repeat("x", 8<<10)
			for i := range 200 {
				rc.Set(ctx, fmt.Sprintf("filler:%d", i), val, 0)
			}
			rc.ConfigSet(ctx, "maxmemory", "0")
			rc.ConfigSet(ctx, "maxmemory-policy", "noeviction")
			await(t, "evictions seen", func() bool { return metric("sluice_redis_evicted_keys_total", nil) > 0 })
		},
		want: []string{"SluiceRedisEvictingKeys"},
	}, {
		name: "Redis restarted",
		event: func(t *testing.T) {
			r.Stop()
			r.Start(t)
			await(t, "the restart seen", func() bool { return metric("sluice_redis_restarts_total", nil) > 0 })
		},
		want: []string{"SluiceRedisRestarted"},
	}, {
		// Down for longer than the alert's range: its count must still be
		// scraped while Redis does not answer, or increase() finds no
		// sample before the restart's.
		name: "Redis restarted after a long outage",
		outage: func(t *testing.T) {
			r.Stop()
			await(t, "Redis seen down", func() bool { return metric("sluice_redis_up", nil) == 0 })
		},
		event: func(t *testing.T) {
			was := metric("sluice_redis_restarts_total", nil)
			r.Start(t)
			await(t, "the restart seen", func() bool { return metric("sluice_redis_restarts_total", nil) > was })
		},
		want: []string{"SluiceRedisRestarted"},
	}, {
		// Redis runs without persistence here: its restart loses the
		// slot, which no longer bounds its key.
		name: "Redis restarted holding an in-flight slot",
		event: func(t *testing.T) {
			if code, body := post(t, addr, "/v1/acquire", `{"policy":"exports","key":"cat"}`); code != http.StatusOK {
				t.Fatalf("acquire: %d %s", code, body)
			}
			time.Sleep(time.Second) // the slot older than the restarted server's start, in whole seconds
			r.Stop()
			r.Start(t)
			await(t, "the slot lost", func() bool { return metric("sluice_redis_slots_lost_total", nil) > 0 })
		},
		want: []string{"SluiceRedisRestarted", "SluiceInFlightSlotsLost"},
	}, {
		name: "an in-flight release failed, and the breaker opened",
		event: func(t *testing.T) {
			code, body := post(t, addr, "/v1/acquire", `{"policy":"exports","key":"ann"}`)
			if code != http.StatusOK {
				t.Fatalf("acquire: %d %s", code, body)
			}
			var acq struct{ Token any }
			if err := json.Unmarshal([]byte(body), &acq); err != nil {
				t.Fatal(err)
			}
			tok, _ := json.Marshal(map[string]any{"token": acq.Token})
			r.Stop()
			if code, body := post(t, addr, "/v1/release", string(tok)); code != http.StatusServiceUnavailable {
				t.Fatalf("release with Redis stopped: %d %s, want 503", code, body)
			}
			await(t, "the breaker opening", func() bool {
				post(t, addr, "/v1/check", `{"policy":"api","key":"bob"}`)
				return metric("sluice_breaker_transitions_total", map[string]string{"to": "open"}) > 0
			})
		},
		want: []string{"SluiceBreakerOpened", "SluiceInFlightReleaseErrors"},
	}, {
		name: "the memory store evicting keys",
		serve: func(t *testing.T) string {
			return startServe(t, server.Options{ConfigFile: cfgFile, MaxKeys: 10}).HTTPAddr()
		},
		event: func(t *testing.T) {
			// MaxKeys 10 over 64 shards is a key a shard: more keys than
			// shards must evict (20 landed in 20 shards once in 20 runs).
			for i := range 100 {
				if code, body := post(t, memAddr, "/v1/check", fmt.Sprintf(`{"policy":"api","key":"k%d"}`, i)); code != http.StatusOK {
					t.Fatalf("check: %d %s", code, body)
				}
			}
		},
		want: []string{"SluiceMemoryStoreEvictingKeys"},
	}}
	// Alerts on counts no step makes (their events need more than one
	// serve: TestFleetSlotNotesDroppedFires makes them): their series must
	// exist at 0 from the start.
	unmade := map[string]string{
		"SluiceFleetSlotNotesDropped": "Redis refusing a fleet's publishes",
	}
	first := scrape(t, addr)
	covered := map[string]bool{}
	for _, st := range steps {
		for _, w := range st.want {
			covered[w] = true
		}
	}
	for _, a := range alerts {
		switch {
		case !a.counts || covered[a.name]:
		case unmade[a.name] != "":
			for _, vs := range a.selector {
				if !slices.ContainsFunc(first, func(s sample) bool { return matches(vs, s.lbls) && s.v == 0 }) {
					t.Errorf("%s (%s is not made here): no series of %s at 0 before any event", a.name, unmade[a.name], vs)
				}
			}
		default:
			t.Errorf("%s counts events (increase) but no step here makes its first: add one", a.name)
		}
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			at := addr
			if st.serve != nil {
				at = st.serve(t)
				memAddr = at
			}
			scrapes := [][]sample{scrape(t, at)}
			if st.outage != nil {
				st.outage(t)
				scrapes = append(scrapes, scrape(t, at))
			}
			st.event(t)
			scrapes = append(scrapes, scrape(t, at))
			if st.undo != nil {
				st.undo(t)
			}
			fired, early := firing(t, alerts, scrapes...)
			for _, w := range st.want {
				if slices.Contains(early, w) {
					t.Errorf("%s fires before the event", w)
				} else if !slices.Contains(fired, w) {
					t.Errorf("%s did not fire (fired: %v)", w, fired)
				}
			}
			t.Logf("fired: %v", fired)
		})
	}
}

// matches reports whether vs selects a series with lbls.
func matches(vs *parser.VectorSelector, lbls labels.Labels) bool {
	for _, m := range vs.LabelMatchers {
		if !m.Matches(lbls.Get(m.Name)) {
			return false
		}
	}
	return true
}

// parseInfoInt returns field's value in an INFO reply.
func parseInfoInt(info, field string) int64 {
	for l := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), field+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// SluiceBreakerOpened fires for a Cluster master's breaker whose series is
// born at 1: the breaker is built at the master's first key, which may
// open it before any scrape reads its 0.
func TestBreakerOpenedOnNewPartition(t *testing.T) {
	var opened []alertRule
	for _, a := range alertRules(t) {
		if a.name == "SluiceBreakerOpened" {
			opened = append(opened, a)
		}
	}
	if len(opened) != 1 {
		t.Fatalf("%d SluiceBreakerOpened alerts", len(opened))
	}
	series := func(partition string, v float64) sample {
		return sample{labels.FromStrings("__name__", "sluice_breaker_transitions_total", "job", "sluice", "instance", "a:8080",
			"store", "redis", "partition", partition, "to", "open"), v}
	}
	before := []sample{series("", 0)}
	after := []sample{series("", 0), series("10.0.0.2:6379", 1)}
	if fired, _ := firing(t, opened, before, after); len(fired) != 1 {
		t.Error("SluiceBreakerOpened does not fire for a partition's series born at 1")
	}
}
