// These tests talk to the real PostgreSQL server at 127.0.0.1:5432, database
// test (override with DEDUPQ_PG_DSN), in tables with random names, like
// pgstore_test.go; without it they skip, unless CI is set, when they fail.
package pgstore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

// TestDoTTLRunsFromCommit checks that the TTL of a key recorded by Do or
// TxGuard runs from the commit that makes the record visible, not from the
// transaction's start: the startup check (window.CheckConsumer) counts the
// TTL from the completion, and a handler that works for a while must not
// eat into it. It does, with the take's slack past the TTL, for a
// transaction done within the slack (the commit only reads the record) and
// for one that outlives it (the commit restarts the TTL).
//
// The handler's last statement reads the server's clock (fnEnd); the commit
// comes after it. So expires_at ≥ fnEnd + ttl is the TTL counted from the
// commit less what the commit itself takes (the epsilon no single statement
// can avoid), and it needs no timing assumption: all the timestamps come
// from one server clock in a known order. The handler's workload is a
// pg_sleep of work, longer than the short slack; counted from the
// transaction's start, the TTL would come up short by at least work less
// the slack.
func TestDoTTLRunsFromCommit(t *testing.T) {
	pool := connect(t, 8)
	table := newTable(t, pool)
	const (
		ttl  = 2 * time.Second
		work = 300 * time.Millisecond
	)
	// handle is the handler's workload: it runs for work, then reports
	// the server's clock at its end.
	handle := func(ctx context.Context, tx pgx.Tx, fnEnd *time.Time) error {
		if _, err := tx.Exec(ctx, "SELECT pg_sleep($1)", work.Seconds()); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(fnEnd)
	}
	for _, slack := range []struct {
		name  string
		slack time.Duration // 0: the store's own
	}{
		{"within the slack", 0},
		{"past the slack", time.Millisecond},
	} {
		s := newStore(t, pool, pgstore.Options{Table: table})
		if slack.slack > 0 {
			pgstore.SetDoSlack(s, slack.slack)
		}
		for _, tc := range []struct {
			name   string
			result []byte // stored with the key; nil for none
			run    func(ctx context.Context, key string, fnEnd *time.Time) error
		}{
			{"Do with a result", []byte("receipt-7"), nil},
			{"Do without a result", nil, nil},
			{"TxGuard", nil, func(ctx context.Context, key string, fnEnd *time.Time) error {
				g, err := pgstore.NewTxGuard(s, pgstore.TxGuardOptions{TTL: ttl})
				if err != nil {
					return err
				}
				h := g.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
					tx, err := pgstore.Tx(ctx)
					if err != nil {
						return err
					}
					return handle(ctx, tx, fnEnd)
				})
				return h(ctx, &dedupq.Delivery{Message: dedupq.Message{ID: key, Body: []byte("pay 10")}, Attempt: 1})
			}},
		} {
			t.Run(slack.name+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				key := randomName("key-")
				var fnEnd time.Time
				run := tc.run
				if run == nil {
					run = func(ctx context.Context, key string, fnEnd *time.Time) error {
						out, err := s.Do(ctx, key, "fp", ttl, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
							return tc.result, handle(ctx, tx, fnEnd)
						})
						if err == nil && (!out.Ran || string(out.Result) != string(tc.result)) {
							err = errors.New("Do did not run the handler with its result: " + string(out.Result))
						}
						return err
					}
				}
				if err := run(ctx, key, &fnEnd); err != nil {
					t.Fatal(err)
				}
				var after, expires time.Time
				var result []byte
				if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&after); err != nil {
					t.Fatal(err)
				}
				if err := pool.QueryRow(ctx, "SELECT expires_at, result FROM "+table+" WHERE key = $1", key).Scan(&expires, &result); err != nil {
					t.Fatal(err)
				}
				if string(result) != string(tc.result) {
					t.Errorf("stored result %q, want %q", result, tc.result)
				}
				// after is later than the commit: the TTL plus the slack
				// counted from after is an upper bound.
				t.Logf("expires_at = handler end + %s = after commit + %s (ttl %s, slack %s)",
					expires.Sub(fnEnd), expires.Sub(after), ttl, pgstore.DoSlack(s))
				if min := fnEnd.Add(ttl); expires.Before(min) {
					t.Errorf("expires_at %s is %s short of the handler's end + ttl %s: the TTL does not run from the commit",
						expires.Format(time.StampMicro), min.Sub(expires), ttl)
				}
				if max := after.Add(ttl + pgstore.DoSlack(s)); expires.After(max) {
					t.Errorf("expires_at %s is %s past after-commit + ttl %s + slack %s: the key is kept longer than asked",
						expires.Format(time.StampMicro), expires.Sub(max), ttl, pgstore.DoSlack(s))
				}
			})
		}
	}
}

