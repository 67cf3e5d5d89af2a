// These tests talk to the real PostgreSQL server at 127.0.0.1:5432, database
// test, role postgres, trust auth (override with DEDUPQ_PG_DSN). Without it
// they skip, unless CI is set, when they fail. Each run creates its own
// tables with random names and drops them afterwards, so parallel runs on
// one server do not collide. TestCrashAtEveryStep also starts copies of the
// test binary and kills them with SIGKILL.
package pgstore_test

import (
	"bufio"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/dedup/storetest"
	"github.com/dedupq/dedupq/internal/testutil"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

var _ dedup.Store = (*pgstore.Store)(nil)

func dsn() string {
	return cmp.Or(os.Getenv("DEDUPQ_PG_DSN"), "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

func TestMain(m *testing.M) {
	if os.Getenv(envCrashStep) != "" {
		crashChild()
		return
	}
	os.Exit(m.Run())
}

// connect returns a pool on the real server, closed when tb ends.
func connect(tb testing.TB, maxConns int32, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn())
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = maxConns
	for _, f := range configure {
		f(cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		if os.Getenv("CI") == "" {
			tb.Skipf("PostgreSQL at %s is unreachable (%v); skipping because CI is unset", dsn(), err)
		}
		tb.Fatalf("PostgreSQL at %s is unreachable under CI: %v", dsn(), err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func randomName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// newTable creates a dedup table no other run uses and drops it when tb
// ends.
func newTable(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	name := randomName("dedupq_test_")
	if err := pgstore.EnsureSchema(context.Background(), pool, name); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

// newEffects creates a table for handlers' effects, dropped when tb ends.
func newEffects(tb testing.TB, pool *pgxpool.Pool) string {
	tb.Helper()
	name := randomName("dedupq_effects_")
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+name+" (msg text NOT NULL)"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

func effects(t *testing.T, pool *pgxpool.Pool, table, msg string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE msg = $1", msg).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func newStore(tb testing.TB, db pgstore.DB, o pgstore.Options) *pgstore.Store {
	tb.Helper()
	s, err := pgstore.New(db, o)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	pool := connect(t, 16)
	table := newTable(t, pool)
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{
		{"Batched", 0},
		{"OneCallPerStatement", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := randomName("ns-")
			storetest.Run(t, func(t *testing.T) dedup.Store {
				return newStore(t, pool, pgstore.Options{Table: table, Namespace: ns, MaxBatch: tc.maxBatch})
			},
				storetest.WithDurations(500*time.Millisecond, 500*time.Millisecond))
		})
	}
}

func TestSchema(t *testing.T) {
	pool := connect(t, 8)
	ctx := context.Background()
	name := randomName("dedupq_test_")
	t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+name) })
	// Consumers starting together all ensure the schema at once.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- pgstore.EnsureSchema(ctx, pool, name) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent EnsureSchema: %v", err)
		}
	}
	var indexed bool
	err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_indexes WHERE tablename = $1 AND indexdef LIKE '%(expires_at)%')`, name).Scan(&indexed)
	if err != nil || !indexed {
		t.Fatalf("expiry index missing (err %v)", err)
	}
	for _, tc := range []struct {
		table string
		ok    bool
		want  string
	}{
		{"", true, `CREATE TABLE IF NOT EXISTS "dedupq_keys"`},
		{"ops.dedup", true, `CREATE TABLE IF NOT EXISTS "ops"."dedup"`},
		{`we"ird`, true, `"we""ird"`},
		{"a.b.c", false, ""},
		{"a.", false, ""},
	} {
		sql, err := pgstore.Migration(tc.table)
		if (err == nil) != tc.ok || !strings.Contains(sql, tc.want) {
			t.Errorf("Migration(%q) = %q, %v; want it to contain %q (ok %v)", tc.table, sql, err, tc.want, tc.ok)
		}
	}
}

func TestUnreachableIsStoreUnavailable(t *testing.T) {
	cfg, err := pgxpool.ParseConfig("postgres://postgres@127.0.0.1:1/test?sslmode=disable&connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := newStore(t, pool, pgstore.Options{})
	ctx := context.Background()
	_, err = s.Claim(ctx, "k", "fp", time.Second)
	if !errors.Is(err, dedup.ErrStoreUnavailable) {
		t.Errorf("Claim: err = %v, want ErrStoreUnavailable", err)
	}
	_, err = s.Do(ctx, "k", "fp", time.Second, func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil })
	if !errors.Is(err, dedup.ErrStoreUnavailable) {
		t.Errorf("Do: err = %v, want ErrStoreUnavailable", err)
	}
}

