package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/dedup/pgstore"
)

// broker is what the orchestrator needs of the backend under test.
type broker struct {
	// url is the queue URL the children open.
	url string
	// env is added to the children's environment.
	env []string
	// grouped gives messages ordering groups even in an unordered run
	// (SQS FIFO needs them).
	grouped bool
	// settled reports whether the broker holds no message, delivered or
	// not, and if not, what it still holds.
	settled func(ctx context.Context) (bool, string)
	// deadLettered counts the messages the broker gave up on.
	deadLettered func(ctx context.Context) int
	// cut, when set, stands between the children and a broker the run
	// does not restart.
	cut   *cutProxy
	close func()
}

// worker is one publisher or consumer process slot, started again after
// each kill or failure.
type worker struct {
	role      string // publish or consume
	index     int
	gen       int
	p         *proc
	instance  string
	killed    bool      // its current process was killed on purpose
	restartAt time.Time // when to start it again; zero while it runs
	finished  bool      // a publisher that sent everything
	failures  int

	// killAt, when positive, makes the publisher's output handler
	// SIGKILL it as soon as it reports that many sends: at once, not at
	// the next tick, by which a fast publisher may have finished.
	killAt    int64
	cur       atomic.Pointer[proc]
	killedMid atomic.Bool

	ready      atomic.Bool  // consumer: it handles SIGTERM (it said "ready")
	progress   atomic.Int64 // publisher: sends so far
	deliveries atomic.Int64 // consumer: deliveries so far
	stats      atomic.Pointer[consumerStats]
}

func (w *worker) name() string { return fmt.Sprintf("%s%d.%d", w.role[:1], w.index, w.gen) }

