package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
)

// Every construction error wraps the package's ErrInvalidConfig.
func TestConstructorErrorsWrapErrInvalidConfig(t *testing.T) {
	if _, err := httplimit.ClientIP(&httplimit.IPOptions{TrustedProxies: []string{"10.0.0.0/33"}}); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("httplimit.ClientIP(bad CIDR): %v", err)
	}
	if _, err := httplimit.ClientIP(&httplimit.IPOptions{Header: "X-Real-IP"}); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("httplimit.ClientIP(bad header): %v", err)
	}
	if _, err := grpclimit.ClientIP(&grpclimit.IPOptions{TrustedProxies: []string{"bad"}}); !errors.Is(err, grpclimit.ErrInvalidConfig) {
		t.Errorf("grpclimit.ClientIP(bad CIDR): %v", err)
	}
	if _, err := httplimit.ParseStrategy("nope"); !errors.Is(err, httplimit.ErrInvalidConfig) {
		t.Errorf("httplimit.ParseStrategy: %v", err)
	}
}

// A bad client IP configuration says "httplimit:" once, not per wrapping.
func TestClientIPErrorPrefixOnce(t *testing.T) {
	_, err := httplimit.ClientIP(&httplimit.IPOptions{IPv4Prefix: 40})
	if !errors.Is(err, httplimit.ErrInvalidConfig) || strings.Count(err.Error(), "httplimit:") != 1 || !strings.Contains(err.Error(), "IPv4 prefix /40") {
		t.Fatalf("err = %v, want ErrInvalidConfig naming the prefix, with one httplimit: prefix", err)
	}
}

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
