// Command bench measures dedupq beside the raw SDK it wraps, in one process,
// over several rounds, and prints a markdown table of the median rates and
// their ratios together with the machine it ran on:
//
//	go run ./bench                       # everything, 5 rounds
//	go run ./bench -only redis,pg -rounds 7
//	go run ./bench -quick -only mem,memstore
//	go run ./bench -only sqs -case consume+guard -profdir prof
//
// Raw and dedupq sides of a row run alternately within each round, so that
// load from other processes hits both alike; compare ratios, not rates.
// Groups: mem, memstore, redis (127.0.0.1:6379), jskv (kvstore in a
// JetStream key-value bucket on an embedded server), pg and txguard
// (PostgreSQL db test on 127.0.0.1:5432), jetstream (an embedded server),
// jetstream-url (-nats-url), sqs (fauxqs, the npm emulator under
// localstack/fauxqs, or FAUXQS_ENDPOINT), pubsub (pstest, served by a
// child process of this program) and ordered (ordered groups against the
// unordered Consumer: see ordered.go).
//
// Each side also reports its heap allocations per message: the process's
// runtime.MemStats.Mallocs delta over the timed part of a run, divided by
// the messages. It counts every goroutine of the process — the SDK's, the
// library's, and an in-process server's (the mem broker, the embedded
// nats-server) — but not an emulator in another process (fauxqs, pstest,
// the NATS of jetstream-url). A server's per-message allocations fall on
// both sides of a row alike, so the difference is dedupq's; its
// time-driven ones (timers, heartbeats) fall more on the slower side. Broker
// publish and consume rows check the goal dedupq ≤ raw + 3 per message.
//
// And the process's CPU time per message (getrusage, user and system, over
// the same timed part), with the same reach: an in-process server's CPU
// counts, an emulator's or a server's in another process does not. Where
// both sides of a row keep the machine equally busy, the ratio of their
// rates is the inverse ratio of their CPU per message: the gap is work
// done, not time spent waiting.
//
// Profiles: every timed side runs under the pprof labels group, case,
// conc and side (raw or dedupq), and a group's setup under group and
// side=setup, so that one CPU profile splits by row and side
// (go tool pprof -tagfocus side=dedupq,case=consume). -profdir writes one
// CPU profile per row, named group-case-conc.prof; bench/proftop.sh prints
// the top functions of each side of each. Filling a queue before a side's
// timed part runs under phase=fill as well (-tagignore phase=fill). A goroutine carries the labels
// of the one that started it: the goroutines a side starts carry its
// labels, but those an SDK starts once and reuses (a connection's read
// loop, a client's flusher, an in-process server) carry the labels of
// whatever started them — the group's setup, or the side that opened the
// connection first — so their samples can land on the other side of the
// row. -tagfocus group=G takes them all in. An emulator in another process
// (fauxqs, pstest) is in no profile.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	if os.Getenv(pstestChildEnv) != "" {
		servePstest()
		return
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// config is what the flags select.
type config struct {
	only    map[string]bool
	cases   string // -case: see selectRows
	rounds  int
	quick   bool
	natsURL string
	redis   string
	pgDSN   string
	profDir string // -profdir: one CPU profile per row, when set
}

// groups in the order they run and print.
var groups = []string{"mem", "memstore", "redis", "jskv", "pg", "txguard", "jetstream", "jetstream-url", "sqs", "pubsub", "ordered"}

