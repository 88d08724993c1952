package server

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

const topConfig = `
policies:
  - name: login
    limit: fixed_window 2/min
  - name: partner
    limit: fixed_window 2/min
    expose_keys: true
`

// check takes one unit and fails the test on an error.
func check(t testing.TB, svc *Service, policy, key string) Result {
	t.Helper()
	r, err := svc.Check(context.Background(), policy, key, 1)
	if err != nil {
		t.Fatalf("check %s %s: %v", policy, key, err)
	}
	return r
}

// The sketch stays within TopCounters however many keys are denied, and the
// heavy hitters hidden among thousands of one-off keys come out on top with
// counts that bound the truth: Count-Overcount <= true <= Count.
func TestTopSketchBoundedAndExact(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	tk := newTopKeys(clock.Now)
	deny := func(key string) {
		tk.record("p", key, sluice.Decision{Allowed: false})
	}
	heavy := map[string]int64{"bot-a": 900, "bot-b": 600, "bot-c": 300}
	rng := rand.New(rand.NewPCG(1, 2))
	var plan []string
	for k, n := range heavy {
		for range n {
			plan = append(plan, k)
		}
	}
	for i := range 20000 {
		plan = append(plan, fmt.Sprintf("one-off-%d", i))
	}
	rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	for _, k := range plan {
		deny(k)
	}
	tk.mu.Lock()
	size := len(tk.cur[listDenials].counters)
	tk.mu.Unlock()
	if size > TopCounters {
		t.Fatalf("sketch holds %d counters, want at most %d", size, TopCounters)
	}
	got := tk.Lists(3).Denials
	want := []string{"bot-a", "bot-b", "bot-c"}
	for i, e := range got {
		if e.Key != want[i] {
			t.Fatalf("top 3 = %+v, want %v", got, want)
		}
		if n := heavy[e.Key]; e.Count < n || e.Count-e.Overcount > n {
			t.Errorf("%s: count %d overcount %d does not bound the true %d", e.Key, e.Count, e.Overcount, n)
		}
	}
}

// A decision far from its limit is not tracked; one at or near it is, in
// the near-limit list, and a denial in both, with its utilisation.
func TestTopNearLimitAndDenials(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	svc := newMemService(t, `
policies:
  - name: api
    limit: fixed_window 10/min
`, clock)
	for range 5 {
		check(t, svc, "api", "calm") // 5 of 10: far from the limit
	}
	for range 12 {
		check(t, svc, "api", "busy") // 8 and up are near, 11 and 12 denied
	}
	l := svc.mon.top.Lists(TopN)
	if len(l.Denials) != 1 || l.Denials[0].Key != "busy" || l.Denials[0].Count != 2 || l.Denials[0].Utilisation != 1 {
		t.Errorf("denials = %+v, want busy ×2 at utilisation 1", l.Denials)
	}
	if len(l.NearLimit) != 1 || l.NearLimit[0].Key != "busy" || l.NearLimit[0].Count != 5 {
		t.Errorf("near limit = %+v, want busy ×5 (8/10, 9/10, 10/10 and two denials)", l.NearLimit)
	}
}

// A key of megabytes (an Envoy descriptor value may be) is held and listed
// clipped, so the sketch, /v1/top and the fleet's reports stay small; keys
// sharing their first bytes keep entries of their own.
func TestTopKeyClipped(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	svc := newMemService(t, `
policies:
  - name: api
    limit: fixed_window 1/min
`, clock)
	huge := strings.Repeat("x", 1<<20)
	for _, k := range []string{huge + "a", huge + "b", huge + "a"} {
		check(t, svc, "api", k)
	}
	l := svc.mon.top.Lists(TopN)
	if len(l.NearLimit) != 2 {
		t.Fatalf("near limit has %d entries, want 2", len(l.NearLimit))
	}
	for _, e := range l.NearLimit {
		if len(e.Key) > MaxTopKey+100 || !strings.HasPrefix(e.Key, huge[:MaxTopKey]+"…sha256:") {
			t.Errorf("entry of %d bytes (%.40q…), want the first %d bytes and a hash", len(e.Key), e.Key, MaxTopKey)
		}
	}
	if l.NearLimit[0].Key == l.NearLimit[1].Key {
		t.Errorf("two long keys share the entry %.40q…", l.NearLimit[0].Key)
	}
}

// Lists cover the current window and the one before; older counts go.
func TestTopWindow(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	tk := newTopKeys(clock.Now)
	for _, step := range []struct {
		at   int64 // windows after t0
		deny bool
		want int64 // bot's count after the step
	}{
		{0, true, 1},
		{0, true, 2},
		{1, true, 3}, // the previous window still counts
		{2, false, 1},
		{4, false, 0}, // both windows gone after a gap
	} {
		clock.Set(t0.Add(time.Duration(step.at) * TopWindow))
		if step.deny {
			tk.record("p", "bot", sluice.Decision{})
		}
		var got int64
		if l := tk.Lists(TopN).Denials; len(l) > 0 {
			got = l[0].Count
		}
		if got != step.want {
			t.Errorf("window %d: count %d, want %d", step.at, got, step.want)
		}
	}
}

