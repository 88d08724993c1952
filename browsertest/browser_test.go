package browsertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/server/config"
	"github.com/sluicehq/sluice/server/dashboard"
)

// The browser test drives the real page in headless Chromium against the
// real service (the server package's JSON API on the memory store): it
// clicks Burst 10 on the fixed-window card, reads the ten results and checks
// the chart, the shadow display, Reset All with and without the admin token,
// text contrast, configuration reloads and the narrow layout. Set
// SLUICE_CHROMIUM to use another browser binary.

const adminToken = "s3cret-token"

// longName is as long as the descriptor paths Envoy-format policies get.
const longName = "ingress.remote_address.header_match_api_key.path_prefix_checkout"

// t0 is the frozen time of the store and the statistics: a burst never
// straddles a window edge, so the verdicts are exact.
var t0 = time.Date(2030, 1, 2, 3, 4, 1, 0, time.UTC)

// testConfig is the demo configuration plus one shadow policy, one whose
// override gives the page's key (dashboard) another capacity, and any extra
// policies given as YAML list items.
func testConfig(t *testing.T, extra string) *config.Config {
	t.Helper()
	text := testConfigText(extra)
	cfg, err := config.Parse("dashboard-test.yaml", []byte(text))
	if err != nil {
		t.Fatalf("config:\n%s\n%v", text, err)
	}
	return cfg
}

// testConfigText is testConfig's YAML.
func testConfigText(extra string) string {
	var b strings.Builder
	b.WriteString("policies:\n")
	for _, p := range server.DemoConfig().Policies {
		fmt.Fprintf(&b, "  - name: %s\n    limit: %s\n", p.Name, p.Limit)
	}
	b.WriteString("  - name: shadow\n    limit: 3/min\n    strategy: shadow\n")
	b.WriteString("  - name: vip\n    limit: sliding_window_log 2/min\n    overrides:\n      - match: dash*\n        limit: 7/min\n")
	b.WriteString("  - name: " + longName + "\n    limit: 100/min\n")
	b.WriteString("  - name: leased\n    limit: 100/min\n    lease: 1s\n")
	b.WriteString(extra)
	return b.String()
}

// testService is the service under test with hooks into its HTTP traffic.
type testService struct {
	base string // the page's URL without the final slash
	svc  *server.Service

	mu sync.Mutex
	// failPolicies is how many more GET /v1/policies answer 503.
	failPolicies int
	// holdReset, when set, is called after a reset of that policy is served
	// and before its answer goes out.
	holdReset map[string]func()
	// failReset names policies whose resets answer 503 without reaching the
	// service.
	failReset map[string]bool
}

