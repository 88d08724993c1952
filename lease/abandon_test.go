package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/releasetest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
)

// With sluice.MaxBackgroundReleases at work, an abandoned holder's release
// through a lease store is not sent, and TryAbandonSlot says so, as the
// granter's own would: the caller counts it. Not parallel: it fills the
// process's bound.
func TestTryAbandonSlotFull(t *testing.T) {
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	s, err := lease.New(m, &lease.Options{MaxStaleness: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if err := s.TryAbandonSlot("k", sluice.NewHolderID()); !errors.Is(err, sluice.ErrRetriesFull) {
		t.Errorf("TryAbandonSlot with the bound full = %v, want ErrRetriesFull", err)
	}
	var none *lease.Store
	if err := none.TryAbandonSlot("k", sluice.NewHolderID()); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("nil store's TryAbandonSlot = %v, want ErrNoGranter", err)
	}
}
