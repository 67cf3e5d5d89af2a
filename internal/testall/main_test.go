package main

// Runs the report over testdata/stream.json, the `go test -json` output of
// a small module (recorded with go1.26): a passing package, one whose
// tests skip, a failing one, one without tests and one that does not
// build. Talks to nothing.

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dedupq/dedupq/internal/testutil"
)

func TestReport(t *testing.T) {
	f, err := os.Open("testdata/stream.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	r := newReport(&out)
	if err := r.read(f); err != nil {
		t.Fatal(err)
	}
	r.summary(&out, 3*time.Second)
	got := out.String()
	defer func() {
		if t.Failed() {
			t.Log(got)
		}
	}()

	for _, tc := range []struct {
		name      string
		want      string
		wantCount int // how often want appears; 0 means at least once
	}{
		{"passing package's line", "ok  \texample.com/fx/pass\t", 1},
		{"a skipping package is ok too", "ok  \texample.com/fx/skip\t", 1},
		{"package without tests", "?   \texample.com/fx/none\t[no test files]", 1},
		{"failing test's message", "after the window: attempt 2, want 1", 1},
		{"failing test's headline", "--- FAIL: TestBad/inner", 1},
		{"failing package's line", "FAIL\texample.com/fx/fail\t", 1},
		{"build error", "undefined: undefined", 1},
		{"one line per skip reason, naming the tests",
			"  example.com/fx/skip: fauxqs cannot run here: node is not on PATH\n      TestNeedsEmulator, TestAlsoNeedsEmulator\n", 1},
		{"a multi-line reason on one line", "no publish-side dedup to test: multi-line\n      TestCapabilities/Dedup\n", 1},
		{"the package that did not build", "outside their tests (build, TestMain, timeout): example.com/fx/broken\n", 1},
		{"the counts", "\n5 passed, 3 failed, 3 skipped (tests and subtests; 5 packages, 1 without tests) in 3s\n", 1},
		{"no chatter of passing tests", "chatter of a passing test", -1},
		{"no chatter of a passing test in a failing package", "quiet", -1},
		{"no earlier log line as a skip reason", "an earlier log line", -1},
	} {
		n := strings.Count(got, tc.want)
		switch {
		case tc.wantCount < 0 && n > 0:
			t.Errorf("%s: %q printed %d times, want never", tc.name, tc.want, n)
		case tc.wantCount > 0 && n != tc.wantCount:
			t.Errorf("%s: %q printed %d times, want %d", tc.name, tc.want, n, tc.wantCount)
		}
	}
	if r.failed() != 3 {
		t.Errorf("failed() = %d, want 3: TestBad, TestBad/inner and the package that did not build", r.failed())
	}
}

// TestRaceSkipsRunAgain: tests that skipped asking to run without the race
// detector are run again by name, and count as what they did there.
func TestRaceSkipsRunAgain(t *testing.T) {
	r := newReport(&bytes.Buffer{})
	r.skips = []skipped{
		{"example.com/a", "TestAllocs", testutil.RaceMarker + "pooled"},
		{"example.com/b", "TestOuter/allocs", testutil.RaceMarker + "pooled"},
		{"example.com/b", "TestFails", testutil.RaceMarker + "pooled"},
		{"example.com/b", "TestSkipsAgain", testutil.RaceMarker + "pooled"},
		{"example.com/c", "TestEmulator", "fauxqs is not installed"},
	}
	again := r.raceSkipped()
	if len(again) != 4 {
		t.Fatalf("raceSkipped = %v, want the 4 with the marker", again)
	}
	got := strings.Join(rerunArgs(again), " ")
	want := "-run ^(TestAllocs|TestFails|TestOuter|TestSkipsAgain)$ example.com/a example.com/b"
	if got != want {
		t.Errorf("rerunArgs = %q, want %q", got, want)
	}
	r2 := newReport(&bytes.Buffer{})
	r2.results = map[string]string{
		"example.com/a\x00TestAllocs":        "pass",
		"example.com/b\x00TestOuter":         "pass",
		"example.com/b\x00TestOuter/allocs":  "pass",
		"example.com/b\x00TestFails":         "fail",
		"example.com/b\x00TestSkipsAgain":    "skip",
		"example.com/b\x00TestOuter/sibling": "pass",
	}
	r.passed = 10
	r.absorb(r2, again)
	if r.passed != 12 || r.failedN != 1 {
		t.Errorf("passed %d, failed %d; want 12 and 1", r.passed, r.failedN)
	}
	var left []string
	for _, s := range r.skips {
		left = append(left, s.test)
	}
	if strings.Join(left, ",") != "TestSkipsAgain,TestEmulator" {
		t.Errorf("still skipped: %v, want TestSkipsAgain and TestEmulator", left)
	}
}
