//go:build !unix

package nodeproc

// lockFile does not lock where flock is missing: parallel test binaries
// there may race to install the same emulator, and one of them then fails
// with npm's error instead of waiting.
func lockFile(string) (unlock func(), err error) { return func() {}, nil }
