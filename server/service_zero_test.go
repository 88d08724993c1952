package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestZeroService: a Service not built by NewService refuses with
// ErrZeroService (503 over HTTP, UNAVAILABLE over RLS) and never panics.
func TestZeroService(t *testing.T) {
	var s Service
	ctx := context.Background()
	if _, err := s.Check(ctx, "p", "k", 1); !errors.Is(err, ErrZeroService) {
		t.Errorf("Check: %v, want ErrZeroService", err)
	}
	if _, err := s.Look(ctx, "p", "k"); !errors.Is(err, ErrZeroService) {
		t.Errorf("Look: %v, want ErrZeroService", err)
	}
	if _, err := s.Peek(ctx, "p", "k", 1); !errors.Is(err, ErrZeroService) {
		t.Errorf("Peek: %v, want ErrZeroService", err)
	}
	if err := s.Reset(ctx, "p", "k"); !errors.Is(err, ErrZeroService) {
		t.Errorf("Reset: %v, want ErrZeroService", err)
	}
	s.SetConfig(mustConfig(t, apiConfig))
	if n := len(s.Config().Policies); n != 0 || s.ConfigVersion() != 0 {
		t.Errorf("config after SetConfig on a zero Service: %d policies, version %d", n, s.ConfigVersion())
	}
	_ = s.Stats().Snapshot()
	rec := httptest.NewRecorder()
	s.Handler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/v1/stats", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("handler: %d, want 503", rec.Code)
	}
	_, err := rlsServer{svc: &s}.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d"})
	if status.Code(err) != codes.Unavailable {
		t.Errorf("RLS: %v, want UNAVAILABLE", err)
	}
}
