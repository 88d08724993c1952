//go:build !linux

package redistest

import (
	"errors"
	"os"
	"os/exec"
)

// DieWithParent does nothing here: only Linux can tie a child's life to its
// parent's.
func DieWithParent(*exec.Cmd) {}

var errNoSignals = errors.New("redistest: pausing a process is supported on Linux only")

func signalStop(*os.Process) error { return errNoSignals }

func signalCont(*os.Process) error { return errNoSignals }
