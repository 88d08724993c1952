package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// TestNewServiceNilStore: a Service given a nil store refuses every
// decision with ErrStoreNotBuilt rather than panicking on the request.
func TestNewServiceNilStore(t *testing.T) {
	s := NewService(nil, DemoConfig(), nil)
	ctx := context.Background()
	p := DemoConfig().Policies[0].Name
	if _, err := s.Check(ctx, p, "k", 1); !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("Check: %v, want ErrStoreNotBuilt", err)
	}
	if _, err := s.Look(ctx, p, "k"); !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("Look: %v, want ErrStoreNotBuilt", err)
	}
	if _, err := s.Peek(ctx, p, "k", 1); !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("Peek: %v, want ErrStoreNotBuilt", err)
	}
	if err := s.Reset(ctx, p, "k"); !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("Reset: %v, want ErrStoreNotBuilt", err)
	}
}

// TestServiceNilConfig: a nil configuration is an empty one, at NewService
// and at SetConfig (a reload), not a panic.
func TestServiceNilConfig(t *testing.T) {
	m := memory.New(nil)
	defer m.Close()
	s := NewService(m, nil, nil)
	if n := len(s.Config().Policies); n != 0 {
		t.Fatalf("%d policies, want none", n)
	}
	if _, err := s.Check(context.Background(), "p", "k", 1); !errors.Is(err, ErrUnknownPolicy) {
		t.Errorf("Check: %v, want ErrUnknownPolicy", err)
	}
	s.SetConfig(DemoConfig())
	v := s.ConfigVersion()
	s.SetConfig(nil)
	if n := len(s.Config().Policies); n != 0 || s.ConfigVersion() == v {
		t.Errorf("after SetConfig(nil): %d policies, version %d (was %d)", n, s.ConfigVersion(), v)
	}
}

// TestNilService: a nil *Service refuses as a zero one does.
func TestNilService(t *testing.T) {
	var s *Service
	ctx := context.Background()
	if _, err := s.Check(ctx, "p", "k", 1); !errors.Is(err, ErrZeroService) {
		t.Errorf("Check: %v, want ErrZeroService", err)
	}
	if _, err := s.Acquire(ctx, "p", "k", 1, sluice.PriorityNormal); !errors.Is(err, ErrZeroService) {
		t.Errorf("Acquire: %v, want ErrZeroService", err)
	}
	if err := s.Release(ctx, "t"); !errors.Is(err, ErrZeroService) {
		t.Errorf("Release: %v, want ErrZeroService", err)
	}
	if _, err := s.Extend(ctx, "t"); !errors.Is(err, ErrZeroService) {
		t.Errorf("Extend: %v, want ErrZeroService", err)
	}
	s.SetConfig(DemoConfig())
	if n := len(s.Config().Policies); n != 0 {
		t.Errorf("Config: %d policies, want none", n)
	}
}

// TestServerLifecycleMisuse: addresses before Start are empty, a Start
// after Shutdown is refused, and Shutdown takes a nil context.
func TestServerLifecycleMisuse(t *testing.T) {
	srv, err := New(Options{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if a, b := srv.HTTPAddr(), srv.GRPCAddr(); a != "" || b != "" {
		t.Errorf("addresses before Start: %q, %q", a, b)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	//lint:ignore SA1012 a nil context is what is tested
	if err := srv.Shutdown(nil); err != nil {
		t.Errorf("Shutdown(nil): %v", err)
	}
	if err := srv.Start(); !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Start after Shutdown: %v, want http.ErrServerClosed", err)
	}
}

// TestFleetPublishNilContext: Publish takes a nil context as Background.
func TestFleetPublishNilContext(t *testing.T) {
	c := redistest.Client(t)
	m := memory.New(nil)
	defer m.Close()
	svc := NewService(m, DemoConfig(), &ServiceOptions{Metrics: NewMetrics()})
	f := NewFleet(c, svc, &FleetOptions{Prefix: redistest.Prefix(t), Logger: slog.New(slog.DiscardHandler)})
	//lint:ignore SA1012 a nil context is what is tested
	if err := f.Publish(nil); err != nil {
		t.Errorf("Publish(nil): %v", err)
	}
}

// TestParseFailurePolicyUnknown: an unknown name wraps
// resilient.ErrUnknownPolicy, as resilient.ParsePolicy's error does.
func TestParseFailurePolicyUnknown(t *testing.T) {
	if _, _, err := ParseFailurePolicy("sometimes"); !errors.Is(err, resilient.ErrUnknownPolicy) {
		t.Errorf("ParseFailurePolicy: %v, want resilient.ErrUnknownPolicy", err)
	}
}

// TestNewFleetWithoutClientOrService: a Fleet built without a Redis client
// (nil, or a nil *redis.Client) or without a built Service publishes
// nothing and says why, rather than ending the process from Start's
// goroutines.
func TestNewFleetWithoutClientOrService(t *testing.T) {
	m := memory.New(nil)
	defer m.Close()
	svc := NewService(m, DemoConfig(), nil)
	var typedNil *redis.Client
	for name, f := range map[string]*Fleet{
		"nil client":       NewFleet(nil, svc, nil),
		"typed nil client": NewFleet(typedNil, svc, nil),
		"nil service":      NewFleet(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), nil, nil),
		"zero service":     NewFleet(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), &Service{}, nil),
	} {
		f.Start()
		if err := f.Publish(context.Background()); !errors.Is(err, redisstore.ErrNoClient) && !errors.Is(err, ErrZeroService) {
			t.Errorf("%s: Publish = %v, want ErrNoClient or ErrZeroService", name, err)
		}
		if c := f.Collectors(); c != nil {
			t.Errorf("%s: Collectors = %v, want none", name, c)
		}
		f.Stop()
	}
}