// TestDoRecordDeletedByHandler checks that a handler that deletes its own
// key's record inside the transaction, or moves it to another key, fails
// the delivery, and its writes roll back, instead of committing an effect
// with no record to dedup its redeliveries: whether the commit finds the
// record within the take's slack (and only reads it) or past it (and
// would restart its TTL), with or without a result.
func TestDoRecordDeletedByHandler(t *testing.T) {
	pool := connect(t, 4)
	ctx := context.Background()
	table, fx := newTable(t, pool), newEffects(t, pool)
	for _, slack := range []time.Duration{0, time.Nanosecond} { // 0: the store's own
		s := newStore(t, pool, pgstore.Options{Table: table})
		if slack > 0 {
			// Every transaction outlives a nanosecond.
			pgstore.SetDoSlack(s, slack)
		}
		for _, remove := range []string{
			"DELETE FROM " + table + " WHERE key = $1",
			"UPDATE " + table + " SET key = key || '-moved' WHERE key = $1",
		} {
			for _, result := range [][]byte{nil, []byte("r")} {
				key := randomName("key-")
				_, err := s.Do(ctx, key, "fp", time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
					if _, err := tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", key); err != nil {
						return nil, err
					}
					_, err := tx.Exec(ctx, remove, key)
					return result, err
				})
				if err == nil || !strings.Contains(err.Error(), "removed the key's record") {
					t.Errorf("slack %s, %q, result %q: Do = %v, want the error that the handler removed the record",
						pgstore.DoSlack(s), remove, result, err)
				}
				if n := effects(t, pool, fx, key); n != 0 {
					t.Errorf("slack %s, %q, result %q: %d effects committed without a record, want 0",
						pgstore.DoSlack(s), remove, result, n)
				}
			}
		}
	}
}

// TestDoWritesNoRowVersionAtCommit checks that a transaction done within
// the take's slack commits its record as the take wrote it: the commit
// statement reads the record and writes no second row version (nor, since
// expires_at is indexed, a second index entry). A result costs the one
// update that stores it, and a takeover of an expired record the one that
// takes it over. Each case runs once in a fresh table, whose first page
// holds every row version written, in order: the live row's ctid offset is
// how many were.
func TestDoWritesNoRowVersionAtCommit(t *testing.T) {
	pool := connect(t, 4)
	for _, tc := range []struct {
		name     string
		expired  bool   // the key has an expired record to take over
		result   []byte // nil for none
		versions int
	}{
		{"new key", false, nil, 1},
		{"new key with a result", false, []byte("receipt"), 2},
		{"expired key", true, nil, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			table := newTable(t, pool)
			s := newStore(t, pool, pgstore.Options{Table: table})
			if tc.expired {
				_, err := pool.Exec(ctx, "INSERT INTO "+table+` (namespace, key, token, fingerprint, completed, expires_at)
					VALUES ('default', 'k', 'old', 'old-fp', true, now() - interval '1 second')`)
				if err != nil {
					t.Fatal(err)
				}
			}
			out, err := s.Do(ctx, "k", "fp", time.Hour, func(context.Context, pgx.Tx) ([]byte, error) { return tc.result, nil })
			if err != nil || !out.Ran {
				t.Fatalf("Do = %+v, %v; want ran", out, err)
			}
			var versions int
			var fp string
			err = pool.QueryRow(ctx, "SELECT (ctid::text::point)[1]::int, fingerprint FROM "+table+" WHERE key = 'k'").Scan(&versions, &fp)
			if err != nil {
				t.Fatal(err)
			}
			if fp != "fp" {
				t.Errorf("fingerprint %q after Do, want %q", fp, "fp")
			}
			if versions != tc.versions {
				t.Errorf("Do wrote %d row versions of the record, want %d", versions, tc.versions)
			}
		})
	}
}

// queryCounter counts the statements sent through a pool: every Exec,
// Query and QueryRow, BEGIN and COMMIT included, is one round trip.
type queryCounter struct{ n atomic.Int64 }

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestDoRoundTrips checks that TxGuard costs no round trip more than the
// transaction a handler would write by hand (BEGIN, its INSERT, the key's
// INSERT, COMMIT): the TTL's restart at the commit rides with the COMMIT.
func TestDoRoundTrips(t *testing.T) {
	counter := &queryCounter{}
	// One connection: its first Do prepares what the others reuse.
	pool := connect(t, 1, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	table, fx := newTable(t, pool), newEffects(t, pool)
	g, err := pgstore.NewTxGuard(newStore(t, pool, pgstore.Options{Table: table}), pgstore.TxGuardOptions{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(func(ctx context.Context, d *dedupq.Delivery) error {
		tx, err := pgstore.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", d.Message.ID)
		return err
	})
	for i := range 3 {
		key := randomName("key-")
		before := counter.n.Load()
		if err := h(context.Background(), &dedupq.Delivery{Message: dedupq.Message{ID: key, Body: []byte("pay 10")}, Attempt: 1}); err != nil {
			t.Fatal(err)
		}
		if got := counter.n.Load() - before; i > 0 && got != 4 {
			t.Errorf("delivery %d: %d statements, want 4 (BEGIN, take, the handler's INSERT, commit)", i, got)
		}
	}
}
