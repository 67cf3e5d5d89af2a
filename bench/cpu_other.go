//go:build !unix

package main

import "time"

// processCPU is not read where getrusage is missing: the CPU columns then
// read 0.
func processCPU() time.Duration { return 0 }
