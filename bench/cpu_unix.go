//go:build unix

package bench

import (
	"syscall"
	"time"
)

// ProcessCPU is this process's CPU time (user and system) so far.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
