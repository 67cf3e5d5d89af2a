package main

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the Prometheus server if the test
// binary dies first (killed by its timeout, say), so that no server
// outlives its run.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
