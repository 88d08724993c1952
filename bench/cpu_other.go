//go:build !unix

package bench

import "time"

// ProcessCPU is not measured here; the client CPU column then reads 0.
func ProcessCPU() time.Duration { return 0 }
