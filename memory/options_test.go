package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// A negative MaxKeys or Shards is refused, not taken for the default: the
// store refuses every call, naming the option, and a limiter on it fails
// to build.
func TestNewRefusesNegativeOptions(t *testing.T) {
	ctx := context.Background()
	limit := sluice.PerSecond(10)
	for _, o := range []memory.Options{{MaxKeys: -1}, {Shards: -8}, {MaxKeys: -5, Shards: 4}} {
		s := memory.New(&o)
		if _, err := s.Take(ctx, "k", limit, 1); !errors.Is(err, memory.ErrInvalidOptions) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("%+v: Take = %v, want ErrInvalidOptions (and ErrStoreNotBuilt)", o, err)
		}
		if _, err := s.Peek(ctx, "k", limit, 1); !errors.Is(err, memory.ErrInvalidOptions) {
			t.Errorf("%+v: Peek = %v, want ErrInvalidOptions", o, err)
		}
		if _, err := s.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: limit, Cost: 1}}); !errors.Is(err, memory.ErrInvalidOptions) {
			t.Errorf("%+v: TakeAll = %v, want ErrInvalidOptions", o, err)
		}
		if err := s.Reset(ctx, "k", limit); !errors.Is(err, memory.ErrInvalidOptions) {
			t.Errorf("%+v: Reset = %v, want ErrInvalidOptions", o, err)
		}
		if _, err := s.Grant(ctx, "k", limit, 2); !errors.Is(err, memory.ErrInvalidOptions) {
			t.Errorf("%+v: Grant = %v, want ErrInvalidOptions", o, err)
		}
		if _, err := s.Acquire(ctx, "k", sluice.InFlightLimit{Max: 1, Hold: time.Second}, 1, "holder-1"); !errors.Is(err, memory.ErrInvalidOptions) {
			t.Errorf("%+v: Acquire = %v, want ErrInvalidOptions", o, err)
		}
		if _, err := sluice.NewLimiter(s, limit, nil); !errors.Is(err, memory.ErrInvalidOptions) {
			t.Errorf("%+v: NewLimiter = %v, want ErrInvalidOptions", o, err)
		}
		if s.Len() != 0 || s.Close() != nil {
			t.Errorf("%+v: Len %d, Close %v; want 0, nil", o, s.Len(), s.Close())
		}
	}
	// 0 is the default, as documented.
	s := memory.New(&memory.Options{})
	defer s.Close()
	if d, err := s.Take(ctx, "k", limit, 1); err != nil || !d.Allowed {
		t.Fatalf("zero options: %+v, %v", d, err)
	}
}