// lineWriter calls fn with each line written to it.
type lineWriter struct {
	mu  sync.Mutex
	buf []byte
	fn  func(string)
	tee io.Writer
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tee != nil {
		_, _ = l.tee.Write(p)
	}
	l.buf = append(l.buf, p...)
	for {
		i := strings.IndexByte(string(l.buf), '\n')
		if i < 0 {
			return len(p), nil
		}
		l.fn(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
}

// runProcesses runs one matrix entry with real processes and servers.
func runProcesses(ctx context.Context, cfg config, log *logger) (res *result, err error) {
	start := time.Now()
	res = &result{backend: cfg.backend, store: cfg.store}
	dir, err := os.MkdirTemp("", "dedupq-chaos-")
	if err != nil {
		return nil, err
	}
	// The servers may run as another user (postgres), who must reach
	// their folders.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	defer func() {
		if cfg.keep || err != nil || (res != nil && len(res.problems) > 0) {
			log.Printf("kept the work directory %s (server and process logs)", dir)
			return
		}
		os.RemoveAll(dir)
	}()
	serverLog, err := os.Create(filepath.Join(dir, "servers.log"))
	if err != nil {
		return nil, err
	}
	defer serverLog.Close()
	ps := &procs{}
	defer ps.stopAll()

	pg, err := newPostgres(ctx, ps, dir, serverLog)
	if err != nil {
		return nil, err
	}
	if err := pg.start(ctx); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, pg.dsn())
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := setupTables(ctx, pool); err != nil {
		return nil, err
	}
	servers := map[string]restarter{"pg": pg}
	var redisSrv *server
	if strings.HasPrefix(cfg.store, "redis") {
		if redisSrv, err = newRedis(ps, dir, cfg.store == "redis", serverLog); err != nil {
			return nil, err
		}
		if err := redisSrv.start(ctx); err != nil {
			return nil, err
		}
		servers["redis"] = redisSrv
	}
	var b *broker
	switch cfg.backend {
	case "jetstream":
		nats, err := newNATS(ctx, ps, dir, serverLog)
		if err != nil {
			return nil, err
		}
		if err := nats.start(ctx); err != nil {
			return nil, err
		}
		servers["nats"] = nats
		if b, err = jetstreamBroker(ctx, nats.addr()); err != nil {
			return nil, err
		}
	case "sqs":
		if b, err = sqsBroker(ctx); err != nil {
			return nil, err
		}
		servers["sqs"] = b.cut
	}
	defer b.close()
	var names []string
	for _, n := range []string{"nats", "sqs", "pg", "redis"} {
		if servers[n] != nil {
			names = append(names, n)
		}
	}
	log.Printf("servers up (%s) in %s; work directory %s", strings.Join(names, ", "), time.Since(start).Round(time.Millisecond), dir)

	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	groups := 0
	switch {
	case cfg.ordered:
		groups = cfg.groups
	case b.grouped:
		groups = unorderedGroups
	}
	startWorker := func(w *worker) error {
		w.gen++
		w.instance = w.name()
		w.killed, w.restartAt = false, time.Time{}
		w.ready.Store(false)
		w.progress.Store(0)
		w.deliveries.Store(0)
		var args []string
		if w.role == "publish" {
			args = []string{"-url", b.url, "-n", strconv.Itoa(cfg.n), "-seed", strconv.FormatUint(cfg.seed, 10),
				"-dup", strconv.FormatFloat(cfg.dupRatio, 'g', -1, 64), "-publishers", strconv.Itoa(cfg.publishers),
				"-index", strconv.Itoa(w.index), "-groups", strconv.Itoa(groups)}
		} else {
			args = []string{"-url", b.url, "-store", cfg.store, "-pg", pg.dsn(), "-instance", w.instance,
				"-concurrency", strconv.Itoa(cfg.concurrency), "-ordered=" + strconv.FormatBool(cfg.ordered),
				"-group-backlog", strconv.Itoa(groupBacklog(cfg))}
			if redisSrv != nil {
				args = append(args, "-redis", redisSrv.addr())
			}
		}
		errLog, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s%d.log", w.role, w.index)), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		fmt.Fprintf(errLog, "--- %s started at %s\n", w.instance, time.Now().Format(time.TimeOnly))
		out := &lineWriter{fn: func(line string) { w.line(line) }}
		var errOut io.Writer = errLog
		if cfg.verbose {
			errOut = io.MultiWriter(errLog, prefixWriter(os.Stderr, w.instance+": "))
		}
		p, err := ps.start(w.instance, spec{path: self, args: args, env: append([]string{roleEnv + "=" + w.role}, b.env...), stdout: out, stderr: errOut})
		if err != nil {
			errLog.Close()
			return err
		}
		go func() { <-p.exited; errLog.Close() }()
		w.p = p
		w.cur.Store(p)
		return nil
	}

	consumers := make([]*worker, cfg.consumers)
	for i := range consumers {
		consumers[i] = &worker{role: "consume", index: i}
		if err := startWorker(consumers[i]); err != nil {
			return nil, err
		}
	}
	sends := len(sendOrder(cfg.n, 0, cfg.publishers, cfg.dupRatio, cfg.seed))
	pubKillAt := publisherKillAt(cfg, sends)
	publishers := make([]*worker, cfg.publishers)
	for i := range publishers {
		publishers[i] = &worker{role: "publish", index: i}
		if i == 0 {
			publishers[i].killAt = int64(pubKillAt)
		}
		if err := startWorker(publishers[i]); err != nil {
			return nil, err
		}
	}
	defer func() {
		// However the run ends, the children go first, by PID.
		for _, w := range append(publishers, consumers...) {
			if w.p != nil && !w.p.done() {
				w.p.stop(syscall.SIGKILL, 5*time.Second)
			}
		}
	}()

	var serverNames []string
	for _, n := range names {
		serverNames = append(serverNames, n)
	}
	faults := schedule(cfg, serverNames)
	pubKilled := false
	rng := rand.New(rand.NewPCG(cfg.seed, 0x5eed))
	var outages []outage
	type watch struct {
		w          *worker
		gen        int
		deliveries int64
		effects    int
		after      string
	}
	var watches []watch

	effectsNow := func() (int, error) {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var n int
		err := pool.QueryRow(qctx, `SELECT count(*) FROM effects`).Scan(&n)
		return n, err
	}
	hardDeadline := time.Now().Add(cfg.settle + 20*time.Minute)
	var settleDeadline time.Time
	effects := 0
	settledOnce := false
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			runErr = ctx.Err()
			break loop
		case <-tick.C:
		}
		if n, err := effectsNow(); err == nil {
			effects = n
		}
		now := time.Now()
		// Faults due.
		for _, f := range faults {
			if f.fired || effects < f.at {
				continue
			}
			switch f.kind {
			case "kill-consumer":
				w := consumers[f.index]
				if w.p == nil || w.p.done() {
					continue // between processes: kill the next one
				}
				log.Printf("fault: SIGKILL consumer %s (pid %d) at %d effects", w.instance, w.p.pid(), effects)
				w.killed = true
				w.p.stop(syscall.SIGKILL, 5*time.Second)
				w.restartAt = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
			default:
				name := strings.TrimPrefix(f.kind, "restart-")
				srv := servers[name]
				log.Printf("fault: restarting %s (%s) at %d effects", name, srv.describe(), effects)
				o, err := srv.restart(ctx, time.Second)
				outages = append(outages, o)
				if err != nil {
					runErr = err
					break loop
				}
				log.Printf("fault: %s is back after %s", name, o.end.Sub(o.start).Round(time.Millisecond))
				for _, w := range consumers {
					if w.p != nil && !w.p.done() {
						watches = append(watches, watch{w: w, gen: w.gen, deliveries: w.deliveries.Load(), effects: effects, after: name + " restart"})
					}
				}
			}
			f.fired = true
		}
		// The publisher killed mid-stream (by its output handler).
		if p := publishers[0]; !pubKilled && p.killedMid.Load() && p.p.done() {
			pubKilled = true
			log.Printf("fault: SIGKILLed publisher %s (pid %d) after %d of %d sends; it starts again from the beginning", p.instance, p.p.pid(), p.progress.Load(), sends)
			p.killed = true
			p.restartAt = now
		}
		// Exits and restarts.
		for _, w := range append(publishers, consumers...) {
			if w.finished {
				continue
			}
			if w.restartAt.IsZero() && w.p.done() {
				code := w.p.cmd.ProcessState.ExitCode()
				switch {
				case w.role == "publish" && code == 0:
					w.finished = true
					log.Debugf("publisher %s sent all its messages", w.instance)
					continue
				case w.killed:
				default:
					w.failures++
					log.Printf("%s exited on its own (%v); starting it again in 1s (see %s%d.log)", w.instance, w.p.err, w.role, w.index)
					if w.failures > 30 {
						runErr = fmt.Errorf("%s failed %d times", w.instance, w.failures)
						break loop
					}
				}
				w.restartAt = now.Add(time.Second)
			}
			if !w.restartAt.IsZero() && !now.Before(w.restartAt) {
				if err := startWorker(w); err != nil {
					runErr = err
					break loop
				}
				log.Debugf("started %s", w.instance)
			}
		}
		published := true
		for _, w := range publishers {
			published = published && w.finished
		}
		if published && !pubKilled {
			pubKilled = true
			res.problem("publisher 0 sent everything before its kill at %d sends: the run proves less than it should", pubKillAt)
		}
		if !published || !allFired(faults) {
			if now.After(hardDeadline) {
				runErr = fmt.Errorf("publishing did not finish in time: %d effects so far", effects)
				break
			}
			continue
		}
		if settleDeadline.IsZero() {
			settleDeadline = now.Add(cfg.settle)
			log.Printf("all published and every fault fired at %d effects; waiting for the broker to settle", effects)
		}
		ok, what := b.settled(ctx)
		switch {
		case ok && settledOnce:
			break loop
		case ok:
			settledOnce = true // once more, a tick later
		default:
			settledOnce = false
			if now.After(settleDeadline) {
				runErr = fmt.Errorf("not settled within %s: %s", cfg.settle, what)
				break loop
			}
		}
	}

	// Stop the consumers cleanly: each must return within its
	// ShutdownTimeout, and leave nothing open.
	var wg sync.WaitGroup
	for _, w := range consumers {
		if w.p == nil || w.p.done() {
			continue
		}
		wg.Go(func() {
			// One started a moment ago (after a kill) may not handle
			// SIGTERM yet, which would kill it.
			for deadline := time.Now().Add(time.Minute); !w.ready.Load() && !w.p.done() && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			limit := shutdownTimeout + settleTimeout + 10*time.Second
			if !w.p.stop(syscall.SIGTERM, limit) {
				res.problem("consumer %s did not exit within %s of SIGTERM", w.instance, limit)
				return
			}
			switch code := w.p.cmd.ProcessState.ExitCode(); code {
			case 0:
			case 3:
				res.problem("consumer %s leaked at shutdown (see consume%d.log)", w.instance, w.index)
			default:
				res.problem("consumer %s exited %d at shutdown (see consume%d.log)", w.instance, code, w.index)
			}
		})
	}
	wg.Wait()
	var guardUnrecorded uint64
	for _, w := range consumers {
		st := w.stats.Load()
		if st == nil {
			continue
		}
		guardUnrecorded += st.Guard.Unrecorded
		if took := time.Duration(st.ShutdownMillis) * time.Millisecond; took > shutdownTimeout+settleTimeout {
			res.problem("consumer %s took %s to stop, over its ShutdownTimeout %s (+ SettleTimeout %s)", w.instance, took, shutdownTimeout, settleTimeout)
		}
	}
	// A consumer that lived through a server restart must receive again
	// afterwards, if the others found plenty of work (here, more than 50
	// effects per consumer) after it.
	for _, wt := range watches {
		if wt.w.gen == wt.gen && wt.w.deliveries.Load() == wt.deliveries && effects-wt.effects > 50*cfg.consumers {
			res.problem("consumer %s received nothing after the %s", wt.w.instance, wt.after)
		}
	}
	if runErr != nil {
		res.wall = time.Since(start)
		return res, runErr
	}

	res.deadLettered = b.deadLettered(ctx)
	rows, err := readEffects(ctx, pool)
	if err != nil {
		return res, err
	}
	res.wall = time.Since(start)
	tally(res, cfg.n, rows, outages)
	if cfg.ordered {
		checkGroupOrder(res, cfg.groups, rows)
	}
	verdict(res)
	log.Printf("repeats by cause: %v; guards of cleanly stopped consumers counted %d unrecorded", res.causes, guardUnrecorded)
	return res, nil
}

