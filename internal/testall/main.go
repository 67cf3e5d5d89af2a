// Command testall runs the project's tests the way the README and CI do,
// and says plainly what did not run:
//
//	go run ./internal/testall              # every package
//	go run ./internal/testall ./adapters/... # go test arguments of your own
//
// First it makes sure the nats-server that the tests which crash a NATS
// server run (go.mod's release, internal/natsbin) is built: on a
// machine's first run that takes a minute or two, which would otherwise
// fall inside a test's deadline while the other packages' tests load the
// machine.
//
// It runs `go test -race -count=1 -timeout 12m -json` on the packages
// (./... unless arguments are given, which then replace the package list
// and may add go test flags). -count=1 because the test cache cannot see
// what a test binary's child processes read (the emulators under
// localstack/) nor an emulator installed since the cached run: a cached
// "ok" could be a run that skipped them.
//
// Plain `go test ./...` prints only "ok" for a package whose tests
// skipped. testall prints the same per-package lines (ok, FAIL with the
// failing tests' output, no test files), then every skipped test grouped
// by its reason, then one line counting the tests (subtests included)
// that passed, failed and skipped. Tests that skipped under the race
// detector asking to run without it (testutil.SkipUnderRace: allocation
// counts over a sync.Pool) are run again without -race, by name, and
// counted as what they did there. It exits 1 when anything failed,
// including a package that failed outside its tests (a build error, a
// TestMain that exited, a timeout).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/dedupq/dedupq/internal/natsbin"
	"github.com/dedupq/dedupq/internal/testutil"
)

// goTestFlags are the flags every run uses; README and .ci/run rely on
// them.
var goTestFlags = []string{"test", "-race", "-count=1", "-timeout", "12m", "-json"}

func main() {
	args := os.Args[1:]
	if len(args) == 0 {
		args = []string{"./..."}
	}
	start := time.Now()
	buildNATS()
	r := newReport(os.Stdout)
	waitErr := run(r, append(slices.Clone(goTestFlags), args...))
	var exit *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exit) {
		fatal(waitErr)
	}
	if again := r.raceSkipped(); len(again) > 0 {
		// Tests that the race detector makes meaningless (allocation
		// counts over a sync.Pool) skipped under it: they count only
		// once they ran.
		fmt.Printf("\ntestall: %d tests asked to run without the race detector; running them again so\n", len(again))
		r2 := newReport(os.Stdout)
		err := run(r2, append(slices.Clone(goTestFlagsNoRace), rerunArgs(again)...))
		if err != nil && !errors.As(err, &exit) {
			fatal(err)
		}
		if err != nil && r2.failed() == 0 {
			fmt.Printf("testall: go test without the race detector exited with %v\n", err)
			r2.failedPkgs = append(r2.failedPkgs, "(the run without the race detector)")
		}
		r.absorb(r2, again)
	}
	r.summary(os.Stdout, time.Since(start))
	switch {
	case waitErr != nil && r.failed() == 0:
		// go test failed without a failing test or package in its
		// output (a bad flag, a package that does not exist): its own
		// message went to stderr.
		fmt.Printf("testall: go test exited with %v\n", waitErr)
		os.Exit(1)
	case waitErr != nil || r.failed() > 0:
		os.Exit(1)
	}
}

// natsBuildTimeout bounds the first build of nats-server: about 90 s on
// two shared cores here.
const natsBuildTimeout = 10 * time.Minute

// buildNATS builds the nats-server that natsbin gives the tests, or finds
// it cached. A failure is reported and the tests run anyway: the ones that
// need the server fail with the same error, the others still count.
func buildNATS() {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), natsBuildTimeout)
	defer cancel()
	bin, err := natsbin.Path(ctx)
	if err != nil {
		fmt.Printf("testall: no nats-server for the tests that start one: %v\n", err)
		return
	}
	fmt.Printf("testall: nats-server for the tests that start one: %s (ready in %s)\n", bin, time.Since(t0).Round(time.Millisecond))
}

// run runs go with argv, feeding its -json output to r, and returns how
// go exited.
func run(r *report, argv []string) error {
	fmt.Printf("testall: go %s\n", strings.Join(argv, " "))
	cmd := exec.Command("go", argv...)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		fatal(err)
	}
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	if err := r.read(stdout); err != nil {
		fatal(err)
	}
	return cmd.Wait()
}

