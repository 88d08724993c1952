package browsertest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/server"
)

// TestBrowserHealthBanner: the page shows the service's own health from
// /v1/status as a banner, and hides Reset All when admin endpoints are
// disabled.
func TestBrowserHealthBanner(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	ready := func(context.Context) error {
		if down.Load() {
			return errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
		}
		return nil
	}
	_, ts := serveDashboard(t, "", &server.HandlerOptions{AdminDisabled: true, Ready: ready})

	ctx, logs := newBrowser(t)
	step(t, ctx, "open the dashboard", chromedp.Navigate(ts.URL+"/"))
	waitFor(t, ctx, `document.body.dataset.health === "not-ready"`, `document.body.innerText`)
	banner := eval[string](t, ctx, `document.getElementById("health").innerText`)
	if !strings.HasPrefix(banner, "Not ready:") || !strings.Contains(banner, "connection refused") {
		t.Errorf("banner %q: want it to say not ready and why", banner)
	}
	if eval[bool](t, ctx, `document.getElementById("reset-all").offsetParent !== null`) {
		t.Error("Reset All is shown while admin endpoints are disabled")
	}
	if !eval[bool](t, ctx, `document.getElementById("reset-off").offsetParent !== null`) {
		t.Error("no note saying Reset is disabled")
	}
	// No token can show the top keys: the note does not ask for one.
	waitFor(t, ctx, `document.getElementById("top-note").textContent.includes("--admin-token")`,
		`document.getElementById("top-note").textContent`)

	down.Store(false)
	waitFor(t, ctx, `document.body.dataset.health === "ok"`, `document.body.innerText`)
	if eval[bool](t, ctx, `document.getElementById("health").offsetParent !== null`) {
		t.Error("banner still shown with the store back")
	}
	if p := logs.problems(); len(p) > 0 {
		t.Errorf("console problems: %v", p)
	}
}

// TestBrowserDecisionToken: with a decision token the page's first looks
// are refused; once the token is typed in, the cards look again, without a
// click.
func TestBrowserDecisionToken(t *testing.T) {
	_, ts := serveDashboard(t, "", &server.HandlerOptions{DecisionToken: "dec-token"})
	ctx, _ := newBrowser(t) // the refused looks are console errors, on purpose
	step(t, ctx, "open the dashboard", chromedp.Navigate(ts.URL+"/"))
	waitFor(t, ctx, `document.body.dataset.ready === "true"`, `document.body.innerText`)
	remaining := `document.querySelector(".card .remaining-now").textContent`
	if got := eval[string](t, ctx, remaining); strings.Contains(got, " of ") {
		t.Fatalf("remaining %q without the decision token", got)
	}
	step(t, ctx, "type the token", chromedp.SendKeys(chromedp.ID("admin-token"), "dec-token"))
	waitFor(t, ctx, remaining+`.includes(" of ")`, remaining)
}

// TestBrowserConfigRejected: a rejected reload of `sluice serve`'s file
// shows above the overview, with the error's file:line:column and the
// version still in force, and in the configuration tile; the next good
// reload takes it away.
func TestBrowserConfigRejected(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n  - name: a\n    limit: 5/min\n")
	srv, err := server.New(server.Options{ConfigFile: file, HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0",
		WatchInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })

	ctx, logs := newBrowser(t)
	step(t, ctx, "open the dashboard", chromedp.Navigate("http://"+srv.HTTPAddr()+"/"))
	waitFor(t, ctx, `document.body.dataset.config === "ok" && document.getElementById("config-info").textContent.startsWith("version 1")`, `document.body.innerText`)
	if eval[bool](t, ctx, `document.getElementById("config-rejected").offsetParent !== null`) {
		t.Error("a rejection shown before any reload")
	}

	write("policies:\n  - name: a\n    limit: 5/fortnight\n")
	if err := srv.Reload(); err == nil {
		t.Fatal("a bad configuration reloaded")
	}
	waitFor(t, ctx, `document.body.dataset.config === "rejected" && document.getElementById("config-info").textContent.includes("reload rejected")`,
		`document.body.innerText`)
	if !eval[bool](t, ctx, `document.getElementById("config-rejected").offsetParent !== null`) {
		t.Error("the rejection is not shown")
	}
	banner := eval[string](t, ctx, `document.getElementById("config-rejected").innerText`)
	for _, want := range []string{"Configuration reload rejected at ", "still serving version 1, loaded ", file + ":3:12: ", "fortnight"} {
		if !strings.Contains(banner, want) {
			t.Errorf("rejection %q lacks %q", banner, want)
		}
	}
	// Not a health problem: the configuration in force still decides.
	if h := eval[string](t, ctx, `document.body.dataset.health`); h != "ok" {
		t.Errorf("health %q with a rejected reload, want ok", h)
	}

	write("policies:\n  - name: a\n    limit: 7/min\n")
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, `document.body.dataset.config === "ok" && document.getElementById("config-info").textContent.startsWith("version 2") && !document.getElementById("config-info").textContent.includes("rejected")`,
		`document.body.innerText`)
	if eval[bool](t, ctx, `document.getElementById("config-rejected").offsetParent !== null`) {
		t.Error("the rejection still shown after a good reload")
	}
	if p := logs.problems(); len(p) > 0 {
		t.Errorf("console problems: %v", p)
	}
}
