package monitoring

import (
	"bufio"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server"
)

const (
	monitoringDoc = "../docs/monitoring.md"
	middlewareDoc = "../docs/middleware.md"
)

// docSeries is a series docs/monitoring.md names: in a list (a code
// block), or in backquotes in its text.
type docSeries struct {
	name string
	// labels are the series' label names, as the doc writes them; nil
	// when it names the series without them (the text's mentions of the
	// middleware's metrics, whose labels docs/middleware.md lists).
	labels []string
	// note is the rest of the list's line: what the series is.
	note string
}

// docName is a series as the docs write it: name{label,label}, the name
// ending in * for a family (sluice_inflight_*).
var docName = regexp.MustCompile(`^(sluice_[a-z0-9_]+\*?)(?:\{([a-z_,]*)\})?$`)

// readDocSeries returns the series file names: each list line's (one or
// more before the description, split by ", ") and each in backquotes.
func readDocSeries(t *testing.T, file string) []docSeries {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []docSeries
	add := func(s, note string, listed bool) {
		m := docName.FindStringSubmatch(s)
		if m == nil {
			return
		}
		d := docSeries{name: m[1], note: note}
		switch {
		case m[2] != "":
			d.labels = strings.Split(m[2], ",")
		case strings.Contains(s, "{}") || listed:
			d.labels = []string{}
		}
		out = append(out, d)
	}
	code := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			code = !code
			continue
		}
		if code {
			names, note, _ := strings.Cut(line, "   ")
			for _, s := range strings.Split(strings.TrimSpace(names), ", ") {
				add(s, strings.TrimSpace(note), true)
			}
			continue
		}
		for i, s := range strings.Split(line, "`") {
			if i%2 == 1 {
				add(s, "", false)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// families scrapes addr's /metrics and returns each sluice_ family's
// label names.
func families(t *testing.T, addr string) map[string][]string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, "sluice_") {
			continue
		}
		var lbls []string
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(lbls, l.GetName()) {
					lbls = append(lbls, l.GetName())
				}
			}
		}
		slices.Sort(lbls)
		out[name] = lbls
	}
	return out
}

// seriesConfig has a rate policy (2/min: a key's third check is denied),
// a leased one and an in-flight one.
const seriesConfig = `
policies:
  - name: api
    key: "{user}"
    limit: 2/min
  - name: leased
    key: "{user}/{route}"
    limit: 1000/s
    lease: 50ms
  - name: exports
    key: "{user}"
    in_flight:
      max: 10
      hold: 10s
`

// afterEvent are the series a serve does not export until an event,
// which TestDocumentedSeries makes; docs/monitoring.md says so of each.
var afterEvent = map[string]string{
	"sluice_api_requests_total":              "a request",
	"sluice_api_request_duration_seconds":    "a request",
	"sluice_store_calls_total":               "a store call",
	"sluice_store_errors_total":              "a store call failing",
	"sluice_store_latency_seconds":           "a store call",
	"sluice_top_key_denials":                 "a denial",
	"sluice_top_key_near_limit":              "a decision near its limit",
	"sluice_rls_unmatched_descriptors_total": "a descriptor no rule matches",
}

