package browsertest

import (
	"context"
	"errors"
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
