package nodeproc

// Talks to the real node and npm on PATH, with testdata/app as the
// emulator: its one dependency is a local folder, so `npm ci` needs no
// network. Without node or npm the tests skip, and fail under CI.

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// needNode skips the test, or fails it under CI, without node and npm.
func needNode(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not on PATH under CI", tool)
			}
			t.Skipf("%s is not on PATH", tool)
		}
	}
}

// fixture copies testdata/app, without node_modules, to a fresh folder.
func fixture(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	err := os.CopyFS(dst, os.DirFS(filepath.Join("testdata", "app")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dst, "node_modules")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the fixture has a node_modules: %v", err)
	}
	return dst
}

func spec(dir string, stderr *syncWriter) Spec {
	return Spec{
		Name: "fixture", Dir: dir, Script: "start.mjs", Module: "greeting",
		Ready: regexp.MustCompile(`listening on port (\d+)`), Stderr: stderr,
	}
}

// TestStartInstallsOnce: on a fresh clone (no node_modules) Start installs
// the emulator from its lockfile and runs it; test binaries starting it at
// once install it once, the others waiting for that install.
func TestStartInstallsOnce(t *testing.T) {
	needNode(t)
	dir := fixture(t)
	var log bytes.Buffer
	stderr := &syncWriter{w: &log}
	const n = 4
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			p, ports, err := Start(spec(dir, stderr))
			if err != nil {
				errs[i] = err
				return
			}
			defer p.Stop()
			if len(ports) != 1 || ports[0] != "1234" {
				errs[i] = errors.New("ready line ports " + strings.Join(ports, ","))
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Start %d: %v", i, err)
		}
	}
	if got := strings.Count(log.String(), "running `npm ci`"); got != 1 {
		t.Errorf("npm ci ran %d times for %d concurrent starts, want once; log:\n%s", got, n, log.String())
	}
}

// TestStartWithoutNpm: a missing package with no npm to install it is the
// one error that lets a caller skip.
func TestStartWithoutNpm(t *testing.T) {
	needNode(t)
	node, _ := exec.LookPath("node")
	bin := t.TempDir()
	if err := os.Symlink(node, filepath.Join(bin, "node")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin)
	_, _, err := Start(spec(fixture(t), &syncWriter{w: &bytes.Buffer{}}))
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "npm") {
		t.Fatalf("Start without npm: %v, want an ErrUnavailable that names npm", err)
	}
}
