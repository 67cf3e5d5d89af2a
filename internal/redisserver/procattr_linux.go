package redisserver

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the server if the process that
// started it dies first (a test binary killed by its timeout, say), so
// that no server outlives its run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
