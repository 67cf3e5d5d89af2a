// Command bench measures dedupq beside the raw SDK it wraps, in one process,
// over several rounds, and prints a markdown table of the median rates and
// their ratios together with the machine it ran on:
//
//	go run ./bench                       # everything, 5 rounds
//	go run ./bench -only redis,pg -rounds 7
//	go run ./bench -quick -only mem,memstore
//
// Raw and dedupq sides of a row run alternately within each round, so that
// load from other processes hits both alike; compare ratios, not rates.
// Groups: mem, memstore, redis (127.0.0.1:6379), pg and txguard
// (PostgreSQL db test on 127.0.0.1:5432), jetstream (an embedded server),
// jetstream-url (-nats-url), sqs (fauxqs, the npm emulator under
// localstack/fauxqs, or FAUXQS_ENDPOINT) and pubsub (pstest, served by a
// child process of this program).
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
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
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
	rounds  int
	quick   bool
	natsURL string
	redis   string
	pgDSN   string
}

// groups in the order they run and print.
var groups = []string{"mem", "memstore", "redis", "pg", "txguard", "jetstream", "jetstream-url", "sqs", "pubsub"}

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
	if err := fs.Parse(args); err != nil {
		return err
	}
	c := config{only: map[string]bool{}, rounds: *rounds, quick: *quick, natsURL: *natsURL, redis: *redisAddr, pgDSN: *pgDSN}
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
	fmt.Fprintln(out, "| group | case | conc | raw | raw msgs/s | raw allocs/msg | dedupq | dedupq msgs/s | dedupq allocs/msg | ratio | goal | allocs goal |")
	fmt.Fprintln(out, "|---|---|---:|---|---:|---:|---|---:|---:|---:|---|---|")
	var skipped []string
	defer func() {
		if len(skipped) > 0 {
			fmt.Fprintln(out)
			for _, s := range skipped {
				fmt.Fprintln(out, "Skipped:", s)
			}
		}
	}()
	for _, g := range groups {
		if !c.only[g] {
			continue
		}
		rows, cleanup, err := setups[g](ctx, c)
		if errors.Is(err, errUnavailable) {
			skipped = append(skipped, fmt.Sprintf("%s: %v", g, err))
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %w", g, err)
		}
		for _, r := range rows {
			line, err := measure(ctx, c, g, r)
			if err != nil {
				cleanup()
				return fmt.Errorf("%s %s c=%d: %w", g, r.name, r.conc, err)
			}
			fmt.Fprintln(out, line)
		}
		cleanup()
	}
	return nil
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
// whole process makes meanwhile.
type stopwatch struct {
	start   time.Time
	mallocs uint64
}

// lastTimed holds the mallocs of the last stopwatch stopped, or -1: measure
// uses it for a side that times part of its run, and the whole run's
// mallocs for one that does not (the store rows, which have no setup).
var lastTimed int64 = -1

func mallocs() uint64 {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Mallocs
}

func startWatch() stopwatch { return stopwatch{mallocs: mallocs(), start: time.Now()} }

// stop returns the time since startWatch and records the allocations in
// lastTimed. Sides run one at a time, so one variable is enough.
func (w stopwatch) stop() time.Duration {
	d := time.Since(w.start)
	lastTimed = int64(mallocs() - w.mallocs)
	return d
}

// setups build a group's rows against its server, and a cleanup.
var setups = map[string]func(ctx context.Context, c config) ([]row, func(), error){
	"mem":           memRows,
	"memstore":      memstoreRows,
	"redis":         redisRows,
	"pg":            pgRows,
	"txguard":       txguardRows,
	"jetstream":     jetstreamEmbeddedRows,
	"jetstream-url": jetstreamURLRows,
	"sqs":           sqsRows,
	"pubsub":        pubsubRows,
}

func measure(ctx context.Context, c config, group string, r row) (string, error) {
	n := r.n
	if c.quick {
		n = max(n/50, int64(2*r.conc), 20)
	}
	var raw, dq, rawAllocs, dqAllocs []float64
	one := func(s side, round int, rates, allocs *[]float64) error {
		lastTimed = -1
		before := mallocs()
		d, err := s.run(ctx, round, n)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		a := lastTimed
		if a < 0 {
			a = int64(mallocs() - before)
		}
		*rates = append(*rates, float64(n)/d.Seconds())
		*allocs = append(*allocs, float64(a)/float64(n))
		return nil
	}
	for round := range c.rounds {
		if err := one(r.raw, round, &raw, &rawAllocs); err != nil {
			return "", err
		}
		if err := one(r.dq, round, &dq, &dqAllocs); err != nil {
			return "", err
		}
	}
	mr, md := median(raw), median(dq)
	ar, ad := median(rawAllocs), median(dqAllocs)
	goal := ""
	if r.goal > 0 {
		goal = fmt.Sprintf("≥ %.2f× %s", r.goal, verdict(md/mr >= r.goal))
	}
	allocGoal := ""
	if r.allocGoal {
		allocGoal = fmt.Sprintf("≤ raw+%d %s", allocSlack, verdict(ad <= ar+allocSlack))
	}
	return fmt.Sprintf("| %s | %s | %d | %s | %.0f | %.1f | %s | %.0f | %.1f | %.2f× | %s | %s |",
		group, r.name, r.conc, r.raw.name, mr, ar, r.dq.name, md, ad, md/mr, goal, allocGoal), nil
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