// The metric names a key only for a policy that opts in; others carry a
// stable hash prefix, and only the top N keys ever appear.
func TestTopCollector(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	svc := newMemService(t, topConfig, clock)
	for i := range TopN + 10 {
		for range 3 {
			check(t, svc, "login", fmt.Sprintf("10.0.0.%d", i))
		}
	}
	for range 5 {
		check(t, svc, "partner", "acme") // denied most, so listed
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newTopCollector(svc))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var series int
	for _, mf := range mfs {
		if mf.GetName() != "sluice_top_key_denials" {
			continue
		}
		for _, m := range mf.GetMetric() {
			series++
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch key := labels["key"]; labels["policy"] {
			case "partner":
				if key != "acme" {
					t.Errorf("partner opts in: key label %q, want acme", key)
				}
			case "login":
				if !strings.HasPrefix(key, "hmac:") || len(key) != len("hmac:")+12 || strings.Contains(key, "10.0.0") {
					t.Errorf("login's key label %q: want a 12-digit keyed hash", key)
				}
			}
		}
	}
	if series != TopN {
		t.Errorf("%d denial series, want the top %d only", series, TopN)
	}
	if got, want := svc.keyLabels.label(nil, "10.0.0.1"), svc.keyLabels.label(nil, "10.0.0.1"); got != want {
		t.Errorf("hash not stable: %s, %s", got, want)
	}
}

// A hashed label is an HMAC under the service's secret: instances given
// one secret agree, and without the secret the label cannot be recomputed
// from a dictionary of likely keys, as a bare SHA-256 could.
func TestKeyLabelsKeyed(t *testing.T) {
	t.Parallel()
	const key = "+15558675309"
	secret := []byte("0123456789abcdef0123456789abcdef")
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(key))
	want := "hmac:" + hex.EncodeToString(mac.Sum(nil)[:6])
	a, b := newKeyLabels(secret), newKeyLabels(slices.Clone(secret))
	if got := a.label(nil, key); got != want || b.label(nil, key) != want {
		t.Errorf("label %q, %q; want %q for both", got, b.label(nil, key), want)
	}
	bare := sha256.Sum256([]byte(key))
	if got := a.label(nil, key); strings.Contains(got, hex.EncodeToString(bare[:6])) {
		t.Errorf("label %q holds the key's bare SHA-256 prefix", got)
	}
	// Without a secret each gets a random one of its own.
	r1, r2 := newKeyLabels(nil), newKeyLabels(nil)
	if l1, l2 := r1.label(nil, key), r2.label(nil, key); l1 == l2 || l1 == want || !strings.HasPrefix(l1, "hmac:") {
		t.Errorf("random secrets: labels %q, %q; want two different hmac: labels", l1, l2)
	}
	// The secret is copied: a caller reusing its buffer changes nothing.
	secret[0] ^= 1
	if got := a.label(nil, key); got != want {
		t.Errorf("label after the caller changed its secret: %q, want %q", got, want)
	}
}

// A policy a reload removes leaves the top lists at once, with its other
// series, in both generations; the policies that stay keep their counts.
func TestTopForgetsRemovedPolicy(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	svc := newMemService(t, `
policies:
  - name: api
    limit: fixed_window 3/min
  - name: gone
    limit: fixed_window 3/min
`, clock)
	for range 5 {
		check(t, svc, "gone", "k") // 2 denials
	}
	clock.Advance(TopWindow) // the previous generation now holds them
	for range 5 {
		check(t, svc, "gone", "k")
		check(t, svc, "api", "k")
	}
	svc.SetConfig(mustConfig(t, `
policies:
  - name: api
    limit: fixed_window 3/min
`))
	l := svc.mon.top.Lists(TopN)
	for _, e := range append(l.Denials, l.NearLimit...) {
		if e.Policy == "gone" {
			t.Errorf("%+v still listed after its policy was removed", e)
		}
	}
	if len(l.Denials) != 1 || l.Denials[0].Policy != "api" || l.Denials[0].Count != 2 {
		t.Errorf("denials = %+v, want api's k ×2", l.Denials)
	}
}

// An exposed key longer than MaxExposedKey shows its first bytes, ending
// on a whole character, and its keyed hash: a client's 60 KB key must not
// make every scrape carry it.
func TestExposedKeyClipped(t *testing.T) {
	t.Parallel()
	p := mustConfig(t, topConfig).Policy("partner")
	k := newKeyLabels([]byte("0123456789abcdef0123456789abcdef"))
	short := strings.Repeat("k", MaxExposedKey)
	if got := k.label(p, short); got != short {
		t.Errorf("a key of %d bytes: label %q, want it whole", len(short), got)
	}
	long := strings.Repeat("k", MaxExposedKey+1)
	if got, want := k.label(p, long), strings.Repeat("k", ExposedKeyPrefix)+"…"+k.hash(long); got != want {
		t.Errorf("a key of %d bytes: label %q, want %q", len(long), got, want)
	}
	// "€" is 3 bytes: the prefix stops before the one byte 96 falls in.
	euros := "a" + strings.Repeat("€", 60)
	got := k.label(p, euros)
	if want := euros[:94] + "…" + k.hash(euros); got != want || !utf8.ValidString(got) {
		t.Errorf("multi-byte key: label %q, want %q (valid UTF-8)", got, want)
	}
	// Long keys sharing their first bytes still get labels of their own.
	huge := strings.Repeat("x", 60_000)
	a, b := k.label(p, huge+"a"), k.label(p, huge+"b")
	if a == b || len(a) > MaxExposedKey || len(b) > MaxExposedKey || a != k.label(p, huge+"a") {
		t.Errorf("60 KB keys: labels %q, %q; want two stable labels of at most %d bytes", a, b, MaxExposedKey)
	}
}

