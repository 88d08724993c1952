package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
)

// A Shadow rule never blocks: its key failing or a cost out of range is
// observed, and the request goes on under the enforcing rules.
func TestShadowRuleNeverBlocks(t *testing.T) {
	for name, dry := range map[string]httplimit.Rule{
		"key error": {Name: "dry", Limit: sluice.PerSecond(5), Strategy: httplimit.Shadow,
			Key: func(*http.Request) (string, error) { return "", errors.New("no tenant yet") }},
		"cost over capacity": {Name: "dry", Limit: sluice.PerSecond(5), Strategy: httplimit.Shadow,
			Key: httplimit.PeerIP(), Cost: func(*http.Request) int64 { return 10 }},
		"cost below one": {Name: "dry", Limit: sluice.PerSecond(5), Strategy: httplimit.Shadow,
			Key: httplimit.PeerIP(), Cost: func(*http.Request) int64 { return 0 }},
	} {
		store := memory.New(nil)
		mw, err := httplimit.New(store, []httplimit.Rule{
			{Name: "enforced", Limit: sluice.PerSecond(100), Key: httplimit.PeerIP()}, dry,
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		w := httptest.NewRecorder()
		mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Errorf("%s in a Shadow rule: %d %s; want 200", name, w.Code, w.Body)
		}
		store.Close()
	}
}
