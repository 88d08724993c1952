//go:build !unix

package main

import "time"

// processCPU is not measured here; the client CPU column then reads 0.
func processCPU() time.Duration { return 0 }