// A claim that finds its key in progress or completed answers without
// locking the row: were it to lock it, as ON CONFLICT DO UPDATE does even
// when its WHERE refuses the update, the redeliveries of a key in progress
// would queue its holder's completion behind their commits (and their disk
// flushes). Here another transaction holds the row lock; the claims must
// answer while it does, and the holder's completion must not be needed.
func TestClaimOfLiveKeyTakesNoRowLock(t *testing.T) {
	pool := connect(t, 4)
	ctx := context.Background()
	table := newTable(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
	done, err := s.Claim(ctx, "done", "fp-done", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, "done", done.Token, time.Hour, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(ctx, "busy", "fp-busy", time.Hour); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+table+" WHERE key IN ('done', 'busy') FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for _, tc := range []struct {
		key  string
		want dedup.State
		fp   string
	}{{"done", dedup.Completed, "fp-done"}, {"busy", dedup.InProgress, "fp-busy"}} {
		c, err := s.Claim(cctx, tc.key, "fp-other", time.Hour)
		if err != nil {
			t.Fatalf("Claim of %s while another transaction locks its row: %v", tc.want, err)
		}
		if c.State != tc.want || c.Fingerprint != tc.fp {
			t.Fatalf("Claim = %s with fingerprint %q, want %s with %q", c.State, c.Fingerprint, tc.want, tc.fp)
		}
	}
}

// waitForLockWait polls until a backend other than the test's own waits
// for a row lock on table, which is where a claim queues behind a takeover
// that has not committed yet.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var n int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() AND position($1 in query) > 0`, table).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the claim never waited for the takeover's row lock")
		}
		tm := time.NewTimer(5 * time.Millisecond)
		<-tm.C
	}
}

// Two claimants race on a key whose record has expired: the statement's
// snapshot still shows the old record, the upsert waits for the row lock of
// the other claimant's takeover, which commits, and ON CONFLICT … WHERE
// expires_at <= now() then rightly refuses. The answer must describe the
// takeover the refusal was decided on (the latest committed row), not the
// expired record of the snapshot: answering Completed there makes the
// Guard ack a delivery that nobody processed, and the old fingerprint makes
// a reused key look like a conflict.
func TestClaimRacingTakeoverAnswersFromLatestRow(t *testing.T) {
	pool := connect(t, 8)
	ctx := context.Background()
	table := newTable(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
	takeover := map[string]string{
		// What another Claim writes when it takes the key over.
		"claim": `UPDATE ` + table + ` SET token = 't-new', fingerprint = 'fp-new', completed = false,
			locked_until = now() + interval '1 hour', expires_at = now() + interval '1 hour', result = NULL
			WHERE namespace = 'default' AND key = $1`,
		// What Do writes: the key completed with the handler's effect.
		"do": `UPDATE ` + table + ` SET token = 't-new', fingerprint = 'fp-new', completed = true,
			locked_until = NULL, expires_at = now() + interval '1 hour', result = 'new'
			WHERE namespace = 'default' AND key = $1`,
	}
	for _, tc := range []struct {
		name         string
		oldCompleted bool // the expired record: a completion past its TTL, or a lapsed claim
		by           string
		want         dedup.State
	}{
		{"ExpiredCompletionTakenByClaim", true, "claim", dedup.InProgress},
		{"LapsedClaimTakenByClaim", false, "claim", dedup.InProgress},
		{"ExpiredCompletionTakenByDo", true, "do", dedup.Completed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := randomName("race-")
			_, err := pool.Exec(ctx, `INSERT INTO `+table+` (namespace, key, token, fingerprint, completed, locked_until, expires_at, result)
				VALUES ('default', $1, 't-old', 'fp-old', $2, now() - interval '1 minute', now() - interval '1 minute', 'old')`, key, tc.oldCompleted)
			if err != nil {
				t.Fatal(err)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, takeover[tc.by], key); err != nil {
				t.Fatal(err)
			}
			type answer struct {
				c   dedup.Claim
				err error
			}
			got := make(chan answer, 1)
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			go func() {
				c, err := s.Claim(cctx, key, "fp-claimant", time.Hour)
				got <- answer{c, err}
			}()
			waitForLockWait(t, pool, table)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			a := <-got
			if a.err != nil {
				t.Fatalf("Claim: %v", a.err)
			}
			if a.c.State != tc.want || a.c.Fingerprint != "fp-new" {
				t.Fatalf("Claim racing a takeover = %s with fingerprint %q, want %s with the new holder's %q", a.c.State, a.c.Fingerprint, tc.want, "fp-new")
			}
			if tc.want == dedup.InProgress && time.Until(a.c.LeaseUntil) < 30*time.Minute {
				t.Fatalf("LeaseUntil = %s, want the new holder's, about an hour ahead", a.c.LeaseUntil)
			}
			if tc.want == dedup.Completed && string(a.c.Result) != "new" {
				t.Fatalf("Result = %q, want the new holder's %q", a.c.Result, "new")
			}
		})
	}
}

