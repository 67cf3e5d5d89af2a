//go:build unix

package main

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) the whole process has used:
// every goroutine's, an in-process server's included, but not an emulator's
// in another process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