// errUnavailable is wrapped by a group's setup error when its emulator
// cannot run on this machine (say, node is missing for fauxqs): run then
// lists the group as skipped after the table instead of failing.
var errUnavailable = errors.New("unavailable")

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	only := fs.String("only", strings.Join(groups, ","), "comma-separated groups to run: "+strings.Join(groups, ", "))
	rounds := fs.Int("rounds", 5, "rounds per row; the table shows medians")
	quick := fs.Bool("quick", false, "few messages and one round: checks that everything works, measures nothing")
	natsURL := fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server for the jetstream-url group")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address for the redis group")
	pgDSN := fs.String("pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN for the pg and txguard groups")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := fs.String("memprofile", "", "write a profile of every allocation of the run to this file (go tool pprof -sample_index=alloc_objects); slows the run")
	cases := fs.String("case", "", "run only the rows whose case is this (e.g. consume), or, where no row's is, contains it (e.g. guard)")
	profDir := fs.String("profdir", "", "write a CPU profile of each row to DIR/group-case-conc.prof (summarise with bench/proftop.sh DIR)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := config{only: map[string]bool{}, cases: *cases, rounds: *rounds, quick: *quick, natsURL: *natsURL, redis: *redisAddr, pgDSN: *pgDSN, profDir: *profDir}
	for g := range strings.SplitSeq(*only, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(groups, g) {
			return fmt.Errorf("unknown group %q (have %s)", g, strings.Join(groups, ", "))
		}
		c.only[g] = true
	}
	if c.quick {
		c.rounds = 1
	}
	if c.rounds < 1 {
		return fmt.Errorf("-rounds %d: want at least 1", c.rounds)
	}
	if *cpuProfile != "" && c.profDir != "" {
		return errors.New("-cpuprofile and -profdir: the runtime takes one CPU profile at a time")
	}
	if c.profDir != "" {
		if err := os.MkdirAll(c.profDir, 0o755); err != nil {
			return err
		}
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		// Every allocation, so that counts per function are exact; it
		// slows the run, whose rates then mean nothing.
		runtime.MemProfileRate = 1
		f, err := os.Create(*memProfile)
		if err != nil {
			return err
		}
		defer func() {
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				fmt.Fprintln(os.Stderr, "bench: writing the allocation profile:", err)
			}
			f.Close()
		}()
	}
	fmt.Fprintf(out, "Machine: %s, %d cores (GOMAXPROCS %d), %s %s/%s; %d round(s), medians.\n\n",
		cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, c.rounds)
	fmt.Fprintln(out, "| group | case | conc | raw | raw msgs/s | raw allocs/msg | raw CPU µs/msg | dedupq | dedupq msgs/s | dedupq allocs/msg | dedupq CPU µs/msg | ratio | goal | allocs goal |")
	fmt.Fprintln(out, "|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|")
	var skipped, profiles []string
	ran := 0
	defer func() {
		if len(skipped) > 0 {
			fmt.Fprintln(out)
			for _, s := range skipped {
				fmt.Fprintln(out, "Skipped:", s)
			}
		}
		if ns := takeNotes(); len(ns) > 0 {
			fmt.Fprintln(out)
			for _, n := range ns {
				fmt.Fprintln(out, "Note:", n)
			}
		}
		if len(profiles) > 0 {
			fmt.Fprintf(out, "\nCPU profiles (bench/proftop.sh %s prints each side's top functions):\n", c.profDir)
			for _, p := range profiles {
				fmt.Fprintln(out, "  "+p)
			}
		}
	}()
	for _, g := range groups {
		if !c.only[g] {
			continue
		}
		var rows []row
		var cleanup func()
		var err error
		// Goroutines an SDK starts here (connection loops, servers) keep
		// these labels for the whole group.
		pprof.Do(ctx, pprof.Labels("group", g, "side", "setup"), func(ctx context.Context) {
			rows, cleanup, err = setups[g](ctx, c)
		})
		if errors.Is(err, errUnavailable) {
			skipped = append(skipped, fmt.Sprintf("%s: %v", g, err))
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
		for _, r := range selectRows(rows, c.cases) {
			ran++
			var line, prof string
			var err error
			if c.profDir != "" {
				prof = profilePath(c.profDir, g, r, profiles)
				line, err = profiled(prof, func() (string, error) { return measure(ctx, c, g, r) })
				if err == nil {
					profiles = append(profiles, prof)
				}
			} else {
				line, err = measure(ctx, c, g, r)
			}
			if err != nil {
				cleanup()
				return fmt.Errorf("%s %s c=%d: %w", g, r.name, r.conc, err)
			}
			fmt.Fprintln(out, line)
		}
		cleanup()
	}
	if ran == 0 && len(skipped) == 0 {
		return fmt.Errorf("no row of %s has a case matching -case %q", *only, c.cases)
	}
	return nil
}

// untimed runs a side's setup (filling a queue before the timed part)
// under the extra pprof label phase=fill, so that a profile can leave it
// out: go tool pprof -tagignore phase=fill.
func untimed[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	var v T
	var err error
	pprof.Do(ctx, pprof.Labels("phase", "fill"), func(ctx context.Context) { v, err = f(ctx) })
	return v, err
}

// selectRows keeps the rows whose case is name, or, when none's is, those
// whose case contains it: "consume" is the consume rows alone, "guard" every
// consume+guard row. An empty name keeps every row.
func selectRows(rows []row, name string) []row {
	if name == "" {
		return rows
	}
	match := func(r row) bool { return r.name == name }
	if !slices.ContainsFunc(rows, match) {
		match = func(r row) bool { return strings.Contains(r.name, name) }
	}
	var kept []row
	for _, r := range rows {
		if match(r) {
			kept = append(kept, r)
		}
	}
	return kept
}

// profilePath names a row's profile group-case-conc.prof in dir, the case
// with whatever a file name should not hold replaced; a second row of the
// same name (jetstream's two consume+guard rows) adds its dedupq side's
// name.
func profilePath(dir, group string, r row, taken []string) string {
	base := group + "-" + r.name + "-" + strconv.Itoa(r.conc)
	p := filepath.Join(dir, fileSafe(base)+".prof")
	if slices.Contains(taken, p) {
		p = filepath.Join(dir, fileSafe(base+"-"+r.dq.name)+".prof")
	}
	return p
}

func fileSafe(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("+-._", r):
			return r
		}
		return '_'
	}, s)
}

// profiled runs f under a CPU profile written to path.
func profiled(path string, f func() (string, error)) (string, error) {
	file, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := pprof.StartCPUProfile(file); err != nil {
		file.Close()
		return "", err
	}
	line, err := f()
	pprof.StopCPUProfile()
	if cerr := file.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return line, err
}