func TestSweep(t *testing.T) {
	pool := connect(t, 8)
	ctx := context.Background()
	table := newTable(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
	// 2500 expired rows, in the past by the server's own clock.
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (namespace, key, token, fingerprint, completed, expires_at)
		SELECT 'default', 'old-' || g, 't', 'fp', true, now() - interval '1 minute' FROM generate_series(1, 2500) g`)
	if err != nil {
		t.Fatal(err)
	}
	held, err := s.Claim(ctx, "lapsed", "fp-held", time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	live, err := s.Claim(ctx, "live", "fp", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	// Wait out the 1ms lease by the server's clock, which is the one that
	// counts.
	deadline := time.Now().Add(5 * time.Second)
	for {
		var lapsed bool
		if err := pool.QueryRow(ctx, "SELECT expires_at < now() FROM "+table+" WHERE key = 'lapsed'").Scan(&lapsed); err != nil {
			t.Fatal(err)
		}
		if lapsed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("1ms lease never lapsed")
		}
	}
	n, err := s.Sweep(ctx, 1000)
	if err != nil || n != 2501 {
		t.Fatalf("Sweep = %d, %v; want 2501 rows (2500 old completions and a lapsed claim)", n, err)
	}
	if n, err := s.Sweep(ctx, 1000); err != nil || n != 0 {
		t.Fatalf("second Sweep = %d, %v; want nothing left", n, err)
	}
	// The swept claim was never taken over: its holder can still complete.
	if err := s.Complete(ctx, "lapsed", held.Token, time.Hour, []byte("r")); err != nil {
		t.Fatalf("Complete after sweep: %v", err)
	}
	c, err := s.Claim(ctx, "lapsed", "other", time.Second)
	if err != nil || c.State != dedup.Completed || c.Fingerprint != "fp-held" || string(c.Result) != "r" {
		t.Fatalf("Claim after sweep and Complete = %+v, %v", c, err)
	}
	if err := s.Complete(ctx, "live", live.Token, time.Hour, nil); err != nil {
		t.Fatalf("the live claim was swept: %v", err)
	}

	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.RunSweeper(sctx, time.Millisecond, 10, func(err error) { t.Error(err) }) }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunSweeper returned %v after cancel", err)
	}
}

// TestRestart restarts the consumer in the middle of processing: the first
// store instance claims and dies without completing; a new instance on a
// new pool finds the message in progress until the lease runs out, then
// processes it once, and the dead instance's token can no longer complete
// it.
func TestRestart(t *testing.T) {
	ctx := context.Background()
	table := newTable(t, connect(t, 2))
	const lease = 700 * time.Millisecond

	first := connect(t, 2)
	held, err := newStore(t, first, pgstore.Options{Table: table}).Claim(ctx, "msg", "fp", lease)
	if err != nil || held.State != dedup.Acquired {
		t.Fatalf("first claim = %+v, %v", held, err)
	}
	first.Close() // the crash: no Complete, no Release

	after := newStore(t, connect(t, 2), pgstore.Options{Table: table})
	completions := 0
	var leaseUntil time.Time
	deadline := time.Now().Add(10 * time.Second)
	for completions == 0 {
		c, err := after.Claim(ctx, "msg", "fp", lease)
		switch {
		case err != nil:
			t.Fatal(err)
		case c.State == dedup.InProgress:
			leaseUntil = c.LeaseUntil
		case c.State == dedup.Acquired:
			if leaseUntil.IsZero() {
				t.Fatal("the restarted consumer acquired the message at once; the crashed one's lease should hold it")
			}
			if early := time.Until(leaseUntil); early > 50*time.Millisecond {
				t.Fatalf("reprocessed %s before the crashed consumer's lease ended", early)
			}
			if err := after.Complete(ctx, "msg", c.Token, time.Minute, nil); err != nil {
				t.Fatal(err)
			}
			completions++
			continue
		default:
			t.Fatalf("claim = %s before anyone completed", c.State)
		}
		if time.Now().After(deadline) {
			t.Fatal("message still in progress long after the lease")
		}
		tm := time.NewTimer(20 * time.Millisecond)
		<-tm.C
	}
	if err := after.Complete(ctx, "msg", held.Token, time.Minute, nil); !errors.Is(err, dedup.ErrLeaseLost) {
		t.Fatalf("the crashed consumer's Complete: err = %v, want ErrLeaseLost", err)
	}
	if c, err := after.Claim(ctx, "msg", "fp", lease); err != nil || c.State != dedup.Completed {
		t.Fatalf("after processing: %+v, %v; want completed", c, err)
	}
}

// deliver is one consumer's handling of message key through Do: the
// effect is a row in the effects table. at is called at each step, so that
// a test can stop the process there.
func deliver(ctx context.Context, s *pgstore.Store, effects, key string, at func(step string)) (pgstore.Outcome, error) {
	out, err := s.Do(ctx, key, "fp", time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		at("before-write")
		if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" (msg) VALUES ($1)", key); err != nil {
			return nil, err
		}
		at("after-write")
		return []byte("charged"), nil
	})
	if err == nil {
		at("after-commit") // the ack would go here
	}
	return out, err
}

const (
	envCrashStep    = "PGSTORE_CRASH_STEP"
	envCrashTable   = "PGSTORE_CRASH_TABLE"
	envCrashEffects = "PGSTORE_CRASH_EFFECTS"
)

// crashChild is the consumer process of TestCrashAtEveryStep: it delivers
// one message, says when it reaches the step, and hangs there until killed.
func crashChild() {
	step := os.Getenv(envCrashStep)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn())
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	s, err := pgstore.New(pool, pgstore.Options{Table: os.Getenv(envCrashTable)})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	_, err = deliver(ctx, s, os.Getenv(envCrashEffects), step, func(at string) {
		if at == step {
			fmt.Println("reached", step)
			select {} // hang until SIGKILL
		}
	})
	fmt.Println("error: finished without reaching the step:", err)
	os.Exit(2)
}

// TestCrashAtEveryStep kills a consumer process with SIGKILL at each step
// of handling a message, then redelivers the message to a fresh consumer,
// as the broker would: every time the effect happens exactly once.
func TestCrashAtEveryStep(t *testing.T) {
	pool := connect(t, 4)
	table, fx := newTable(t, pool), newEffects(t, pool)
	for _, tc := range []struct {
		step    string
		wantRan bool // whether the redelivery must run the handler
	}{
		{"before-write", true},
		{"after-write", true},
		{"after-commit", false},
	} {
		t.Run(tc.step, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0])
			cmd.Env = append(os.Environ(), envCrashStep+"="+tc.step, envCrashTable+"="+table, envCrashEffects+"="+fx)
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			line, _ := bufio.NewReader(out).ReadString('\n')
			if strings.TrimSpace(line) != "reached "+tc.step {
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("consumer said %q, want it to reach %s", line, tc.step)
			}
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			_ = cmd.Wait()

			// The redelivery, to a consumer started afresh.
			s := newStore(t, connect(t, 2), pgstore.Options{Table: table})
			got, err := deliver(ctx, s, fx, tc.step, func(string) {})
			if err != nil {
				t.Fatalf("redelivery: %v", err)
			}
			if got.Ran != tc.wantRan || string(got.Result) != "charged" {
				t.Fatalf("redelivery = %+v, want Ran %v with result charged", got, tc.wantRan)
			}
			// And one more, late duplicate.
			if got, err := deliver(ctx, s, fx, tc.step, func(string) {}); err != nil || got.Ran {
				t.Fatalf("duplicate = %+v, %v; want skipped", got, err)
			}
			if n := effects(t, pool, fx, tc.step); n != 1 {
				t.Fatalf("effect happened %d times, want exactly once", n)
			}
		})
	}
}

func TestDoConcurrentDeliveries(t *testing.T) {
	pool := connect(t, 16)
	table, fx := newTable(t, pool), newEffects(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
	var ran, skipped atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 64 {
		wg.Go(func() {
			<-start
			out, err := deliver(context.Background(), s, fx, "msg", func(string) {})
			switch {
			case err != nil:
				t.Error(err)
			case out.Ran:
				ran.Add(1)
			default:
				skipped.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if ran.Load() != 1 || skipped.Load() != 63 || effects(t, pool, fx, "msg") != 1 {
		t.Fatalf("64 concurrent deliveries: %d ran, %d skipped, %d effects; want 1, 63, 1", ran.Load(), skipped.Load(), effects(t, pool, fx, "msg"))
	}
}

func TestDo(t *testing.T) {
	pool := connect(t, 4)
	ctx := context.Background()
	table, fx := newTable(t, pool), newEffects(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
	write := func(key string, err error) pgstore.TxFunc {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, e := tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", key); e != nil {
				return nil, e
			}
			return nil, err
		}
	}
	boom := errors.New("boom")

	// A failing handler leaves neither effect nor record: the next
	// delivery runs it again.
	if _, err := s.Do(ctx, "fails-once", "fp", time.Hour, write("fails-once", boom)); !errors.Is(err, boom) {
		t.Fatalf("Do with a failing handler: err = %v, want the handler's", err)
	}
	if out, err := s.Do(ctx, "fails-once", "fp", time.Hour, write("fails-once", nil)); err != nil || !out.Ran {
		t.Fatalf("Do after a failure = %+v, %v; want ran", out, err)
	}
	if n := effects(t, pool, fx, "fails-once"); n != 1 {
		t.Fatalf("%d effects after a failure and a retry, want 1", n)
	}

	// The same key with another payload is reported, not skipped.
	_, err := s.Do(ctx, "fails-once", "other-fp", time.Hour, write("fails-once", nil))
	var conflict *dedup.ConflictError
	if !errors.As(err, &conflict) || conflict.Stored != "fp" || conflict.StoredWhen != dedup.Completed {
		t.Fatalf("Do with another fingerprint: err = %v, want a ConflictError on the completed key", err)
	}

	// A key held through the Store API is in progress for Do too.
	if _, err := s.Claim(ctx, "claimed", "fp", time.Hour); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Do(ctx, "claimed", "fp", time.Hour, write("claimed", nil)); !errors.Is(err, dedup.ErrInProgress) {
		t.Fatalf("Do on a claimed key: err = %v, want ErrInProgress", err)
	}

	// Code fn calls finds the transaction in its ctx: its writes commit,
	// and roll back, with the record.
	viaCtx := func(fail error) pgstore.TxFunc {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			got, err := pgstore.Tx(ctx)
			if err != nil {
				return nil, err
			}
			if got != tx {
				return nil, errors.New("Tx(ctx) is not fn's transaction")
			}
			if _, err := got.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ('via-ctx')"); err != nil {
				return nil, err
			}
			return nil, fail
		}
	}
	if _, err := s.Do(ctx, "via-ctx", "fp", time.Hour, viaCtx(boom)); !errors.Is(err, boom) {
		t.Fatalf("Do with a failing handler: err = %v, want the handler's", err)
	}
	if n := effects(t, pool, fx, "via-ctx"); n != 0 {
		t.Fatalf("a failing handler's write through Tx(ctx) left %d effects", n)
	}
	if out, err := s.Do(ctx, "via-ctx", "fp", time.Hour, viaCtx(nil)); err != nil || !out.Ran {
		t.Fatalf("Do writing through Tx(ctx) = %+v, %v; want ran", out, err)
	}
	if n := effects(t, pool, fx, "via-ctx"); n != 1 {
		t.Fatalf("%d effects written through Tx(ctx), want 1", n)
	}

	// A panic rolls back like an error.
	func() {
		defer func() { _ = recover() }()
		_, _ = s.Do(ctx, "panics", "fp", time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			_, _ = tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ('panics')")
			panic("handler bug")
		})
	}()
	if n := effects(t, pool, fx, "panics"); n != 0 {
		t.Fatalf("a panicking handler left %d effects", n)
	}
	if c, err := s.Claim(ctx, "panics", "fp", time.Second); err != nil || c.State != dedup.Acquired {
		t.Fatalf("key after a panic = %+v, %v; want free", c, err)
	}

	// A handler whose transaction's connection breaks under it failed
	// because the database did: its error says so (ErrStoreUnavailable,
	// which a Consumer answers by holding the delivery and trying again,
	// dedupq.ErrUnavailable), and still carries the driver's error.
	_, err = s.Do(ctx, "conn-breaks", "fp", time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		_, err := tx.Exec(ctx, "SELECT pg_terminate_backend(pg_backend_pid())")
		return nil, err
	})
	if !errors.Is(err, dedup.ErrStoreUnavailable) || !errors.Is(err, dedupq.ErrUnavailable) || errors.Is(err, boom) {
		t.Fatalf("Do whose connection broke: err = %v, want ErrStoreUnavailable and dedupq.ErrUnavailable", err)
	}
	if out, err := s.Do(ctx, "conn-breaks", "fp", time.Hour, write("conn-breaks", nil)); err != nil || !out.Ran {
		t.Fatalf("Do after a broken connection = %+v, %v; want ran", out, err)
	}
}

func TestTxGuard(t *testing.T) {
	pool := connect(t, 4)
	table, fx := newTable(t, pool), newEffects(t, pool)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	g, err := pgstore.NewTxGuard(newStore(t, pool, pgstore.Options{Table: table}), pgstore.TxGuardOptions{TTL: time.Hour, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	store := newStore(t, pool, pgstore.Options{Table: table})
	h := g.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
		calls.Add(1)
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", d.Message.ID)
		if d.Attempt == 1 {
			return errors.New("first attempt fails after writing")
		}
		return err
	})
	ctx := context.Background()
	d := func(attempt int, body string) *dedupq.Delivery {
		return &dedupq.Delivery{Message: dedupq.Message{ID: "order-7", Body: []byte(body)}, Attempt: attempt}
	}
	for _, tc := range []struct {
		d         *dedupq.Delivery
		wantErr   bool
		permanent bool
		calls     int32
	}{
		{d(1, "pay 10"), true, false, 1},  // fails: its write is rolled back
		{d(2, "pay 10"), false, false, 2}, // runs and commits
		{d(3, "pay 10"), false, false, 2}, // duplicate: acked, not run
		{d(4, "pay 99"), true, true, 2},   // same ID, other payload
	} {
		err := h(ctx, tc.d)
		if (err != nil) != tc.wantErr || dedupq.IsPermanent(err) != tc.permanent || calls.Load() != tc.calls {
			t.Fatalf("attempt %d: err = %v (permanent %v), %d calls; want error %v, permanent %v, %d calls",
				tc.d.Attempt, err, dedupq.IsPermanent(err), calls.Load(), tc.wantErr, tc.permanent, tc.calls)
		}
	}
	if n := effects(t, pool, fx, "order-7"); n != 1 {
		t.Fatalf("%d effects, want 1", n)
	}
	if got, want := g.Stats(), (dedup.Stats{Ran: 1, Failed: 1, Suppressed: 1, Conflicts: 1}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	// The same decisions as the metric a Guard reports.
	if got, want := decisions(t, reader), map[string]int64{"ran": 1, "failed": 1, "suppressed_duplicate": 1, "fingerprint_conflict": 1}; !maps.Equal(got, want) {
		t.Fatalf("dedupq.dedup.decisions = %v, want %v", got, want)
	}
	// Its statements timed as a Guard's store calls: four claims (two
	// takes, then two reads of the completed record), the failed run's
	// rollback as a release, the commit as a complete; no failure.
	for _, w := range []struct {
		op    string
		count uint64
	}{{"claim", 4}, {"complete", 1}, {"release", 1}} {
		_, n := testutil.HistogramTotals(t, reader, "dedupq.store.duration", func(s attribute.Set) bool {
			st, _ := s.Value("dedupq.store")
			op, _ := s.Value("dedupq.store.op")
			_, failed := s.Value("error.type")
			return st.AsString() == "pgstore" && op.AsString() == w.op && !failed
		})
		if n != w.count {
			t.Errorf("dedupq.store.duration{dedupq.store.op=%s}: %d points, want %d", w.op, n, w.count)
		}
	}
	if _, n := testutil.HistogramTotals(t, reader, "dedupq.store.duration", nil); n != 6 {
		t.Errorf("dedupq.store.duration: %d points in all, want 6", n)
	}
	// The effect committed with the key's completion record.
	if c, err := store.Claim(ctx, "order-7", dedup.BodyFingerprint(&d(5, "pay 10").Message), time.Hour); err != nil || c.State != dedup.Completed {
		t.Fatalf("key after the committed run = %+v, %v; want completed", c, err)
	}
	if g.TTL() != time.Hour {
		t.Fatalf("TTL = %s", g.TTL())
	}
}

// decisions reads dedupq.dedup.decisions by dedupq.outcome, for the
// pgstore label only.
func decisions(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != "dedupq.dedup.decisions" || !ok {
				continue
			}
			for _, p := range sum.DataPoints {
				if st, _ := p.Attributes.Value("dedupq.store"); st.AsString() != "pgstore" {
					continue
				}
				o, _ := p.Attributes.Value("dedupq.outcome")
				out[o.AsString()] += p.Value
			}
		}
	}
	return out
}
