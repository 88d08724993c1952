//go:build amd64 || arm64

package prefetch

//go:noescape
func line(addr uintptr)
