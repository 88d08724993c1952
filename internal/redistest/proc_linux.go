package redistest

import (
	"os"
	"os/exec"
	"syscall"
)

// DieWithParent makes cmd's process get SIGKILL when the test binary
// exits, so that a test killed by -timeout leaves no server behind.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}

func signalStop(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

func signalCont(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
