package sluice_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// CheckBuilt tells a store never built from one made by its constructor,
// without calling it.
func TestCheckBuilt(t *testing.T) {
	t.Parallel()
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	for name, s := range map[string]sluice.Store{
		"nil":                   nil,
		"nil *memory.Store":     (*memory.Store)(nil),
		"zero memory.Store":     &memory.Store{},
		"zero redisstore.Store": &redisstore.Store{},
		"redisstore.New(nil)":   redisstore.New(nil, nil),
		"zero lease.Store":      &lease.Store{},
		"nil *lease.Store":      (*lease.Store)(nil),
	} {
		if err := sluice.CheckBuilt(s); !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("CheckBuilt(%s) = %v, want ErrStoreNotBuilt", name, err)
		}
		if s == nil {
			continue
		}
		// NewLimiter refuses it up front: it would fail every call.
		if _, err := sluice.NewLimiter(s, sluice.PerSecond(1), nil); !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("NewLimiter(%s) = %v, want ErrStoreNotBuilt", name, err)
		}
	}
	if err := sluice.CheckBuilt(m); err != nil {
		t.Errorf("CheckBuilt(memory.New) = %v", err)
	}
}
