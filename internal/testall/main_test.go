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
