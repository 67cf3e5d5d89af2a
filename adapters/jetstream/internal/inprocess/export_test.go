package inprocess

// Unregister undoes Register, so that a test of Register leaves the
// binary as it found it.
func Unregister() {
	mu.Lock()
	defer mu.Unlock()
	registered = nil
}
