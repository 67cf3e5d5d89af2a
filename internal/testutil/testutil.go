// Package testutil holds the helpers dedupq's own tests share: polling for
// a condition with a deadline (never sleeping for it) and running a
// benchmark body over a fixed number of goroutines.
package testutil

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// WaitFor polls cond every millisecond until it holds, failing the test if
// it does not within 10 seconds.
func WaitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Parallel runs op b.N times over conc goroutines (unlike b.RunParallel,
// whose goroutine count scales with GOMAXPROCS) and reports msgs/s.
func Parallel(b *testing.B, conc int, op func(ctx context.Context, i int64) error) {
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	b.ResetTimer()
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := op(ctx, i); err != nil {
					once.Do(func() { b.Error(err) })
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
