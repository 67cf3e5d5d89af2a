package outbox_test

import "runtime"

// runtimeGoexit ends the calling goroutine, running its defers: the
// in-process stand-in for a crash at a step.
func runtimeGoexit() { runtime.Goexit() }
