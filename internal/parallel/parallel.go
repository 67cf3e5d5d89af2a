// Package parallel runs one operation a fixed number of times over a fixed
// number of goroutines and times it: the loop the store benchmarks and the
// bench program share, so that both measure the same way.
package parallel

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Run calls op(ctx, i) for i in 1..n over conc goroutines (unlike
// testing.B.RunParallel, whose goroutine count scales with GOMAXPROCS) and
// returns the wall time. The first error stops every goroutine and is
// returned.
func Run(ctx context.Context, conc int, n int64, op func(ctx context.Context, i int64) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	var failed atomic.Bool
	start := time.Now()
	for range max(conc, 1) {
		wg.Go(func() {
			for !failed.Load() {
				i := next.Add(1)
				if i > n {
					return
				}
				if err := op(ctx, i); err != nil {
					once.Do(func() { first = err; failed.Store(true) })
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), first
}
