//go:build !linux

package redistest

import "os/exec"

// DieWithParent does nothing here: only Linux can tie a child's life to its
// parent's.
func DieWithParent(*exec.Cmd) {}
