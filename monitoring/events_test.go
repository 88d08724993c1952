package monitoring

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server"
)

// alertsNamed returns alerts.yaml's alert name, failing t unless there is
// exactly one.
func alertsNamed(t *testing.T, name string) []alertRule {
	t.Helper()
	var out []alertRule
	for _, a := range alertRules(t) {
		if a.name == name {
			out = append(out, a)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%d %s alerts in %s", len(out), name, alertsFile)
	}
	return out
}

// writeConfig writes a configuration file for a serve.
func writeConfig(t *testing.T, cfg string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(f, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDenialRatioJumpFires drives SluiceDenialRatioJump with real
// decisions on a serve over a private Redis: two policies take the same
// steady traffic, a few percent of it denied, for two hours of scrapes
// (one a minute); then one key of one policy starts asking 100 times a
// minute past its limit. The alert must fire for that policy, after its
// for:, and stay quiet for the other, and for both before the jump.
func TestDenialRatioJumpFires(t *testing.T) {
	alert := alertsNamed(t, "SluiceDenialRatioJump")
	r := redistest.StartServer(t)
	cfg := writeConfig(t, `
policies:
  - name: api
    key: "{user}"
    limit: 2/min
  - name: quiet
    key: "{user}/{route}"
    limit: 2/min
`)
	srv := startServe(t, server.Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr, FleetSize: 1})
	addr := srv.HTTPAddr()
	check := func(policy, key string, want int) {
		t.Helper()
		if code, body := post(t, addr, "/v1/check", fmt.Sprintf(`{"policy":%q,"key":%q}`, policy, key)); code != want {
			t.Fatalf("check %s %s: %d %s, want %d", policy, key, code, body, want)
		}
	}
	// Each minute's traffic: 10 keys asking twice (their limit) and one
	// asking a third time, denied: 1 in 21 (4.8 %) of each policy's
	// decisions. The test runs in seconds, so no key's limit refills.
	steady := func(step int) {
		for _, policy := range []string{"api", "quiet"} {
			for k := range 10 {
				key := fmt.Sprintf("u%d-%d", step, k)
				check(policy, key, http.StatusOK)
				check(policy, key, http.StatusOK)
				if k == 0 {
					check(policy, key, http.StatusTooManyRequests)
				}
			}
		}
	}
	const (
		before = 125 // minutes of steady traffic: the alert compares with the hour an hour ago
		jump   = 20  // minutes of the jump: its for: is 10m, its rates' range 5m
	)
	// abuser's limit is spent before the scrapes: each of its checks in
	// the jump is a denial.
	check("api", "abuser", http.StatusOK)
	check("api", "abuser", http.StatusOK)
	scrapes := [][]sample{scrape(t, addr)}
	for step := range before + jump {
		steady(step)
		if step >= before {
			// The jump: an abusive client, 100 denials a minute.
			for range 100 {
				check("api", "abuser", http.StatusTooManyRequests)
			}
		}
		scrapes = append(scrapes, scrape(t, addr))
	}
	got := firings(t, alert, 1, scrapes...)
	for _, f := range got {
		if policy := f.labels.Get("policy"); policy != "api" || f.at <= before {
			t.Errorf("SluiceDenialRatioJump fired for policy %q at minute %d (the jump starts at %d)", policy, f.at, before+1)
		} else {
			t.Logf("SluiceDenialRatioJump fired for policy api at minute %d, %d into the jump", f.at, f.at-before)
		}
	}
	if !slices.ContainsFunc(got, func(f fired) bool { return f.labels.Get("policy") == "api" }) {
		t.Error("SluiceDenialRatioJump did not fire for policy api's jump")
	}
}

// TestFleetSlotNotesDroppedFires drives SluiceFleetSlotNotesDropped with
// real processes: two serves over one Redis, the second connecting as an
// ACL user that may not PUBLISH. A slot acquired through the first and
// released through the second is a note the second cannot send: the
// alert must fire for the second. A slot acquired and released through the
// second alone sends no note: the alert stays quiet.
func TestFleetSlotNotesDroppedFires(t *testing.T) {
	alert := alertsNamed(t, "SluiceFleetSlotNotesDropped")
	r := redistest.StartServer(t)
	if err := r.Client(t).Do(context.Background(), "ACL", "SETUSER", "nopublish", "on", ">secret", "~*", "&*", "+@all", "-publish").Err(); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, "policies:\n  - name: jobs\n    in_flight: {max: 10, hold: 60s}\n")
	a := startServe(t, server.Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr, FleetSize: 2}).HTTPAddr()
	b := startServe(t, server.Options{ConfigFile: cfg, RedisURL: "redis://nopublish:secret@" + r.Addr, FleetSize: 2}).HTTPAddr()
	acquire := func(at string) string {
		t.Helper()
		code, body := post(t, at, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
		if code != http.StatusOK {
			t.Fatalf("acquire through %s: %d %s", at, code, body)
		}
		var acq struct{ Token any }
		if err := json.Unmarshal([]byte(body), &acq); err != nil {
			t.Fatal(err)
		}
		tok, _ := json.Marshal(map[string]any{"token": acq.Token})
		return string(tok)
	}
	release := func(at, tok string) {
		t.Helper()
		if code, body := post(t, at, "/v1/release", tok); code != http.StatusNoContent {
			t.Fatalf("release through %s: %d %s", at, code, body)
		}
	}
	dropped := func() float64 {
		for _, s := range scrape(t, b) {
			if s.lbls.Get("__name__") == "sluice_fleet_slot_notes_dropped_total" {
				return s.v
			}
		}
		t.Fatal("b exports no sluice_fleet_slot_notes_dropped_total")
		return 0
	}

	start := scrape(t, b)
	release(b, acquire(b))
	quiet := scrape(t, b)
	if fired, _ := firing(t, alert, start, quiet); len(fired) > 0 {
		t.Errorf("%v fired for a slot released where it was acquired", fired)
	}
	release(b, acquire(a))
	await(t, "b's note dropped", func() bool { return dropped() > 0 })
	fired, early := firing(t, alert, start, quiet, scrape(t, b))
	if len(early) > 0 {
		t.Errorf("%v fired before the note was dropped", early)
	}
	if len(fired) != 1 {
		t.Errorf("SluiceFleetSlotNotesDropped did not fire for b's dropped note")
	}
}