// TestDocumentedSeries runs sluice serve on each store docs/monitoring.md
// speaks of (memory, Redis, Redis under Sentinel, Redis Cluster), makes
// the events some series wait for, and checks that every series the doc
// names is exported, with the labels it lists, and that every sluice_
// series exported is in the doc.
func TestDocumentedSeries(t *testing.T) {
	doc := readDocSeries(t, monitoringDoc)
	// A series named without labels has those listed where monitoring.md
	// names it with them, or else in middleware.md's list (the
	// middleware's metrics, which monitoring.md refers to).
	docLabels := map[string][]string{}
	for _, d := range append(doc, readDocSeries(t, middlewareDoc)...) {
		if _, ok := docLabels[d.name]; !ok && d.labels != nil {
			docLabels[d.name] = d.labels
		}
	}
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(seriesConfig), 0o600); err != nil {
		t.Fatal(err)
	}

	// seen: each family's labels, over every deployment; in: the
	// deployments exporting it.
	seen := map[string][]string{}
	in := map[string][]string{}
	merge := func(kind string, fams map[string][]string) {
		for name, lbls := range fams {
			for _, l := range lbls {
				if !slices.Contains(seen[name], l) {
					seen[name] = append(seen[name], l)
				}
			}
			if seen[name] == nil {
				seen[name] = []string{}
			}
			if !slices.Contains(in[name], kind) {
				in[name] = append(in[name], kind)
			}
		}
	}
	run := func(kind string, opts server.Options, fail func()) {
		opts.ConfigFile = cfg
		srv := startServe(t, opts)
		addr := srv.HTTPAddr()
		before := families(t, addr)
		for name := range before {
			if why := afterEvent[name]; why != "" {
				t.Errorf("%s: %s is exported before %s", kind, name, why)
			}
		}
		merge(kind, before)
		for range 4 {
			post(t, addr, "/v1/check", `{"policy":"api","key":"ann"}`)
			post(t, addr, "/v1/check", `{"policy":"leased","key":"ann/x"}`)
		}
		post(t, addr, "/v1/acquire", `{"policy":"exports","key":"ann"}`)
		post(t, addr, "/json", `{"domain":"nowhere","descriptors":[{"entries":[{"key":"x","value":"y"}]}]}`)
		post(t, addr, "/json", `{"domain":"sluice","descriptors":[{"entries":[{"key":"x","value":"y"}]}]}`)
		if fail != nil {
			fail()
			post(t, addr, "/v1/check", `{"policy":"api","key":"bob"}`)
		}
		after := families(t, addr)
		for name := range after {
			if _, ok := before[name]; !ok && afterEvent[name] == "" {
				t.Errorf("%s: %s is exported only after this test's events: add it to afterEvent, and say so in %s", kind, name, monitoringDoc)
			}
		}
		merge(kind, after)
	}
	run("memory", server.Options{}, nil)
	r := redistest.StartServer(t)
	run("redis", server.Options{RedisURL: "redis://" + r.Addr}, r.Stop)
	run("sentinel", server.Options{RedisURL: redistest.StartSentinel(t, nil).URL()}, nil)
	run("cluster", server.Options{RedisURL: redistest.StartCluster(t, nil).URL()}, nil)

	documented := map[string]bool{}
	checked := map[string]bool{} // label names compared
	for _, d := range doc {
		var names []string
		if prefix, ok := strings.CutSuffix(d.name, "*"); ok {
			for name := range seen {
				if strings.HasPrefix(name, prefix) {
					names = append(names, name)
				}
			}
		} else if _, ok := seen[d.name]; ok {
			names = []string{d.name}
		}
		if len(names) == 0 {
			t.Errorf("%s names %s, which no serve exported", monitoringDoc, d.name)
			continue
		}
		for _, name := range names {
			documented[name] = true
			want := d.labels
			if want == nil && !checked[name] {
				want = docLabels[name]
			}
			if want != nil {
				checked[name] = true
				got := slices.Sorted(slices.Values(seen[name]))
				if want = slices.Sorted(slices.Values(want)); !slices.Equal(got, want) {
					t.Errorf("%s lists %s{%s}; exported with {%s}", monitoringDoc, name, strings.Join(want, ","), strings.Join(got, ","))
				}
			}
			for kind, only := range map[string]string{"sentinel": "Sentinel only", "cluster": "Redis Cluster only"} {
				if strings.HasPrefix(d.note, only) && !slices.Equal(in[name], []string{kind}) {
					t.Errorf("%s says %s is %s; exported by %v", monitoringDoc, name, only, in[name])
				}
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(seen)) {
		if !documented[name] {
			t.Errorf("%s{%s} is exported (by %v) but not in %s", name, strings.Join(seen[name], ","), in[name], monitoringDoc)
		}
	}
}
