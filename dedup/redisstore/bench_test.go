// The benchmarks talk to the real Redis server at 127.0.0.1:6379 (override
// with DEDUPQ_REDIS_ADDR), like the tests.
package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/redisstore"
	"github.com/dedupq/dedupq/internal/testutil"
)

// BenchmarkClaimComplete measures a claim plus a completion per message —
// what the Guard costs per delivery — beside the raw SET NX PX that a
// hand-rolled dedup would do, in the same run and on the same client, at
// concurrency 1, 16 and 64. Compare the msgs/s metrics.
func BenchmarkClaimComplete(b *testing.B) {
	c := connect(b, 64)
	ns := namespace(b, c)
	var run atomic.Int64
	for _, conc := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("raw-SET-NX-PX/c=%d", conc), func(b *testing.B) {
			prefix := fmt.Sprintf("dedupq:%s:raw-%d:", ns, run.Add(1))
			testutil.Parallel(b, conc, func(ctx context.Context, i int64) error {
				return c.SetNX(ctx, fmt.Sprint(prefix, i), "1", time.Minute).Err()
			})
		})
		for _, v := range []struct {
			name string
			o    redisstore.Options
		}{
			{"store-pipelined", redisstore.Options{}},
			{"store-unbatched", redisstore.Options{MaxBatch: 1}},
		} {
			b.Run(fmt.Sprintf("%s/c=%d", v.name, conc), func(b *testing.B) {
				o := v.o
				o.Namespace = ns
				s := newStore(b, c, o)
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
					return s.Complete(ctx, key, cl.Token, time.Minute, nil)
				})
			})
		}
	}
}

var _ redis.UniversalClient = (*redis.Client)(nil)
