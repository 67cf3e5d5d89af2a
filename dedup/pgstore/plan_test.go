// These tests talk to the real PostgreSQL server at 127.0.0.1:5432 (override
// with DEDUPQ_PG_DSN), as pgstore_test.go does, on a pool of one connection,
// so that the server's record of that session's prepared statements
// (pg_prepared_statements) covers every statement the store ran, and on a
// second pool that holds a lock the store's statements wait for.
package pgstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
)

// Batches of several claims and of several completions run the statements
// over arrays with the plan PostgreSQL made once for them (a generic plan),
// not one planned afresh for each batch, whose planning cost as much as
// running it; and the setting that asks for it does not outlive the batch.
func TestArrayStatementsReuseTheirPlan(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    pgstore.Options
	}{
		{"durable claims", pgstore.Options{}},
		{"async claims", pgstore.Options{AsyncClaims: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, locker := connect(t, 1), connect(t, 2)
			tc.o.Table = newTable(t, pool)
			s := newStore(t, pool, tc.o)
			ctx := context.Background()
			const rounds, perBatch = 3, 6
			for round := range rounds {
				keys := make([]string, perBatch)
				for i := range keys {
					keys[i] = fmt.Sprintf("r%d-k%d", round, i)
				}
				claims := make([]dedup.Claim, perBatch)
				inOneBatch(t, locker, tc.o.Table, perBatch, func() int { return pgstore.QueuedClaims(s) }, func(i int) error {
					c, err := s.Claim(ctx, keys[i], "fp", time.Minute)
					if err == nil && c.State != dedup.Acquired {
						err = fmt.Errorf("claim of fresh key %s: %s", keys[i], c.State)
					}
					claims[i] = c
					return err
				})
				inOneBatch(t, locker, tc.o.Table, perBatch, func() int { return pgstore.QueuedCompletes(s) }, func(i int) error {
					return s.Complete(ctx, keys[i], claims[i].Token, time.Hour, nil)
				})
			}

			rows, err := pool.Query(ctx, `SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE '%unnest' || '(%'`)
			if err != nil {
				t.Fatal(err)
			}
			seen := 0
			for rows.Next() {
				var stmt string
				var generic, custom int64
				if err := rows.Scan(&stmt, &generic, &custom); err != nil {
					t.Fatal(err)
				}
				seen++
				first, _, _ := strings.Cut(strings.TrimSpace(stmt), "\n")
				if custom != 0 || generic != rounds {
					t.Errorf("statement %q…: %d generic plans, %d custom plans; want %d generic (one per batch) and no custom plan", first, generic, custom, rounds)
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if seen != 2 {
				t.Fatalf("%d statements over arrays prepared on the connection, want 2 (claim and completion)", seen)
			}
			var mode string
			if err := pool.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode); err != nil {
				t.Fatal(err)
			}
			if mode != "auto" {
				t.Errorf("plan_cache_mode = %q on the store's connection after its batches, want auto: the setting leaked", mode)
			}
		})
	}
}

// inOneBatch makes n calls of do whose requests go out in one batch: while
// another session holds a lock on table that the store's statements wait
// for, a first call (do(0)) goes out alone and waits, and the other n-1
// queue behind it; then the lock goes, and the flush sends them together.
func inOneBatch(t *testing.T, locker *pgxpool.Pool, table string, n int, queued func() int, do func(i int) error) {
	t.Helper()
	ctx := context.Background()
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, n)
	call := func(i int) { go func() { errs <- do(i) }() }
	call(0)
	waitForLockWait(t, locker, table)
	for i := 1; i < n; i++ {
		call(i)
	}
	waitQueued(t, queued, n-1)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a call did not return")
		}
	}
}

func waitQueued(t *testing.T, queued func() int, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for queued() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued, want %d", queued(), n)
		}
		tm := time.NewTimer(time.Millisecond)
		<-tm.C
	}
}
