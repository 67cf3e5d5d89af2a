//go:build unix

package nodeproc

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock on path, creating it, and
// waits for it. The lock dies with the process, so a test binary killed
// mid-install leaves nothing stale behind.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
