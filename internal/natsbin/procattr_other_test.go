//go:build !linux

package natsbin

import "os/exec"

// dieWithParent does nothing where the kernel cannot tie a child's life to
// its parent's: a server then outlives a test binary that is killed.
func dieWithParent(*exec.Cmd) {}
