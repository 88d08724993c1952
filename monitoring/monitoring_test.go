package monitoring

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/sluicehq/sluice/server"
)

const (
	alertsFile    = "../deploy/prometheus/alerts.yaml"
	dashboardFile = "../deploy/grafana/sluice.json"
)

// scrapeLabels are the labels Prometheus adds to every series it scrapes.
var scrapeLabels = []string{"job", "instance"}

var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), .*constLabels: \{(.*?)\}, variableLabels: \{(.*?)\}\}$`)

// exported returns the metrics a sluice service exports, with their label
// names, read from the service's own registry: a server on the Redis
// store registers every metric the service has. It uses the test Redis
// when SLUICE_REDIS_ADDR names one (scripts/test does), else an address
// nothing answers: it is never asked for a decision. Histograms' _bucket, _sum and _count series are
// included; so is Prometheus's own "up", which rules may use too.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	addr := cmp.Or(os.Getenv("SLUICE_REDIS_ADDR"), "127.0.0.1:1")
	srv, err := server.New(server.Options{
		RedisURL: "redis://" + addr, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	ch := make(chan *prometheus.Desc)
	go func() {
		srv.Metrics().Registry().Describe(ch)
		close(ch)
	}()
	out := map[string][]string{"up": slices.Clone(scrapeLabels)}
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		name, err := strconv.Unquote(m[1])
		if err != nil {
			t.Fatal(err)
		}
		lbls := slices.Clone(scrapeLabels)
		for _, kv := range strings.Split(m[2], ",") {
			if k, _, ok := strings.Cut(kv, "="); ok {
				lbls = append(lbls, k)
			}
		}
		for _, l := range strings.Split(m[3], ",") {
			if l != "" {
				lbls = append(lbls, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
			}
		}
		out[name] = lbls
		out[name+"_sum"], out[name+"_count"] = lbls, lbls
		out[name+"_bucket"] = append(slices.Clone(lbls), "le")
	}
	if _, ok := out["sluice_decisions_total"]; !ok {
		t.Fatalf("the service's registry lacks sluice_decisions_total: %v", out)
	}
	return out
}

// checkExpr parses a PromQL expression with Prometheus's parser and checks
// that every selector names a metric sluice exports, with labels it has.
func checkExpr(t *testing.T, where, expr string, metrics map[string][]string) {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v\n%s", where, err, expr)
		return
	}
	n := 0
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		n++
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		lbls, ok := metrics[name]
		if !ok {
			t.Errorf("%s: metric %q is not one sluice exports", where, name)
			return nil
		}
		for _, m := range vs.LabelMatchers {
			if m.Name != model.MetricNameLabel && !slices.Contains(lbls, m.Name) {
				t.Errorf("%s: %s has no label %q (it has %v)", where, name, m.Name, lbls)
			}
		}
		return nil
	})
	if n == 0 {
		t.Errorf("%s: no metric in %q", where, expr)
	}
}

func TestAlertingRules(t *testing.T) {
	metrics := exported(t)
	groups, errs := rulefmt.ParseFile(alertsFile, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	var alerts []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkExpr(t, alertsFile+": "+r.Alert, r.Expr, metrics)
			if r.Annotations["summary"] == "" {
				t.Errorf("%s: no summary", r.Alert)
			}
		}
	}
	// The conditions an operator must hear about.
	for _, want := range []string{"SluiceRedisLost", "SluiceFallbackActive", "SluiceBreakerOpen",
		"SluiceDenialRatioJump", "SluiceStoreLatencyNearTimeout", "SluiceConfigReloadFailed",
		"SluiceInFlightReleaseErrors", "SluiceInFlightExpiring", "SluiceInFlightFull",
		"SluiceInFlightShedding", "SluiceFleetSlotNotesDropped", "SluiceInFlightSlotsLost"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("no %s alert; have %v", want, alerts)
		}
	}
}

// grafanaVar is a dashboard variable reference: $name or ${name}.
var grafanaVar = regexp.MustCompile(`\$\{?(\w+)\}?`)

// substitute replaces Grafana's variables with values of their kind: a
// range for the built-in intervals, a match-all regular expression for
// the dashboard's own (which only appear in =~ matchers).
func substitute(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.HasPrefix(strings.Trim(v, "${}"), "__") {
			return "5m"
		}
		return ".*"
	})
}

var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

func TestGrafanaDashboard(t *testing.T) {
	metrics := exported(t)
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title  string
		Panels []struct {
			Title   string
			Type    string
			Targets []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name       string
				Type       string
				Definition string
			}
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatal(err)
	}
	queries := 0
	shown := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			queries++
			checkExpr(t, dashboardFile+": panel "+strconv.Quote(p.Title), substitute(tg.Expr), metrics)
			if e, err := parser.NewParser(parser.Options{}).ParseExpr(substitute(tg.Expr)); err == nil {
				parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
					if vs, ok := node.(*parser.VectorSelector); ok {
						shown[vs.Name] = true
					}
					return nil
				})
			}
		}
	}
	// The figures an operator must see.
	for _, want := range []string{"sluice_decisions_total", "sluice_fallback_active",
		"sluice_inflight_held", "sluice_inflight_acquires_total", "sluice_inflight_calls_total",
		"sluice_inflight_expired_total", "sluice_fleet_slot_notes_dropped_total"} {
		if !shown[want] {
			t.Errorf("no panel shows %s", want)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(selector, label)", v.Name, v.Definition)
			continue
		}
		checkExpr(t, dashboardFile+": variable "+v.Name, substitute(m[1]), metrics)
		if name := strings.Split(m[1], "{")[0]; !slices.Contains(metrics[name], m[2]) {
			t.Errorf("variable %s: %s has no label %q", v.Name, name, m[2])
		}
	}
	t.Logf("%d panels, %d queries, %d variables checked", len(dash.Panels), queries, len(dash.Templating.List))
}
