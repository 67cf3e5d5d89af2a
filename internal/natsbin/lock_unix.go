//go:build unix

package natsbin

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// tryLock takes an flock on file without waiting. flock belongs to the
// open file, so two opens in one process exclude each other as two
// processes do, and the kernel drops it when a holder dies mid-build.
func tryLock(file string) (func(), error) {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("natsbin: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, fmt.Errorf("natsbin: flock %s: %w", file, err)
	}
	return func() { f.Close() }, nil
}
