package lease

import (
	"testing"
	"unsafe"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/table"
)

// A lease's hot part stays 32 bytes, a 48-byte table slot (it was 64):
// over many keys the table is what a local decision misses in the cache.
// Its units and rest are 32 bits, which hold any capacity.
func TestHotSize(t *testing.T) {
	if n := unsafe.Sizeof(hot{}); n != 32 {
		t.Errorf("hot is %d bytes, want 32", n)
	}
	if sluice.MaxRate > 1<<31-1 {
		t.Errorf("sluice.MaxRate %d does not fit hot's 32-bit units", sluice.MaxRate)
	}
}

// Every limit id is a kind the lease table can hold.
func TestLimitIDsFitTheTable(t *testing.T) {
	if maxLimits > table.MaxKind {
		t.Errorf("maxLimits %d exceeds table.MaxKind %d", maxLimits, table.MaxKind)
	}
}
