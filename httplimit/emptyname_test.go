package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// A key function given no name fails every request with ErrKey and
// ErrInvalidConfig (a 500), and PriorityHeader refuses it: before, a
// header or cookie named "" was never found, so the rule never applied
// and the route ran unlimited without a word.
func TestEmptyNamesRefused(t *testing.T) {
	t.Parallel()
	for name, key := range map[string]KeyFunc{"Header": Header(""), "Header blank": Header(" "), "Cookie": Cookie("")} {
		var got error
		m, err := New(memory.New(nil), []Rule{{Name: "r", Limit: sluice.PerMinute(1), Key: key}},
			&Options{ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
				got = err
				w.WriteHeader(http.StatusInternalServerError)
			}})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Key", "k")
		m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, req)
		if rec.Code != http.StatusInternalServerError || !errors.Is(got, ErrKey) || !errors.Is(got, ErrInvalidConfig) {
			t.Errorf("%s(\"\"): %d, %v; want 500, ErrKey and ErrInvalidConfig", name, rec.Code, got)
		}
	}
	if _, err := PriorityHeader("", nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("PriorityHeader(\"\") = %v, want ErrInvalidConfig", err)
	}
}
