package prefetch

import (
	"testing"
	"unsafe"
)

// TestLineNeverFaults: a hint for any address, valid or not, returns.
func TestLineNeverFaults(t *testing.T) {
	b := make([]byte, 4096)
	for _, addr := range []uintptr{0, 1, ^uintptr(0), ^uintptr(0) - 63, uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[4095]))} {
		Line(addr)
	}
}
