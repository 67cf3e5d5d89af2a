// These tests talk to the real PostgreSQL server at 127.0.0.1:5432, database
// test (override with DEDUPQ_PG_DSN), in tables with random names, like
// pgstore_test.go; without it they skip, unless CI is set, when they fail.
package pgstore_test

import (
	"context"
	"errors"
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
// eat into it.
//
// The handler's last statement reads the server's clock (fnEnd); the commit
// comes after it. So expires_at ≥ fnEnd + ttl is the TTL counted from the
// commit less what the commit itself takes (the epsilon no single statement
// can avoid), and it needs no timing assumption: all the timestamps come
// from one server clock in a known order. The handler's workload is a
// pg_sleep of work; counted from the transaction's start, the TTL would
// come up short by at least that.
func TestDoTTLRunsFromCommit(t *testing.T) {
	pool := connect(t, 8)
	table := newTable(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
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
		t.Run(tc.name, func(t *testing.T) {
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
			// after is later than the commit: the TTL counted from after
			// is an upper bound, and how far below it expires_at lies is
			// the epsilon, measured from the outside.
			t.Logf("expires_at = handler end + %s = after commit + %s (ttl %s)",
				expires.Sub(fnEnd), expires.Sub(after), ttl)
			if min := fnEnd.Add(ttl); expires.Before(min) {
				t.Errorf("expires_at %s is %s short of the handler's end + ttl %s: the TTL does not run from the commit",
					expires.Format(time.StampMicro), min.Sub(expires), ttl)
			}
			if max := after.Add(ttl); expires.After(max) {
				t.Errorf("expires_at %s is %s past after-commit + ttl %s: the key is kept longer than asked",
					expires.Format(time.StampMicro), expires.Sub(max), ttl)
			}
		})
	}
}

// TestDoRecordDeletedByHandler checks that a handler that deletes its own
// key's record inside the transaction fails the delivery, and its writes
// roll back, instead of committing an effect with no record to dedup its
// redeliveries.
func TestDoRecordDeletedByHandler(t *testing.T) {
	pool := connect(t, 4)
	ctx := context.Background()
	table, fx := newTable(t, pool), newEffects(t, pool)
	s := newStore(t, pool, pgstore.Options{Table: table})
	for _, result := range [][]byte{nil, []byte("r")} {
		key := randomName("key-")
		_, err := s.Do(ctx, key, "fp", time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			if _, err := tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", key); err != nil {
				return nil, err
			}
			_, err := tx.Exec(ctx, "DELETE FROM "+table+" WHERE key = $1", key)
			return result, err
		})
		if err == nil {
			t.Errorf("result %q: Do committed although the handler deleted the key's record", result)
		}
		if n := effects(t, pool, fx, key); n != 0 {
			t.Errorf("result %q: %d effects committed without a record, want 0", result, n)
		}
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