// Through a real listener: /metrics keeps its lines short however long the
// exposed keys that clients send.
func TestExposedKeyClippedInMetrics(t *testing.T) {
	cfg := writeConfig(t, "policies:\n  - name: otp\n    limit: fixed_window 1/min\n    expose_keys: true\n")
	srv := runServer(t, Options{ConfigFile: cfg, KeyHashSecret: "0123456789abcdef0123456789abcdef"})
	p := &proc{http: srv.HTTPAddr()}
	key := strings.Repeat("x", 60_000)
	for i, want := range []int{200, 429} {
		if code, m := p.post(t, "/v1/check", `{"policy":"otp","key":"`+key+`"}`); code != want {
			t.Fatalf("check %d: %d %v, want %d", i+1, code, m, want)
		}
	}
	code, metrics := p.get(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	want := `sluice_top_key_denials{key="` + strings.Repeat("x", ExposedKeyPrefix) + "…" + srv.Service().keyLabels.hash(clipTopKey(key)) + `",policy="otp"} 1`
	if !strings.Contains(metrics, want) {
		t.Errorf("no line %s in /metrics", want)
	}
	for line := range strings.Lines(metrics) {
		if len(line) > 1000 {
			t.Errorf("a /metrics line of %d bytes: %.200s…", len(line), line)
		}
	}
}

// No key can be sent as another key's clipped label: a key holding the
// clip marker, control characters or invalid UTF-8 is clipped too, its
// prefix stopping before them.
func TestExposedKeyLabelUnforgeable(t *testing.T) {
	t.Parallel()
	p := mustConfig(t, topConfig).Policy("partner")
	k := newKeyLabels([]byte("0123456789abcdef0123456789abcdef"))
	long := strings.Repeat("A", 95) + "é" + strings.Repeat("B", 200)
	forged := k.label(p, long)
	if got := k.label(p, forged); got == forged || got != strings.Repeat("A", 95)+"…"+k.hash(forged) {
		t.Errorf("the label %q sent as a key: label %q, want it clipped at its marker", forged, got)
	}
	for key, want := range map[string]string{
		"a…b":            "a…" + k.hash("a…b"),
		"line\nbreak":    "line…" + k.hash("line\nbreak"),
		"esc\x1b[31m":    "esc…" + k.hash("esc\x1b[31m"),
		"bad\xffutf8":    "bad…" + k.hash("bad\xffutf8"),
		"ok \ufffd é 東京": "ok \ufffd é 東京",
	} {
		got := k.label(p, key)
		if got != want || !utf8.ValidString(got) {
			t.Errorf("key %q: label %q, want %q (valid UTF-8)", key, got, want)
		}
	}
}

// Through a real listener (review repro): a client sending a long key's
// clipped label as its own key gets a series of its own, and the long
// key's series stays on /metrics.
func TestExposedKeyLabelForgeryInMetrics(t *testing.T) {
	cfg := writeConfig(t, "policies:\n  - name: otp\n    limit: fixed_window 1/min\n    expose_keys: true\n")
	srv := runServer(t, Options{ConfigFile: cfg, KeyHashSecret: "0123456789abcdef0123456789abcdef"})
	p := &proc{http: srv.HTTPAddr()}
	check := func(key string, n int) {
		t.Helper()
		for i := range n {
			want := 429
			if i == 0 {
				want = 200
			}
			if code, m := p.post(t, "/v1/check", `{"policy":"otp","key":"`+key+`"}`); code != want {
				t.Fatalf("check %d of %.20q: %d %v, want %d", i+1, key, code, m, want)
			}
		}
	}
	long := strings.Repeat("A", 95) + "é" + strings.Repeat("B", 200)
	check(long, 3)
	forged := srv.Service().keyLabels.label(srv.Service().Config().Policy("otp"), long)
	check(forged, 6)
	_, metrics := p.get(t, "/metrics")
	var lines []string
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, "sluice_top_key_denials{") {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	want := `sluice_top_key_denials{key="` + forged + `",policy="otp"} 2`
	if len(lines) != 2 || !slices.Contains(lines, want) {
		t.Errorf("top-key denials on /metrics:\n%s\nwant two series, one of them %s", strings.Join(lines, "\n"), want)
	}
}
