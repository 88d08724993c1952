package memory_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
		s := memory.New(&memory.Options{Clock: now})
		t.Cleanup(func() { s.Close() })
		return s
	})
}