// side is one way of handling n messages, timed; round makes keys and
// streams fresh in every round.
type side struct {
	name string
	run  func(ctx context.Context, round int, n int64) (time.Duration, error)
}

// row compares a raw side with a dedupq side on the same work.
type row struct {
	name string
	conc int
	n    int64 // messages per round; quick mode divides it
	goal float64
	// allocGoal checks dedupq's allocations per message against the raw
	// side's plus allocSlack (issue 12).
	allocGoal bool
	raw, dq   side
}

// allocSlack is how many more allocations per message than the raw SDK
// the allocs goal allows dedupq.
const allocSlack = 3

// stopwatch times the measured part of a side's run (what follows its
// setup: making queues, filling them) and counts the heap allocations the
// whole process makes meanwhile, and the CPU time it takes.
type stopwatch struct {
	start   time.Time
	mallocs uint64
	cpu     time.Duration
}

// lastTimed holds the mallocs of the last stopwatch stopped, or -1, and
// lastTimedCPU its process CPU time: measure uses them for a side that
// times part of its run, and the whole run's for one that does not (the
// store rows, which have no setup).
var (
	lastTimed    int64 = -1
	lastTimedCPU time.Duration
)

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

func startWatch() stopwatch {
	return stopwatch{mallocs: mallocs(), cpu: processCPU(), start: time.Now()}
}

// stop returns the time since startWatch and records the allocations in
// lastTimed, the CPU time in lastTimedCPU. Sides run one at a time, so one
// variable each is enough.
func (w stopwatch) stop() time.Duration {
	d := time.Since(w.start)
	lastTimedCPU = processCPU() - w.cpu
	lastTimed = int64(mallocs() - w.mallocs)
	return d
}

// notes are what sides found wrong with their own samples (addNote), for
// the run to print after the table.
var notes struct {
	sync.Mutex
	list []string
}

func addNote(s string) {
	notes.Lock()
	defer notes.Unlock()
	notes.list = append(notes.list, s)
}

func takeNotes() []string {
	notes.Lock()
	defer notes.Unlock()
	ns := notes.list
	notes.list = nil
	return ns
}

// setups build a group's rows against its server, and a cleanup.
var setups = map[string]func(ctx context.Context, c config) ([]row, func(), error){
	"mem":           memRows,
	"memstore":      memstoreRows,
	"redis":         redisRows,
	"jskv":          jskvRows,
	"pg":            pgRows,
	"txguard":       txguardRows,
	"jetstream":     jetstreamEmbeddedRows,
	"jetstream-url": jetstreamURLRows,
	"sqs":           sqsRows,
	"pubsub":        pubsubRows,
	"ordered":       orderedGroup,
}

func measure(ctx context.Context, c config, group string, r row) (string, error) {
	n := r.n
	if c.quick {
		n = max(n/50, int64(2*r.conc), 20)
	}
	var raw, dq, rawAllocs, dqAllocs, rawCPU, dqCPU []float64
	one := func(s side, label string, round int, rates, allocs, cpu *[]float64) error {
		lastTimed = -1
		before, cpuBefore := mallocs(), processCPU()
		var d time.Duration
		var err error
		labels := pprof.Labels("group", group, "case", r.name, "conc", strconv.Itoa(r.conc), "side", label)
		pprof.Do(ctx, labels, func(ctx context.Context) {
			d, err = s.run(ctx, round, n)
		})
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		a, t := lastTimed, lastTimedCPU
		if a < 0 {
			a, t = int64(mallocs()-before), processCPU()-cpuBefore
		}
		*rates = append(*rates, float64(n)/d.Seconds())
		*allocs = append(*allocs, float64(a)/float64(n))
		*cpu = append(*cpu, t.Seconds()*1e6/float64(n))
		return nil
	}
	for round := range c.rounds {
		if err := one(r.raw, "raw", round, &raw, &rawAllocs, &rawCPU); err != nil {
			return "", err
		}
		if err := one(r.dq, "dedupq", round, &dq, &dqAllocs, &dqCPU); err != nil {
			return "", err
		}
	}
	mr, md := median(raw), median(dq)
	ar, ad := median(rawAllocs), median(dqAllocs)
	cr, cd := median(rawCPU), median(dqCPU)
	goal := ""
	if r.goal > 0 {
		goal = fmt.Sprintf("≥ %.2f× %s", r.goal, verdict(md/mr >= r.goal))
	}
	allocGoal := ""
	if r.allocGoal {
		allocGoal = fmt.Sprintf("≤ raw+%d %s", allocSlack, verdict(ad <= ar+allocSlack))
	}
	return fmt.Sprintf("| %s | %s | %d | %s | %.0f | %.1f | %.1f | %s | %.0f | %.1f | %.1f | %.2f× | %s | %s |",
		group, r.name, r.conc, r.raw.name, mr, ar, cr, r.dq.name, md, ad, cd, md/mr, goal, allocGoal), nil
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuModel reads the CPU's name from /proc/cpuinfo where there is one.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