// goTestFlagsNoRace are goTestFlags without -race, for the tests that
// skipped under it asking to run without it.
var goTestFlagsNoRace = slices.DeleteFunc(slices.Clone(goTestFlags), func(f string) bool { return f == "-race" })

// rerunArgs are go test's -run pattern and packages for skipped tests:
// each top-level test of theirs, anchored, in their packages.
func rerunArgs(tests []skipped) []string {
	var names, pkgs []string
	for _, s := range tests {
		top, _, _ := strings.Cut(s.test, "/")
		names = append(names, regexp.QuoteMeta(top))
		pkgs = append(pkgs, s.pkg)
	}
	slices.Sort(names)
	slices.Sort(pkgs)
	return append([]string{"-run", "^(" + strings.Join(slices.Compact(names), "|") + ")$"}, slices.Compact(pkgs)...)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "testall:", err)
	os.Exit(2)
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string // build-output and build-fail events
}

// line is one output line of a package and the test it belongs to ("" for
// the package itself).
type line struct{ test, text string }

// pkgState is what the report keeps of a package until it ends.
type pkgState struct {
	lines  []line
	failed map[string]bool
	ok     map[string]bool // tests that passed or skipped
}

// skipped is a test that skipped and why.
type skipped struct{ pkg, test, reason string }

// report turns the event stream into go test's usual lines and a summary.
type report struct {
	out                   io.Writer
	pkgs                  map[string]*pkgState
	passed, failedN       int
	failedPkgs            []string // failed outside any test
	skips                 []skipped
	testLines             map[string][]string // pkg+"\x00"+test: output, for skip reasons
	results               map[string]string   // pkg+"\x00"+test: pass, fail or skip
	packages, noTestFiles int
	sawEvent              bool
}

func newReport(out io.Writer) *report {
	return &report{out: out, pkgs: map[string]*pkgState{}, testLines: map[string][]string{}, results: map[string]string{}}
}

func (r *report) failed() int { return r.failedN + len(r.failedPkgs) }

func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1024*1024), 64*1024*1024)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(r.out, sc.Text()) // not an event: pass it on
			continue
		}
		r.sawEvent = true
		r.handle(e)
	}
	return sc.Err()
}

// framing matches the lines test2json's verbose stream adds that a
// non-verbose go test does not print.
var framing = regexp.MustCompile(`^\s*(=== (RUN|PAUSE|CONT|NAME)\s|--- (PASS|SKIP):\s)`)

func (r *report) handle(e event) {
	switch e.Action {
	case "build-output":
		fmt.Fprint(r.out, e.Output)
		return
	case "build-fail":
		return // the package's own fail event follows
	}
	p := r.pkgs[e.Package]
	if p == nil {
		p = &pkgState{failed: map[string]bool{}, ok: map[string]bool{}}
		r.pkgs[e.Package] = p
	}
	key := e.Package + "\x00" + e.Test
	switch e.Action {
	case "output":
		p.lines = append(p.lines, line{e.Test, e.Output})
		if e.Test != "" {
			r.testLines[key] = append(r.testLines[key], e.Output)
		}
	case "pass", "fail", "skip":
		if e.Test != "" {
			r.endTest(e, p, key)
			return
		}
		r.endPackage(e, p)
		delete(r.pkgs, e.Package)
	}
}

func (r *report) endTest(e event, p *pkgState, key string) {
	r.results[key] = e.Action
	switch e.Action {
	case "pass":
		r.passed++
		p.ok[e.Test] = true
	case "fail":
		r.failedN++
		p.failed[e.Test] = true
	case "skip":
		p.ok[e.Test] = true
		r.skips = append(r.skips, skipped{e.Package, e.Test, skipReason(r.testLines[key])})
	}
	delete(r.testLines, key)
}

// raceSkipped lists the tests that skipped asking to run without the race
// detector (testutil.SkipUnderRace).
func (r *report) raceSkipped() []skipped {
	var out []skipped
	for _, s := range r.skips {
		if strings.HasPrefix(s.reason, testutil.RaceMarker) {
			out = append(out, s)
		}
	}
	return out
}

