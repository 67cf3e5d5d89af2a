// These tests talk to real things: the go command (go list and go build,
// with the module cache and, on a fresh machine, the Go module proxy),
// and the nats-server process they build, started on a loopback port of
// its own (never the shared server at 127.0.0.1:4222) and SIGKILLed by
// its PID. The first run on a machine builds the server (a minute or two
// on two cores).
package natsbin

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// buildTimeout bounds one build: a cold one on two shared cores took
// about 90 s here.
const buildTimeout = 8 * time.Minute

// goModVersion is the version go.mod's require line names, read without
// the go command, so that Version is checked against the lockfile itself.
func goModVersion(t *testing.T) string {
	t.Helper()
	f, err := os.Open("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == Module {
			return fields[1]
		}
		if len(fields) >= 3 && fields[0] == "require" && fields[1] == Module {
			return fields[2]
		}
	}
	t.Fatalf("go.mod does not require %s", Module)
	return ""
}

func TestVersionIsGoMods(t *testing.T) {
	v, err := Version(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if want := goModVersion(t); v != want {
		t.Fatalf("Version = %s; go.mod requires %s", v, want)
	}
}

// TestBuildsOnce builds into an empty cache from several goroutines at
// once: the file lock, which excludes two opens in one process as it does
// two processes, lets one of them build and the others find its binary.
// A second round finds it without building.
func TestBuildsOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), buildTimeout)
	defer cancel()
	dir := t.TempDir()
	before := builds.Load()
	const n = 4
	paths := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { paths[i], errs[i] = path(ctx, dir) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if paths[i] != paths[0] {
			t.Fatalf("callers got %s and %s", paths[0], paths[i])
		}
	}
	if got := builds.Load() - before; got != 1 {
		t.Fatalf("%d callers ran %d builds; want 1", n, got)
	}
	if again, err := path(ctx, dir); err != nil || again != paths[0] {
		t.Fatalf("second call: %s, %v; want %s", again, err, paths[0])
	}
	if got := builds.Load() - before; got != 1 {
		t.Fatalf("a cached binary was built again (%d builds)", got)
	}
	// Nothing but the binary and its lock file is left behind.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if name := e.Name(); name != filepath.Base(paths[0]) && name != filepath.Base(paths[0])+".lock" {
			t.Errorf("left in the cache: %s", name)
		}
	}
}

// TestServerRuns starts the cached binary with JetStream and checks that
// a client sees the version go.mod names and can use JetStream.
func TestServerRuns(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), buildTimeout)
	defer cancel()
	bin, err := Path(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// -p -1: the server picks a free port and writes it to the ports
	// file, so no other process can take it between a probe and the bind.
	cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", filepath.Join(dir, "js"), "--ports_file_dir", dir)
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	url := readPortsFile(t, dir, bin, cmd.Process.Pid, exited)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if got, want := "v"+nc.ConnectedServerVersion(), goModVersion(t); got != want {
		t.Fatalf("the server says %s; go.mod requires %s", got, want)
	}
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(nats.Context(ctx)); err != nil {
		t.Fatalf("JetStream is not enabled: %v", err)
	}
}

// readPortsFile polls, with a deadline, for the client URL the server
// bin with pid writes to dir.
func readPortsFile(t *testing.T, dir, bin string, pid int, exited <-chan error) string {
	t.Helper()
	// The server names it after its program and PID.
	file := filepath.Join(dir, filepath.Base(bin)+"_"+strconv.Itoa(pid)+".ports")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(file); err == nil {
			var ports struct{ Nats []string }
			if json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 {
				return ports.Nats[0]
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("nats-server exited at start: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ports file %s within 30s", file)
		}
	}
}
