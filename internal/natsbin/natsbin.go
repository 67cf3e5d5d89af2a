// Package natsbin gives tests and fault programs a nats-server binary of
// the release this module already depends on (go.mod's
// github.com/nats-io/nats-server/v2, the same code the embedded server in
// adapters/jetstream runs), for when they need a server in another
// process: one they can SIGKILL. The machine's own nats-server may be much
// older (Debian 12 ships 2.9.10); that one stays the target of the tests
// that use the shared server at 127.0.0.1:4222.
//
// The binary is built with the go command from the module graph (go.mod
// and go.sum: nothing is fetched but through the Go module proxy, and
// only what the build of the module's other packages would fetch too),
// once per machine and version, into the user's cache directory. A file
// lock makes parallel test binaries build it once; the others wait.
package natsbin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
)

// Module is the module path of the server that is built.
const Module = "github.com/nats-io/nats-server/v2"

// builds counts the builds this process ran, so that a test can tell a
// cached binary from a fresh build.
var builds atomic.Int32

// Version is the nats-server version that the module of the current
// directory requires, as `go list -m` resolves it from go.mod. Run from
// inside that module (go test and go run do).
func Version(ctx context.Context) (string, error) {
	out, err := goCmd(ctx, "list", "-m", "-f", "{{if .Replace}}replaced{{else}}{{.Version}}{{end}}", Module)
	if err != nil {
		return "", err
	}
	v := strings.TrimSpace(string(out))
	switch {
	case v == "replaced":
		// A replaced module has no version to name a cached binary by.
		return "", fmt.Errorf("natsbin: %s is replaced in go.mod; a cached binary cannot be told apart", Module)
	case !strings.HasPrefix(v, "v"):
		return "", fmt.Errorf("natsbin: go list -m %s gave %q, not a version", Module, v)
	}
	return v, nil
}

// Path returns the path of a nats-server binary of Version, building it
// the first time on this machine. A cold build takes a minute or two on
// two cores; a cached one returns at once. ctx bounds the build and the
// wait for another process's build.
func Path(ctx context.Context) (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return path(ctx, dir)
}

// CacheDir is where the binaries are kept: dedupq/natsbin in the user's
// cache directory (os.UserCacheDir), else in the temporary directory.
func CacheDir() (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		base = os.TempDir()
	}
	dir := filepath.Join(base, "dedupq", "natsbin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("natsbin: %w", err)
	}
	return dir, nil
}

func path(ctx context.Context, dir string) (string, error) {
	v, err := Version(ctx)
	if err != nil {
		return "", err
	}
	name := "nats-server-" + v + "-" + runtime.GOOS + "-" + runtime.GOARCH
	bin := filepath.Join(dir, name)
	if runtime.GOOS == "windows" {
		bin += ".exe"
	}
	// The binary appears only by rename, whole: if it is there, it is
	// complete.
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	unlock, err := lock(ctx, filepath.Join(dir, name+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another process built it while we waited
	}
	if err := build(ctx, v, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// build compiles the server into a temporary file next to bin, checks
// that it says it is version v, and renames it to bin.
func build(ctx context.Context, v, bin string) error {
	builds.Add(1)
	tmp, err := os.CreateTemp(filepath.Dir(bin), filepath.Base(bin)+".tmp*")
	if err != nil {
		return fmt.Errorf("natsbin: %w", err)
	}
	tmp.Close()
	defer os.Remove(tmp.Name()) // a no-op once renamed
	// No flags of its own (no -trimpath): the build then reuses what
	// building the embedded server's package put in the build cache.
	if _, err := goCmd(ctx, "build", "-o", tmp.Name(), Module); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, tmp.Name(), "--version").Output()
	if err != nil {
		return fmt.Errorf("natsbin: the built server does not run: %w", err)
	}
	// It prints "nats-server: v2.15.2".
	if got := strings.TrimSpace(string(out)); got != "nats-server: "+v {
		return fmt.Errorf("natsbin: the built server says %q; want version %s", got, v)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return fmt.Errorf("natsbin: %w", err)
	}
	return nil
}

// goCmd runs the go command in the current directory and returns its
// standard output; its standard error is in the error.
func goCmd(ctx context.Context, args ...string) ([]byte, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("natsbin: the go command is needed to build nats-server: %w", err)
	}
	cmd := exec.CommandContext(ctx, goBin, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("natsbin: go %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// errLocked is what tryLock returns while another holder has the lock.
var errLocked = errors.New("natsbin: locked")

// lock takes the exclusive lock on file, polling until ctx ends: a
// blocking lock could not be given up when ctx ends.
func lock(ctx context.Context, file string) (unlock func(), err error) {
	for {
		unlock, err := tryLock(file)
		if !errors.Is(err, errLocked) {
			return unlock, err
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("natsbin: waiting for another process's build of nats-server (%s): %w", file, ctx.Err())
		case <-t.C:
		}
	}
}