// absorb counts, in place of their skips, the tests of again that ran in
// r2 (the run without the race detector): passed or failed there. One
// that skipped there too, or did not run, stays skipped. r2's failures
// outside its tests are r's.
func (r *report) absorb(r2 *report, again []skipped) {
	ran := map[[2]string]bool{}
	for _, s := range again {
		switch r2.results[s.pkg+"\x00"+s.test] {
		case "pass":
			r.passed++
		case "fail":
			r.failedN++
		default:
			continue
		}
		ran[[2]string{s.pkg, s.test}] = true
	}
	r.skips = slices.DeleteFunc(r.skips, func(s skipped) bool { return ran[[2]string{s.pkg, s.test}] })
	r.failedPkgs = append(r.failedPkgs, r2.failedPkgs...)
	// A failing test of r2 that r did not skip (a sibling of a skipped
	// subtest, run again with its parent) fails the run too.
	for key, action := range r2.results {
		pkg, test, _ := strings.Cut(key, "\x00")
		if action == "fail" && !ran[[2]string{pkg, test}] && !strings.Contains(test, "/") {
			r.failedN++
		}
	}
}

// endPackage prints what go test prints for a package: its ok line, its
// "no test files" line, or, when it failed, the output of its failed
// tests and its own.
func (r *report) endPackage(e event, p *pkgState) {
	r.packages++
	switch e.Action {
	case "pass", "skip":
		last := ""
		for _, l := range p.lines {
			if l.test == "" && (strings.HasPrefix(l.text, "ok") || strings.HasPrefix(l.text, "?")) {
				last = l.text
			}
		}
		if strings.HasPrefix(last, "?") {
			r.noTestFiles++
		}
		if last == "" {
			last = fmt.Sprintf("ok  \t%s\n", e.Package)
		}
		fmt.Fprint(r.out, last)
	case "fail":
		// The package's own output, and that of every test that did
		// not pass or skip: failed, or cut short (a timeout, a crash).
		cut := false
		for _, l := range p.lines {
			if l.test != "" && p.ok[l.test] || framing.MatchString(l.text) {
				continue
			}
			if l.test != "" && !p.failed[l.test] {
				cut = true
			}
			fmt.Fprint(r.out, l.text)
		}
		if len(p.failed) == 0 || cut {
			r.failedPkgs = append(r.failedPkgs, e.Package)
		}
	}
}

// located matches the file:line prefix the testing package puts on a log
// line.
var located = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// skipReason is a skipped test's message: its last logged entry (the one
// t.Skip wrote, with its continuation lines), without the file:line.
func skipReason(output []string) string {
	var kept []string
	for _, l := range output {
		if !framing.MatchString(l) {
			kept = append(kept, l)
		}
	}
	from := -1
	for i, l := range kept {
		if located.MatchString(l) {
			from = i
		}
	}
	if from < 0 {
		return "(no reason given)"
	}
	var b strings.Builder
	for i, l := range kept[from:] {
		if i == 0 {
			l = located.ReplaceAllString(l, "")
		}
		b.WriteString(strings.TrimSpace(l))
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

// summary lists every skipped test by package and reason, the packages
// that failed outside their tests, and the counts.
func (r *report) summary(out io.Writer, took time.Duration) {
	if len(r.skips) > 0 {
		fmt.Fprintf(out, "\nSkipped tests, and why:\n")
		type group struct {
			pkg, reason string
			tests       []string
		}
		var groups []*group
		index := map[[2]string]*group{}
		for _, s := range r.skips {
			k := [2]string{s.pkg, s.reason}
			g := index[k]
			if g == nil {
				g = &group{pkg: s.pkg, reason: s.reason}
				index[k] = g
				groups = append(groups, g)
			}
			g.tests = append(g.tests, s.test)
		}
		for _, g := range groups {
			fmt.Fprintf(out, "  %s: %s\n      %s\n", g.pkg, g.reason, strings.Join(g.tests, ", "))
		}
	}
	if len(r.failedPkgs) > 0 {
		fmt.Fprintf(out, "\nPackages that failed outside their tests (build, TestMain, timeout): %s\n", strings.Join(r.failedPkgs, ", "))
	}
	if !r.sawEvent {
		fmt.Fprintln(out, "\ntestall: go test reported no events")
	}
	fmt.Fprintf(out, "\n%d passed, %d failed, %d skipped (tests and subtests; %d packages, %d without tests) in %s\n",
		r.passed, r.failed(), len(r.skips), r.packages, r.noTestFiles, took.Round(time.Second))
}
