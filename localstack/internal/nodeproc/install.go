package nodeproc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// installTimeout bounds one `npm ci`; a cold install of either emulator
// takes seconds.
const installTimeout = 5 * time.Minute

// ErrUnavailable is wrapped by Start's error when the emulator cannot run
// on this machine at all: node is not installed, or its npm package is
// missing and npm is not there to install it. It is the one case in which
// a test may skip (outside CI); any other failure, a failed `npm ci`
// included, is an error to report.
var ErrUnavailable = errors.New("cannot run here")

// installed reports whether a completed install of dir holds module: npm
// writes node_modules/.package-lock.json last, so a half-finished install
// (an interrupted `npm ci`) does not count.
func installed(dir, module string) bool {
	for _, f := range []string{
		filepath.Join(dir, "node_modules", ".package-lock.json"),
		filepath.Join(dir, "node_modules", module, "package.json"),
	} {
		if _, err := os.Stat(f); err != nil {
			return false
		}
	}
	return true
}

// ensureInstalled installs dir's packages from its package-lock.json with
// `npm ci` when module is missing, and reports whether it ran npm. Test
// binaries of several packages start the same emulator while `go test`
// runs them in parallel, so the check and the install happen under an
// exclusive lock on a file named after dir: one binary installs, the
// others wait for it and then find the package installed. log receives a
// line saying that an install runs, since it takes a few seconds.
func ensureInstalled(dir, module string, log io.Writer) (ran bool, err error) {
	if installed(dir, module) {
		return false, nil
	}
	lockfile := filepath.Join(dir, "package-lock.json")
	if _, err := os.Stat(lockfile); err != nil {
		return false, fmt.Errorf("%s is not installed and there is no lockfile to install it from: %w (%w)", module, err, ErrUnavailable)
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return false, fmt.Errorf("%s is not installed and npm is not on PATH to install it (%w)", module, ErrUnavailable)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	sum := sha256.Sum256([]byte(abs))
	unlock, err := lockFile(filepath.Join(os.TempDir(), "dedupq-npm-ci-"+hex.EncodeToString(sum[:8])+".lock"))
	if err != nil {
		return false, fmt.Errorf("locking the install of %s: %w", module, err)
	}
	defer unlock()
	if installed(dir, module) {
		return false, nil // another test binary installed it meanwhile
	}
	if log != nil {
		fmt.Fprintf(log, "nodeproc: %s is not installed; running `npm ci` in %s\n", module, dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund", "--loglevel=error")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return true, fmt.Errorf("`npm ci` in %s failed (%v): %s", dir, err, lastLines(out.String(), 10))
	}
	if !installed(dir, module) {
		return true, fmt.Errorf("`npm ci` in %s did not install %s; is it in package-lock.json?", dir, module)
	}
	return true, nil
}

// lastLines keeps the end of a command's output for an error message.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