// startService serves the service's HTTP API with this dashboard on
// testConfig, under a path prefix (`sluice serve` mounts it at "/"): the
// page must reach its assets and the API by relative URLs.
func startService(t *testing.T) *testService {
	t.Helper()
	cfg := testConfig(t, "")
	clock := func() time.Time { return t0 }
	store := memory.New(&memory.Options{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { _ = store.Close() })
	svc := server.NewService(store, cfg, &server.ServiceOptions{Clock: clock})
	s := &testService{svc: svc}
	const prefix = "/ops/sluice"
	mux := http.NewServeMux()
	mux.Handle(prefix+"/", http.StripPrefix(prefix, s.hooks(svc.Handler(&server.HandlerOptions{AdminToken: adminToken, Dashboard: dashboard.Handler()}))))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	s.base = ts.URL + prefix
	return s
}

func (s *testService) hooks(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		fail := r.URL.Path == "/v1/policies" && s.failPolicies > 0
		if fail {
			s.failPolicies--
		}
		s.mu.Unlock()
		if fail {
			http.Error(w, "failing on purpose", http.StatusServiceUnavailable)
			return
		}
		if r.URL.Path != "/v1/reset" {
			h.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req struct{ Policy string }
		_ = json.Unmarshal(body, &req)
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		failReset := s.failReset[req.Policy]
		s.mu.Unlock()
		if failReset {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"status":503,"title":"Service Unavailable","detail":"failing on purpose"}`)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		s.mu.Lock()
		hold := s.holdReset[req.Policy]
		s.mu.Unlock()
		if hold != nil {
			hold()
		}
		maps.Copy(w.Header(), rec.Header())
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found: install it (apt-get install -y chromium) or set SLUICE_CHROMIUM; CI requires the browser test")
	}
	t.Skip("chromium not found; install it (apt-get install -y chromium) to run the browser test")
	return ""
}

// newBrowser starts a fresh headless Chromium with its own profile and
// returns a tab. Console messages of the page are collected for checks.
func newBrowser(t *testing.T) (context.Context, *consoleLog) {
	t.Helper()
	path := chromiumPath(t)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancelTab := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil { // starts the browser, bound to ctx
		t.Fatalf("starting %s: %v", path, err)
	}
	logs := &consoleLog{}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			logs.add(m)
		}
	}()
	return ctx, logs
}

type consoleLog struct {
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
}

func (c *consoleLog) add(m chromedp.ConsoleMessage) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, m)
}

// problems returns exceptions, console.error calls and browser log errors
// other than network ones: 401 and 429 responses are logged by the browser
// as failed loads, and those are expected here.
func (c *consoleLog) problems() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, m := range c.msgs {
		if m.IsException() || (m.Type == chromedp.ConsoleError && m.Source != "network") || m.Source == "security" {
			out = append(out, fmt.Sprintf("%s %s:%d %s", m.Type, m.URL, m.Line+1, m.Text))
		}
	}
	return out
}

// step runs actions with a bound, so a broken page fails the test quickly.
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	v, err := chromedp.Run(sctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// waitFor polls a JavaScript condition; on timeout it reports the condition
// and what describe evaluates to, which is usually the state that was wrong.
func waitFor(t *testing.T, ctx context.Context, cond, describe string) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := chromedp.Run(sctx, chromedp.Poll[chromedp.Void](cond, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
		got := eval[string](t, ctx, describe)
		t.Fatalf("waiting for %s: %v; state: %s", cond, err, got)
	}
}

type policyInfo struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	Rate      int64  `json:"rate"`
	PeriodMS  int64  `json:"period_ms"`
	Burst     int64  `json:"burst"`
	Shadow    bool   `json:"shadow"`
}

func fetchPolicies(t *testing.T, base string) []policyInfo {
	t.Helper()
	res, err := http.Get(base + "/v1/policies")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var body struct{ Policies []policyInfo }
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	return body.Policies
}

// capacityOf is how many units a fresh key admits at once.
func capacityOf(p policyInfo) int64 {
	switch p.Algorithm {
	case "fixed_window", "sliding_window_log", "sliding_window_counter":
		return p.Rate
	}
	if p.Burst > 0 {
		return p.Burst
	}
	return p.Rate
}

func cardSel(name string) string { return fmt.Sprintf(`.card[data-policy=%s]`, strconv.Quote(name)) }

// jsCard is a JavaScript expression for the card of policy name.
func jsCard(name string) string {
	return fmt.Sprintf(`document.querySelector(%s)`, strconv.Quote(cardSel(name)))
}

type result struct {
	Seq          int
	Allowed      string
	ShadowDenied string
	Remaining    string
	RetryAfterMS string
	Status       string
}

// readResults returns the card's results, oldest first.
func readResults(t *testing.T, ctx context.Context, name string) []result {
	t.Helper()
	raw := eval[[]map[string]string](t, ctx, fmt.Sprintf(
		`[...%s.querySelectorAll(".result")].map(li => ({...li.dataset}))`, jsCard(name)))
	out := make([]result, 0, len(raw))
	for _, d := range raw {
		seq, err := strconv.Atoi(d["seq"])
		if err != nil {
			t.Fatalf("result without a sequence number: %v", d)
		}
		out = append(out, result{
			Seq: seq, Allowed: d["allowed"], ShadowDenied: d["shadowDenied"],
			Remaining: d["remaining"], RetryAfterMS: d["retryAfterMs"], Status: d["status"],
		})
	}
	slices.SortFunc(out, func(a, b result) int { return a.Seq - b.Seq })
	return out
}

// burst clicks Burst 10 on the card and waits for its ten results.
func burst(t *testing.T, ctx context.Context, name string) []result {
	t.Helper()
	card := jsCard(name)
	step(t, ctx, "click Burst 10 on "+name, chromedp.Click(chromedp.CSS(cardSel(name)+` button[data-action="burst"]`)))
	waitFor(t, ctx,
		fmt.Sprintf(`%s.dataset.busy === "false" && %s.querySelectorAll(".result").length === 10`, card, card),
		fmt.Sprintf(`%s.outerHTML`, card))
	return readResults(t, ctx, name)
}

// lowContrastJS lists visible text (and inputs) below WCAG AA's 4.5:1
// against its nearest opaque background, with the status shown as kind %[2]s.
// Scheme %[1]s "dark" turns the stylesheet's prefers-color-scheme: dark
// block on, "light" turns it off. Disabled controls are exempt.
const lowContrastJS = `(() => {
	const rules = [...document.styleSheets].flatMap((s) => [...s.cssRules])
		.filter((r) => r.media && r.media.mediaText.includes("prefers-color-scheme: dark"));
	const saved = rules.map((r) => r.media.mediaText);
	rules.forEach((r) => { r.media.mediaText = %[1]s === "dark" ? "all" : "not all"; });
	const st = document.getElementById("status");
	const was = [st.textContent, st.dataset.kind];
	st.textContent = "Status text";
	st.dataset.kind = %[2]s;
	const rgb = (c) => (c.match(/[\d.]+/g) || []).map(Number);
	const lum = ([r, g, b]) => {
		const f = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
		return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
	};
	const bg = (el) => {
		for (; el; el = el.parentElement) {
			const c = rgb(getComputedStyle(el).backgroundColor);
			if (c.length === 3 || c[3] > 0) return c;
		}
		return [255, 255, 255];
	};
	const bad = [];
	try {
		for (const el of document.body.querySelectorAll("*")) {
			const text = el.tagName === "INPUT" ||
				[...el.childNodes].some((n) => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
			if (!text || !el.getClientRects().length || el.closest(":disabled, svg")) continue;
			const fg = rgb(getComputedStyle(el).color);
			const back = bg(el);
			const [hi, lo] = [lum(fg), lum(back)].sort((a, b) => b - a);
			const ratio = (hi + 0.05) / (lo + 0.05);
			if (ratio < 4.5) {
				bad.push(el.tagName.toLowerCase() + "." + [...el.classList].join(".") + " “" +
					(el.value || el.textContent).trim().slice(0, 30) + "”: " + ratio.toFixed(2) +
					":1 (rgb " + fg + " on " + back + ")");
			}
		}
	} finally {
		rules.forEach((r, i) => { r.media.mediaText = saved[i]; });
		[st.textContent, st.dataset.kind] = was;
	}
	return bad;
})()`

func TestBrowser(t *testing.T) {
	ts := startService(t)
	base, svc := ts.base, ts.svc
	policies := fetchPolicies(t, base)
	var fixed, shadow policyInfo
	for _, p := range policies {
		switch {
		case p.Shadow:
			shadow = p
		case p.Algorithm == "fixed_window":
			fixed = p
		}
	}
	if fixed.Name == "" || shadow.Name == "" {
		t.Fatalf("policies %+v lack a fixed-window or a shadow policy", policies)
	}
	fixedCap := capacityOf(fixed)
	wantDenied := max(0, 10-fixedCap)
	if wantDenied == 0 {
		t.Fatalf("fixed-window capacity %d admits a whole burst; the test needs denials", fixedCap)
	}

	ctx, logs := newBrowser(t)
	step(t, ctx, "open the dashboard", chromedp.Navigate(base+"/"))
	waitFor(t, ctx, `document.body.dataset.ready === "true"`, `document.body.innerText`)

	t.Run("one card per policy", func(t *testing.T) {
		got := eval[[]string](t, ctx, `[...document.querySelectorAll(".card")].map(c => c.dataset.policy)`)
		var want []string
		for _, p := range policies {
			want = append(want, p.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("cards %q, want %q", got, want)
		}
		// Each card peeks at its key on load.
		waitFor(t, ctx, fmt.Sprintf(`%s.querySelector(".remaining-now").textContent === "%d of %d"`, jsCard(fixed.Name), fixedCap, fixedCap),
			jsCard(fixed.Name)+`.outerHTML`)
		// A per-key override's capacity (7 for this key), not the policy's 2.
		waitFor(t, ctx, jsCard("vip")+`.querySelector(".remaining-now").textContent === "7 of 7"`, jsCard("vip")+`.outerHTML`)
		// The charts are drawn from /v1/stats before anything is sent.
		waitFor(t, ctx, fmt.Sprintf(`%s.querySelector(".chart").dataset.renders > 0`, jsCard(fixed.Name)), `document.body.innerHTML`)
	})

	chart := jsCard(fixed.Name) + `.querySelector(".chart")`

	t.Run("burst 10 on the fixed window", func(t *testing.T) {
		res := burst(t, ctx, fixed.Name)
		var denied int64
		for i, r := range res {
			// Sequential checks in one window: the first fixedCap are
			// admitted, the rest denied until the window ends.
			wantAllowed := int64(i) < fixedCap
			if got, want := r.Allowed, strconv.FormatBool(wantAllowed); got != want {
				t.Errorf("result %d: allowed %s, want %s", i+1, got, want)
			}
			wantRemaining, wantStatus := fixedCap-int64(i)-1, "200"
			if !wantAllowed {
				wantRemaining, wantStatus = 0, "429"
				denied++
			}
			if got, want := r.Remaining, strconv.FormatInt(wantRemaining, 10); got != want {
				t.Errorf("result %d: remaining %s, want %s", i+1, got, want)
			}
			if got, want := r.Status, wantStatus; got != want {
				t.Errorf("result %d: status %s, want %s", i+1, got, want)
			}
		}
		if denied != wantDenied {
			t.Errorf("%d of 10 denied, want %d (capacity %d)", denied, wantDenied, fixedCap)
		}
		if got, want := eval[string](t, ctx, jsCard(fixed.Name)+`.dataset.deniedCount`), strconv.FormatInt(wantDenied, 10); got != want {
			t.Errorf("card tally: %s denied, want %s", got, want)
		}
		// A denial waits for the end of the window.
		wantRetry := fixed.PeriodMS - t0.UnixMilli()%fixed.PeriodMS
		for i, r := range res[fixedCap:] {
			if got, want := r.RetryAfterMS, strconv.FormatInt(wantRetry, 10); got != want {
				t.Errorf("result %d: retry after %s ms, want %s", int(fixedCap)+i+1, got, want)
			}
		}
		retryText := eval[string](t, ctx, jsCard(fixed.Name)+`.querySelector('.result[data-allowed="false"] .detail').textContent`)
		if !strings.Contains(retryText, "retry in ") {
			t.Errorf("denied result reads %q, want its retry-after", retryText)
		}
	})

	t.Run("chart shows the denials", func(t *testing.T) {
		waitFor(t, ctx,
			fmt.Sprintf(`%s.dataset.deniedTotal === "%d" && %s.dataset.allowedTotal === "%d"`, chart, wantDenied, chart, fixedCap),
			chart+`.outerHTML`)
		var series []int64
		if err := json.Unmarshal([]byte(eval[string](t, ctx, chart+`.dataset.seriesDenied`)), &series); err != nil {
			t.Fatal(err)
		}
		if len(series) == 0 || series[len(series)-1] != wantDenied {
			t.Errorf("denied series %v, want %d in the newest bucket", series, wantDenied)
		}
		if n := eval[int](t, ctx, chart+`.querySelectorAll("rect.bar.denied").length`); n != 1 {
			t.Errorf("%d denied bars drawn, want 1", n)
		}
		// Other policies' charts saw nothing.
		for _, p := range policies {
			if p.Name == fixed.Name {
				continue
			}
			c := jsCard(p.Name) + `.querySelector(".chart")`
			if got := eval[string](t, ctx, c+`.dataset.allowedTotal + "/" + `+c+`.dataset.deniedTotal`); got != "0/0" {
				t.Errorf("%s chart: allowed/denied %s, want 0/0", p.Name, got)
			}
		}
	})

	t.Run("a check shows the override's capacity", func(t *testing.T) {
		step(t, ctx, "click Send Request on vip", chromedp.Click(chromedp.CSS(cardSel("vip")+` button[data-action="send"]`)))
		waitFor(t, ctx, jsCard("vip")+`.querySelector(".remaining-now").textContent === "6 of 7"`, jsCard("vip")+`.outerHTML`)
	})

	t.Run("shadow policy lets denials through", func(t *testing.T) {
		res := burst(t, ctx, shadow.Name)
		capShadow := capacityOf(shadow)
		for i, r := range res {
			if r.Allowed != "true" || r.Status != "200" {
				t.Errorf("result %d: allowed %s status %s, want true 200", i+1, r.Allowed, r.Status)
			}
			if got, want := r.ShadowDenied == "true", int64(i) >= capShadow; got != want {
				t.Errorf("result %d: shadow denied %v, want %v", i+1, got, want)
			}
		}
		// The tally counts shadow denials as denied, as the chart does.
		card := jsCard(shadow.Name)
		want := fmt.Sprintf("%d/%d", capShadow, 10-capShadow)
		if got := eval[string](t, ctx, card+`.querySelector(".tally-allowed").textContent + "/" + `+card+`.querySelector(".tally-denied").textContent`); got != want {
			t.Errorf("tally allowed/denied %s, want %s", got, want)
		}
		c := card + `.querySelector(".chart")`
		waitFor(t, ctx, c+`.dataset.allowedTotal + "/" + `+c+`.dataset.deniedTotal === "`+want+`"`, c+`.outerHTML`)
	})

	t.Run("leased policy shows its local decisions", func(t *testing.T) {
		card := jsCard("leased")
		if got := eval[string](t, ctx, card+`.querySelector(".badge.lease").hidden ? "hidden" : `+card+`.querySelector(".badge.lease").textContent`); got != "lease 1.0 s" {
			t.Errorf("lease badge %q, want \"lease 1.0 s\"", got)
		}
		if got := eval[bool](t, ctx, jsCard(fixed.Name)+`.querySelector(".badge.lease").hidden && `+jsCard(fixed.Name)+`.querySelector(".tally-local-line").hidden`); !got {
			t.Error("an exact policy's card shows a lease")
		}
		for i, r := range burst(t, ctx, "leased") {
			if r.Allowed != "true" {
				t.Errorf("result %d: allowed %s, want true", i+1, r.Allowed)
			}
		}
		// Once the key is hot the lease answers, in memory; the tally
		// counts those answers and each says so.
		local := eval[int](t, ctx, card+`.querySelectorAll('.result[data-source="lease"]').length`)
		if local == 0 || local == 10 {
			t.Errorf("%d of 10 results answered from the lease, want some but not the first", local)
		}
		if got := eval[string](t, ctx, card+`.querySelector(".tally-local").textContent`); got != strconv.Itoa(local) {
			t.Errorf("tally says %s answered locally, the results %d", got, local)
		}
		if got := eval[string](t, ctx, card+`.querySelector('.result[data-source="lease"] .detail').textContent`); !strings.Contains(got, " left · local") {
			t.Errorf("a local result reads %q", got)
		}
		// The chart, of all the policy's traffic here, counts them too.
		c := card + `.querySelector(".chart")`
		waitFor(t, ctx, fmt.Sprintf(`%s.dataset.localTotal === "%d" && %s.dataset.allowedTotal === "10"`, c, local, c), c+`.outerHTML`)
		if got := eval[string](t, ctx, card+`.querySelector(".chart-caption").textContent`); !strings.Contains(got, fmt.Sprintf("%d answered locally from the lease (%d%%)", local, local*10)) {
			t.Errorf("chart caption %q lacks the local share", got)
		}
	})

	t.Run("text contrast", func(t *testing.T) {
		// The results above give allowed, denied and shadow verdicts; the
		// status is shown in each of its kinds, in light and dark mode.
		for _, scheme := range []string{"light", "dark"} {
			var bad []string
			for _, kind := range []string{"error", "ok", "info"} {
				bad = append(bad, eval[[]string](t, ctx, fmt.Sprintf(lowContrastJS, strconv.Quote(scheme), strconv.Quote(kind)))...)
			}
			slices.Sort(bad)
			for _, b := range slices.Compact(bad) {
				t.Errorf("%s mode: %s", scheme, b)
			}
		}
	})

	t.Run("landmarks and live regions", func(t *testing.T) {
		if got := eval[string](t, ctx, `document.getElementById("cards").getAttribute("role") || ""`); got != "region" {
			t.Errorf(`#cards role %q, want "region" (aria-label needs a role on a div)`, got)
		}
		// Each response is announced by the results list; the remaining
		// line repeats it and must not be announced as well.
		if n := eval[int](t, ctx, `[...document.querySelectorAll(".remaining-now")].filter(el => el.closest("[aria-live]")).length`); n != 0 {
			t.Errorf("%d remaining-now lines inside a live region", n)
		}
		// A live region must be in the accessibility tree before its first
		// addition, so an empty list is not display: none.
		if n := eval[int](t, ctx, `[...document.querySelectorAll(".results")].filter(el => el.getAttribute("aria-live") !== "polite" || getComputedStyle(el).display === "none").length`); n != 0 {
			t.Errorf("%d results lists are not polite live regions in the accessibility tree", n)
		}
	})

	t.Run("reset needs the admin token", func(t *testing.T) {
		if note := eval[string](t, ctx, `document.getElementById("top-note").textContent`); !strings.Contains(note, "admin token") {
			t.Errorf("without a token the top keys' note says %q", note)
		}
		step(t, ctx, "click Reset All", chromedp.Click(chromedp.ID("reset-all")))
		waitFor(t, ctx, `document.getElementById("status").dataset.kind === "error"`, `document.getElementById("status").outerHTML`)
		msg := eval[string](t, ctx, `document.getElementById("status").textContent`)
		if !strings.Contains(msg, "admin token") {
			t.Errorf("status %q does not mention the admin token", msg)
		}
		if n := len(readResults(t, ctx, fixed.Name)); n != 10 {
			t.Errorf("a refused reset cleared results: %d left", n)
		}

		step(t, ctx, "enter a wrong token",
			chromedp.SendKeys(chromedp.ID("admin-token"), "wrong"),
			chromedp.Click(chromedp.ID("reset-all")))
		waitFor(t, ctx, `document.getElementById("status").textContent.includes("refused")`, `document.getElementById("status").outerHTML`)

		step(t, ctx, "enter the token",
			// Clear sets the attribute, not what was typed; clear the property.
			chromedp.Evaluate[chromedp.Void](`document.getElementById("admin-token").value = ""`),
			chromedp.SendKeys(chromedp.ID("admin-token"), adminToken),
			chromedp.Click(chromedp.ID("reset-all")))
		waitFor(t, ctx, `document.getElementById("status").dataset.kind === "ok"`, `document.getElementById("status").outerHTML`)
		if got := eval[string](t, ctx, `sessionStorage.getItem("sluice.adminToken")`); got != adminToken {
			t.Errorf("session token %q, want %q", got, adminToken)
		}
		if n := eval[int](t, ctx, `document.querySelectorAll(".result").length`); n != 0 {
			t.Errorf("%d results left after Reset All", n)
		}
		waitFor(t, ctx, fmt.Sprintf(`%s.querySelector(".remaining-now").textContent === "%d of %d"`, jsCard(fixed.Name), fixedCap, fixedCap),
			jsCard(fixed.Name)+`.outerHTML`)

		// The key is fresh again: the same burst gives the same verdicts.
		var denied int64
		for _, r := range burst(t, ctx, fixed.Name) {
			if r.Allowed == "false" {
				denied++
			}
		}
		if denied != wantDenied {
			t.Errorf("after reset: %d of 10 denied, want %d", denied, wantDenied)
		}
		waitFor(t, ctx, fmt.Sprintf(`%s.dataset.deniedTotal === "%d"`, chart, 2*wantDenied), chart+`.outerHTML`)
	})

	t.Run("narrow screen", func(t *testing.T) {
		step(t, ctx, "narrow viewport", chromedp.EmulateViewport(360, 740, chromedp.EmulateMobile))
		waitFor(t, ctx, `window.innerWidth === 360`, `String(window.innerWidth)`)
		if got := eval[int](t, ctx, `document.documentElement.scrollWidth`); got > 360 {
			t.Errorf("page is %dpx wide in a 360px viewport", got)
		}
		step(t, ctx, "reset viewport", chromedp.ResetViewport())
	})

	t.Run("helpers", func(t *testing.T) {
		tests := []struct{ expr, want string }{
			{`formatDuration(0)`, `"0 ms"`},
			{`formatDuration(350)`, `"350 ms"`},
			{`formatDuration(4201)`, `"4.3 s"`},
			{`formatDuration(55000)`, `"55 s"`},
			{`formatDuration(65000)`, `"1 min 5 s"`},
			{`formatDuration(7380000)`, `"2 h 3 min"`},
			{`formatPeriod(60000)`, `"minute"`},
			{`formatPeriod(10000)`, `"10 s"`},
			{`describeLimit({algorithm: "fixed_window", limit: "fixed_window 4/min"})`, `"4/min"`},
			{`describeLimit({algorithm: "gcra", rate: 10, period_ms: 60000, burst: 5})`, `"10 per minute, burst 5"`},
			{`describeLimit({algorithm: "fixed_window", rate: 4, period_ms: 1000, burst: 4})`, `"4 per second"`},
			{`capacity({algorithm: "sliding_window_log", rate: 6, burst: 9})`, `6`},
			{`capacity({algorithm: "token_bucket", rate: 6, burst: 9})`, `9`},
			{`[niceMax(0), niceMax(1), niceMax(3), niceMax(7), niceMax(11), niceMax(200)]`, `[1,1,5,10,20,200]`},
			{`chartBars([1, 0], [1, 2], 100, 10).bars.map(b => [b.ha, b.hd])`, `[[5,5],[0,10]]`},
			{`problemMessage(400, {title: "Bad Request", detail: "malformed JSON"})`, `"Bad Request: malformed JSON"`},
			{`problemMessage(502, null)`, `"HTTP 502"`},
			{`adminMessage(401, null).includes("admin token")`, `true`},
			{`adminMessage(403, null).includes("refused")`, `true`},
			{`breakable("rl.header_match.x-api-key")`, `["rl.","header_","match.","x-","api-","key"]`},
			{`[formatRate(7 / 60), formatRate(35), formatRate(1234.5)]`, `["0.12","35.0","1235"]`},
			{`[formatRatio(3 / 7), formatLatency(0.5), formatLatency(-1), formatLatency(2000)]`, `["42.9%","≤ 0.5 ms","–","> 1 s"]`},
			{`describeStore({store: "redis", mode: "cluster", breaker: "half_open", fallback_active: true})`, `"redis (cluster) · breaker half-open · fallback deciding"`},
			{`describeStore({store: "redis", mode: "cluster", breaker: "closed", fallback_active: false, open_partitions: ["10.0.0.2:6379"]})`, `"redis (cluster) · breaker closed · breaker open for master 10.0.0.2:6379: fallback deciding their keys"`},
			{`describeScope({scope: "fleet", instances: 3}).badge`, `"fleet · 3 instances"`},
			{`describeScope({scope: "instance", instances: 1}).text`, `"this instance only (no shared Redis)"`},
		}
		for _, tt := range tests {
			t.Run(tt.expr, func(t *testing.T) {
				got := eval[string](t, ctx, `(() => {
					const {formatDuration, formatPeriod, capacity, describeLimit, niceMax, chartBars, problemMessage, adminMessage,
						breakable, formatRate, formatRatio, formatLatency, describeStore, describeScope} = sluiceDashboard;
					return JSON.stringify(`+tt.expr+`);
				})()`)
				if got != tt.want {
					t.Errorf("%s = %s, want %s", tt.expr, got, tt.want)
				}
			})
		}
	})

	t.Run("shadow denials drawn apart, the current bar marked", func(t *testing.T) {
		sc := jsCard(shadow.Name) + `.querySelector(".chart")`
		if got := eval[string](t, ctx, sc+`.querySelectorAll("rect.shadow-denied").length + "/" + `+sc+`.querySelectorAll("rect.denied").length`); got != "1/0" {
			t.Errorf("shadow chart: shadow-denied/denied bars %s, want 1/0", got)
		}
		if got := eval[string](t, ctx, jsCard(shadow.Name)+`.querySelector(".tally-denied-label").textContent`); !strings.Contains(got, "would deny") {
			t.Errorf("shadow tally says %q", got)
		}
		// Every bar drawn so far is in the current bucket (the clock is frozen).
		if n := eval[int](t, ctx, chart+`.querySelectorAll("rect.bar:not(.partial)").length`); n != 0 {
			t.Errorf("%d bars of the current bucket not marked partial", n)
		}
		caption := eval[string](t, ctx, jsCard(fixed.Name)+`.querySelector(".chart-caption").textContent`)
		if strings.Contains(caption, "scale") || !strings.Contains(caption, "full height is") || !strings.Contains(caption, "still filling") {
			t.Errorf("caption %q: want the scale and the partial bar explained", caption)
		}
		if got := eval[string](t, ctx, `document.getElementById("reset-all").textContent`); got != "Reset this key" {
			t.Errorf("reset button %q", got)
		}
	})

	t.Run("long names wrap between words", func(t *testing.T) {
		step(t, ctx, "narrow viewport", chromedp.EmulateViewport(360, 740, chromedp.EmulateMobile))
		defer step(t, ctx, "reset viewport", chromedp.ResetViewport())
		waitFor(t, ctx, `window.innerWidth === 360`, `String(window.innerWidth)`)
		title := jsCard(longName) + `.querySelector(".card-title")`
		if got := eval[string](t, ctx, title+`.textContent`); got != longName {
			t.Fatalf("title %q", got)
		}
		// Each piece between break opportunities sits on one line.
		split := eval[[]string](t, ctx, `[...`+title+`.childNodes].filter(n => n.nodeType === 3).filter(n => {
			const r = document.createRange(); r.selectNodeContents(n);
			return new Set([...r.getClientRects()].map(x => Math.round(x.top))).size > 1;
		}).map(n => n.textContent)`)
		if len(split) > 0 {
			t.Errorf("words broken across lines: %q", split)
		}
		if lines := eval[int](t, ctx, `Math.round(`+title+`.getBoundingClientRect().height / parseFloat(getComputedStyle(`+title+`).lineHeight))`); lines < 2 {
			t.Logf("the title fits on %d line at 360px; the check above is then trivial", lines)
		}
	})

	t.Run("overview matches /v1/stats once traffic stops", func(t *testing.T) {
		// Traffic stopped with the last test's burst: wait for one whole
		// refresh after now, then read the page and the API.
		n := eval[int](t, ctx, `Number(document.body.dataset.statsPolls || 0)`)
		waitFor(t, ctx, fmt.Sprintf(`Number(document.body.dataset.statsPolls) >= %d`, n+2), `document.body.dataset.statsPolls`)
		var st struct {
			ConfigVersion uint64             `json:"config_version"`
			Overview      server.Overview    `json:"overview"`
			Store         server.StoreHealth `json:"store"`
		}
		getJSON(t, base+"/v1/stats", "", &st)
		o := st.Overview
		shown := eval[map[string]string](t, ctx, `Object.fromEntries(["scope", "ov-rate", "ov-denied-ratio", "ov-allowed", "ov-denied", "ov-errors", "ov-error-ratio", "store-health", "config-info"].map(id => [id, document.getElementById(id).textContent]))`)
		want := map[string]string{
			"scope": "this instance", "ov-allowed": strconv.FormatInt(o.Allowed, 10), "ov-denied": strconv.FormatInt(o.Denied, 10),
			"ov-rate": fmt.Sprintf("%.2f", o.DecisionsPerSecond), "ov-denied-ratio": fmt.Sprintf("%.1f%%", 100*o.DeniedRatio),
			"ov-errors": strconv.FormatInt(o.Errors, 10), "ov-error-ratio": fmt.Sprintf("%.1f%%", 100*o.ErrorRatio),
			"store-health": "memory",
		}
		for k, v := range want {
			if shown[k] != v {
				t.Errorf("%s shows %q, /v1/stats says %q", k, shown[k], v)
			}
		}
		if !strings.HasPrefix(shown["config-info"], fmt.Sprintf("version %d", st.ConfigVersion)) {
			t.Errorf("config-info %q, want version %d", shown["config-info"], st.ConfigVersion)
		}
		if o.Allowed == 0 || o.Denied == 0 {
			t.Errorf("overview %+v: the bursts above should show", o)
		}
		rows := eval[[][]string](t, ctx, `[...document.querySelectorAll("#policy-figures tbody tr")].map(tr => [...tr.cells].map(td => td.textContent))`)
		if len(rows) != len(o.Policies) {
			t.Fatalf("%d policy rows, /v1/stats has %d", len(rows), len(o.Policies))
		}
		for i, p := range o.Policies {
			if got, want := rows[i][:3], []string{p.Policy, strconv.FormatInt(p.Allowed, 10), strconv.FormatInt(p.Denied, 10)}; !slices.Equal(got, want) {
				t.Errorf("row %d %q, /v1/stats %q", i, got, want)
			}
			if got, want := rows[i][6], strconv.FormatInt(p.Local, 10); !p.InFlight && got != want {
				t.Errorf("row %d: local %q, /v1/stats %q", i, got, want)
			}
			if got, want := rows[i][7], strconv.FormatInt(p.Errors, 10); got != want {
				t.Errorf("row %d: errors %q, /v1/stats %q", i, got, want)
			}
		}
	})

	t.Run("top keys with the admin token", func(t *testing.T) {
		// The token was entered above; the next refresh lists the page's key.
		waitFor(t, ctx, `[...document.querySelectorAll("#top-denials tbody tr")].some(tr => tr.cells[0].textContent === "dashboard")`,
			`document.getElementById("overview").outerHTML`)
		var top struct {
			Denials []server.TopEntry `json:"denials"`
		}
		getJSON(t, base+"/v1/top", adminToken, &top)
		n := eval[int](t, ctx, `Number(document.body.dataset.statsPolls || 0)`)
		waitFor(t, ctx, fmt.Sprintf(`Number(document.body.dataset.statsPolls) >= %d`, n+1), `document.body.dataset.statsPolls`)
		rows := eval[[][]string](t, ctx, `[...document.querySelectorAll("#top-denials tbody tr")].map(tr => [...tr.cells].map(td => td.textContent))`)
		if len(rows) != len(top.Denials) {
			t.Fatalf("%d rows, /v1/top has %d", len(rows), len(top.Denials))
		}
		for i, e := range top.Denials {
			if want := []string{e.Key, e.Policy, strconv.FormatInt(e.Count, 10)}; !slices.Equal(rows[i], want) {
				t.Errorf("row %d %q, /v1/top %q", i, rows[i], want)
			}
		}
		if note := eval[string](t, ctx, `document.getElementById("top-note").textContent`); !strings.Contains(note, "on this instance") {
			t.Errorf("top note %q: want it to say whose keys", note)
		}
	})

	t.Run("config reload adds a card", func(t *testing.T) {
		svc.SetConfig(testConfig(t, "  - name: added\n    limit: sliding_window_log 2/min\n"))
		// The next statistics poll names the new policy and the page
		// reloads its policies.
		waitFor(t, ctx, jsCard("added")+` !== null && document.body.dataset.policies === "`+strconv.Itoa(len(policies)+1)+`"`,
			`document.body.dataset.policies + " " + document.getElementById("status").textContent`)
		if n := len(readResults(t, ctx, fixed.Name)); n != 10 {
			t.Errorf("the unchanged fixed-window card kept %d results, want 10", n)
		}
		if got, want := eval[string](t, ctx, jsCard("added")+`.querySelector(".limit").textContent`), "2/min"; got != want {
			t.Errorf("new card's limit %q, want %q", got, want)
		}
	})

	const added = "  - name: added\n    limit: sliding_window_log 3/min\n"
	t.Run("config reload changes a limit", func(t *testing.T) {
		// The same policy names: only config_version tells of the reload.
		svc.SetConfig(testConfig(t, added))
		waitFor(t, ctx, jsCard("added")+`.querySelector(".limit").textContent === "3/min"`, jsCard("added")+`.outerHTML`)
	})

	const added2 = "  - name: added2\n    limit: 4/min\n"
	t.Run("failed reload is retried", func(t *testing.T) {
		ts.mu.Lock()
		ts.failPolicies = 2
		ts.mu.Unlock()
		svc.SetConfig(testConfig(t, added+added2))
		waitFor(t, ctx, jsCard("added2")+` !== null`, `document.body.dataset.policies + " " + document.getElementById("status").textContent`)
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if ts.failPolicies != 0 {
			t.Errorf("the page reloaded without asking again after a failure (%d failures left)", ts.failPolicies)
		}
	})

	t.Run("reset all while the policies reload", func(t *testing.T) {
		// The reset of "added" is served, then the policy is dropped and the
		// page reloads before the answer arrives; added2, after it, must
		// still be reset.
		step(t, ctx, "click Send Request on added2", chromedp.Click(chromedp.CSS(cardSel("added2")+` button[data-action="send"]`)))
		waitFor(t, ctx, jsCard("added2")+`.querySelectorAll(".result").length === 1`, jsCard("added2")+`.outerHTML`)
		held, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		defer free() // a failure must not leave the server stuck in the hook
		ts.mu.Lock()
		ts.holdReset = map[string]func(){"added": func() {
			close(held)
			<-release
		}}
		ts.mu.Unlock()
		defer func() {
			ts.mu.Lock()
			ts.holdReset = nil
			ts.mu.Unlock()
		}()
		step(t, ctx, "click Reset All", chromedp.Click(chromedp.ID("reset-all")))
		select {
		case <-held:
		case <-time.After(15 * time.Second):
			t.Fatal("no reset of added was sent")
		}
		svc.SetConfig(testConfig(t, added2))
		waitFor(t, ctx, jsCard("added")+` === null`, `document.body.dataset.policies`)
		free()
		waitFor(t, ctx, `document.getElementById("status").dataset.kind === "ok"`, `document.getElementById("status").outerHTML`)
		if n := eval[int](t, ctx, jsCard("added2")+`.querySelectorAll(".result").length`); n != 0 {
			t.Errorf("added2 kept %d results: Reset All stopped at the reload", n)
		}
	})

	t.Run("reset all skips policies that cannot take the key", func(t *testing.T) {
		// An Envoy-format policy first: the page's key is no descriptor of
		// it (400), and the policies after it must still be reset.
		const envoy = "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 50\n---\n"
		cfg, err := config.Parse("dashboard-test.yaml", []byte(envoy+testConfigText(added2)))
		if err != nil {
			t.Fatal(err)
		}
		const envoyName = "edge.remote_address"
		if cfg.Policies[0].Name != envoyName {
			t.Fatalf("first policy %q, want %q", cfg.Policies[0].Name, envoyName)
		}
		svc.SetConfig(cfg)
		waitFor(t, ctx, jsCard(envoyName)+` !== null`, `document.body.dataset.policies`)
		sendOnce := func() {
			step(t, ctx, "click Send Request on added2", chromedp.Click(chromedp.CSS(cardSel("added2")+` button[data-action="send"]`)))
			waitFor(t, ctx, jsCard("added2")+`.querySelectorAll(".result").length === 1`, jsCard("added2")+`.outerHTML`)
		}
		sendOnce()
		step(t, ctx, "click Reset All", chromedp.Click(chromedp.ID("reset-all")))
		waitFor(t, ctx, `document.getElementById("status").textContent.startsWith("Reset key")`, `document.getElementById("status").outerHTML`)
		msg := eval[string](t, ctx, `document.getElementById("status").textContent`)
		if kind := eval[string](t, ctx, `document.getElementById("status").dataset.kind`); kind != "ok" || !strings.Contains(msg, "Skipped 1 policy that cannot take this key: "+envoyName) {
			t.Errorf("status %s %q, want ok naming the skipped %s", kind, msg, envoyName)
		}
		if n := eval[int](t, ctx, jsCard("added2")+`.querySelectorAll(".result").length`); n != 0 {
			t.Errorf("added2 kept %d results: Reset All stopped at the Envoy policy", n)
		}

		// A real failure is reported, and does not stop the rest either.
		sendOnce()
		ts.mu.Lock()
		ts.failReset = map[string]bool{fixed.Name: true}
		ts.mu.Unlock()
		defer func() {
			ts.mu.Lock()
			ts.failReset = nil
			ts.mu.Unlock()
		}()
		step(t, ctx, "click Reset All", chromedp.Click(chromedp.ID("reset-all")))
		waitFor(t, ctx, `document.getElementById("status").dataset.kind === "error"`, `document.getElementById("status").outerHTML`)
		msg = eval[string](t, ctx, `document.getElementById("status").textContent`)
		if !strings.Contains(msg, "Reset failed for 1 policy: "+fixed.Name) || !strings.Contains(msg, "failing on purpose") || !strings.Contains(msg, envoyName) {
			t.Errorf("status %q, want the failure of %s and the skipped %s", msg, fixed.Name, envoyName)
		}
		if n := eval[int](t, ctx, jsCard("added2")+`.querySelectorAll(".result").length`); n != 0 {
			t.Errorf("added2 kept %d results after a failure elsewhere", n)
		}
	})

	if p := logs.problems(); len(p) > 0 {
		t.Errorf("browser console reported problems:\n%s", strings.Join(p, "\n"))
	}
}

// getJSON decodes a GET of url, with the admin token when one is given.
func getJSON(t *testing.T, url, token string, v any) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
