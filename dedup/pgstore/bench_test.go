// The benchmarks talk to the real PostgreSQL server at 127.0.0.1:5432 (override
// with DEDUPQ_PG_DSN), like the tests.
package pgstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/pgstore"
	"github.com/dedupq/dedupq/internal/testutil"
)

// BenchmarkClaimComplete measures a claim plus a completion per message —
// what the Guard costs per delivery — beside a raw single-row INSERT … ON
// CONFLICT DO NOTHING into a table of the same shape, in the same run and
// on the same pool, at concurrency 1, 16 and 64. Compare the msgs/s
// metrics. The pool has 32 connections, so that a benchmark leaves room on
// a server other tests share.
func BenchmarkClaimComplete(b *testing.B) {
	pool := connect(b, 32)
	table, raw := newTable(b, pool), newTable(b, pool)
	rawSQL := "INSERT INTO " + raw + ` (namespace, key, token, fingerprint, expires_at)
		VALUES ('default', $1, $2, 'fp', now() + interval '1 hour') ON CONFLICT DO NOTHING`
	var run atomic.Int64
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("raw-INSERT-ON-CONFLICT/c=%d", conc), func(b *testing.B) {
			prefix := fmt.Sprint("run-", run.Add(1), "-")
			testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
				_, err := pool.Exec(ctx, rawSQL, fmt.Sprint(prefix, i), "0123456789abcdef0123456789abcdeffp")
				return err
			})
		})
		for _, v := range []struct {
			name string
			o    pgstore.Options
		}{
			{"store-batched", pgstore.Options{Table: table}},
			{"store-batched-async-claims", pgstore.Options{Table: table, AsyncClaims: true}},
			{"store-unbatched", pgstore.Options{Table: table, MaxBatch: 1, MaxInFlight: 64}},
		} {
			b.Run(fmt.Sprintf("%s/c=%d", v.name, conc), func(b *testing.B) {
				s := newStore(b, pool, v.o)
				prefix := fmt.Sprint("run-", run.Add(1), "-")
				testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
					key := fmt.Sprint(prefix, i)
					cl, err := s.Claim(ctx, key, "fp", time.Minute)
					if err != nil {
						return err
					}
					if cl.State != dedup.Acquired {
						return fmt.Errorf("fresh key %s", cl.State)
					}
					return s.Complete(ctx, key, cl.Token, time.Hour, nil)
				})
			})
		}
	}
}
