package main

// Runs the quickstart as `go run ./examples/quickstart` does, on the
// in-memory broker (no services), and checks its machine-readable last
// line.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := run(f); err != nil {
		t.Fatalf("run: %v", err)
	}
	out, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	last := lines[len(lines)-1]
	m := regexp.MustCompile(`^published=(\d+) delivered=\d+ duplicates_suppressed=[1-9]\d* effects=(\d+)$`).FindStringSubmatch(last)
	if m == nil || m[1] != m[2] {
		t.Errorf("last line %q, want published=N … duplicates_suppressed=K>0 effects=N\n%s", last, out)
	}
	if !strings.Contains(string(out), "startup check refused an unsafe retry policy") {
		t.Errorf("the refusal is missing:\n%s", out)
	}
}
