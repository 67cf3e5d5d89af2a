//go:build !linux

package main

import "os/exec"

// dieWithParent does nothing where the kernel cannot tie a child's life to
// its parent's: a server then outlives a run that is killed.
func dieWithParent(*exec.Cmd) {}
