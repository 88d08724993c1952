package browsertest

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/server/dashboard"
)

// TestBrowserInFlight: an in-flight policy's card shows its held slots
// live, without a playground, and the overview's Held column follows
// acquires and releases made through the JSON API.
func TestBrowserInFlight(t *testing.T) {
	svc, ts := serveDashboard(t, "  - name: exports\n    in_flight: {max: 10, hold: 1m, reserve: {critical: 0.2}}\n",
		&server.HandlerOptions{AdminToken: adminToken})

	ctx, logs := newBrowser(t)
	step(t, ctx, "open the dashboard", chromedp.Navigate(ts.URL+"/"))
	waitFor(t, ctx, `document.body.dataset.ready === "true" && `+jsCard("exports")+` !== null`, `document.body.innerText`)
	card := jsCard("exports")
	if got := eval[string](t, ctx, card+`.querySelector(".algorithm").textContent`); got != "in flight" {
		t.Errorf("badge %q, want in flight", got)
	}
	if eval[bool](t, ctx, card+`.querySelector(".actions").offsetParent !== null`) {
		t.Error("the in-flight card offers the rate playground")
	}
	heldRow := `[...document.querySelectorAll("#policy-figures tbody tr")].find(tr => tr.cells[0].textContent === "exports")`
	waitFor(t, ctx, card+`.querySelector(".held-now").textContent === "0 of 10" && `+heldRow+`?.cells[5].textContent === "0"`, card+`.outerHTML`)

	var tokens []string
	for _, w := range []int64{3, 4} {
		res, err := svc.Acquire(context.Background(), "exports", "ann", w, sluice.PriorityCritical)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire %d: %+v, %v", w, res.Decision, err)
		}
		tokens = append(tokens, res.Token)
	}
	waitFor(t, ctx, card+`.querySelector(".held-now").textContent === "7 of 10" && `+heldRow+`.cells[5].textContent === "7"`, card+`.outerHTML`)
	if err := svc.Release(context.Background(), tokens[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, card+`.dataset.held === "4" && `+heldRow+`.cells[5].textContent === "4"`, card+`.outerHTML`)
	// A rate policy's row has no held figure.
	if got := eval[string](t, ctx, `[...document.querySelectorAll("#policy-figures tbody tr")].find(tr => tr.cells[0].textContent === "vip").cells[5].textContent`); got != "\u2013" {
		t.Errorf("a rate policy's Held cell %q, want a dash", got)
	}
	if p := logs.problems(); len(p) > 0 {
		t.Errorf("console problems: %v", p)
	}
}

// serveDashboard serves a Service on testConfig(extra), on a memory store
// frozen at t0, with the dashboard and opts.
func serveDashboard(t *testing.T, extra string, opts *server.HandlerOptions) (*server.Service, *httptest.Server) {
	t.Helper()
	clock := func() time.Time { return t0 }
	store := memory.New(&memory.Options{Clock: clock, SweepInterval: -1})
	t.Cleanup(func() { _ = store.Close() })
	svc := server.NewService(store, testConfig(t, extra), &server.ServiceOptions{Clock: clock})
	opts.Dashboard = dashboard.Handler()
	ts := httptest.NewServer(svc.Handler(opts))
	t.Cleanup(ts.Close)
	return svc, ts
}