// line handles one line of a child's standard output.
func (w *worker) line(s string) {
	word, rest, _ := strings.Cut(s, " ")
	switch word {
	case "ready":
		w.ready.Store(true)
	case "progress":
		if n, err := strconv.ParseInt(rest, 10, 64); err == nil {
			w.progress.Store(n)
			if p := w.cur.Load(); w.killAt > 0 && n >= w.killAt && p != nil && w.killedMid.CompareAndSwap(false, true) {
				_ = p.cmd.Process.Kill()
			}
		}
	case "tick":
		if n, err := strconv.ParseInt(rest, 10, 64); err == nil {
			w.deliveries.Store(n)
		}
	case "stats":
		var st consumerStats
		if json.Unmarshal([]byte(rest), &st) == nil {
			w.deliveries.Store(st.Deliveries)
			w.stats.Store(&st)
		}
	}
}

// setupTables creates the effects table, on purpose without a unique
// constraint, and the dedup store's table. seq numbers the effects in the
// order their inserts ran: a message's handler starts after the one
// before it in its group committed, so an ordered run's effects must
// follow their groups' order in seq.
func setupTables(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, `CREATE TABLE effects (
	seq      bigserial   NOT NULL,
	id       int         NOT NULL,
	instance text        NOT NULL,
	attempt  int         NOT NULL,
	recorded boolean     NOT NULL,
	at       timestamptz NOT NULL DEFAULT clock_timestamp()
)`); err != nil {
		return fmt.Errorf("creating the effects table: %w", err)
	}
	return pgstore.EnsureSchema(ctx, pool, pgstore.DefaultTable)
}

func readEffects(ctx context.Context, pool *pgxpool.Pool) ([]effect, error) {
	rows, err := pool.Query(ctx, `SELECT id, instance, recorded, at FROM effects ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("reading the effects: %w", err)
	}
	defer rows.Close()
	var out []effect
	for rows.Next() {
		var e effect
		if err := rows.Scan(&e.id, &e.instance, &e.recorded, &e.at); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// prefixWriter prefixes each line written to w.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	return &lineWriter{fn: func(line string) { fmt.Fprintln(w, prefix+line) }}
}
