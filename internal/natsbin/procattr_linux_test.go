package natsbin

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server if the test binary dies
// first (killed by its timeout, say), so that no server outlives the run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
