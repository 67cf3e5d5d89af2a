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
// (PostgreSQL db test on 127.0.0.1:5432), jetstream (an embedded server)
// and jetstream-url (-nats-url).
package main

import (
	"bufio"
	"context"
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
var groups = []string{"mem", "memstore", "redis", "pg", "txguard", "jetstream", "jetstream-url"}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	only := fs.String("only", strings.Join(groups, ","), "comma-separated groups to run: "+strings.Join(groups, ", "))
	rounds := fs.Int("rounds", 5, "rounds per row; the table shows medians")
	quick := fs.Bool("quick", false, "few messages and one round: checks that everything works, measures nothing")
	natsURL := fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server for the jetstream-url group")
	redisAddr := fs.String("redis", "127.0.0.1:6379", "Redis address for the redis group")
	pgDSN := fs.String("pg", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "PostgreSQL DSN for the pg and txguard groups")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
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
	fmt.Fprintf(out, "Machine: %s, %d cores (GOMAXPROCS %d), %s %s/%s; %d round(s), medians.\n\n",
		cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, c.rounds)
	fmt.Fprintln(out, "| group | case | conc | raw | raw msgs/s | dedupq | dedupq msgs/s | ratio | goal |")
	fmt.Fprintln(out, "|---|---|---:|---|---:|---|---:|---:|---|")
	for _, g := range groups {
		if !c.only[g] {
			continue
		}
		rows, cleanup, err := setups[g](ctx, c)
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
	name    string
	conc    int
	n       int64 // messages per round; quick mode divides it
	goal    float64
	raw, dq side
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
}

func measure(ctx context.Context, c config, group string, r row) (string, error) {
	n := r.n
	if c.quick {
		n = max(n/50, int64(2*r.conc), 20)
	}
	var raw, dq []float64
	for round := range c.rounds {
		d, err := r.raw.run(ctx, round, n)
		if err != nil {
			return "", fmt.Errorf("%s: %w", r.raw.name, err)
		}
		raw = append(raw, float64(n)/d.Seconds())
		d, err = r.dq.run(ctx, round, n)
		if err != nil {
			return "", fmt.Errorf("%s: %w", r.dq.name, err)
		}
		dq = append(dq, float64(n)/d.Seconds())
	}
	mr, md := median(raw), median(dq)
	goal := ""
	if r.goal > 0 {
		verdict := "met"
		if md/mr < r.goal {
			verdict = "not met"
		}
		goal = fmt.Sprintf("≥ %.2f× %s", r.goal, verdict)
	}
	return fmt.Sprintf("| %s | %s | %d | %s | %.0f | %s | %.0f | %.2f× | %s |",
		group, r.name, r.conc, r.raw.name, mr, r.dq.name, md, md/mr, goal), nil
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
