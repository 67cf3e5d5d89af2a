// The benchmarks talk to the real PostgreSQL server at 127.0.0.1:5432 (override
// with DEDUPQ_PG_DSN), like the tests.
package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/internal/testutil"
)

// BenchmarkDo measures Do on fresh keys with a one-row effect, with and
// without a result, at concurrency 1 and 16: the cost of the transactional
// path per delivery, its final statement (which restarts the TTL at the
// commit) included. The pool has 16 connections, leaving room on a shared
// server.
func BenchmarkDo(b *testing.B) {
	pool := connect(b, 16)
	table, fx := newTable(b, pool), newEffects(b, pool)
	s := newStore(b, pool, pgstore.Options{Table: table})
	var run atomic.Int64
	for _, conc := range []int{1, 16} {
		for _, v := range []struct {
			name   string
			result []byte
		}{{"no-result", nil}, {"result", []byte("receipt")}} {
			b.Run(fmt.Sprintf("%s/c=%d", v.name, conc), func(b *testing.B) {
				prefix := fmt.Sprint("run-", run.Add(1), "-")
				testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
					key := fmt.Sprint(prefix, i)
					out, err := s.Do(ctx, key, "fp", time.Hour, func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
						_, err := tx.Exec(ctx, "INSERT INTO "+fx+" (msg) VALUES ($1)", key)
						return v.result, err
					})
					if err == nil && !out.Ran {
						err = fmt.Errorf("fresh key %s did not run", key)
					}
					return err
				})
			})
		}
	}
}
