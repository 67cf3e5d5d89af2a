// Package testutil holds the helpers dedupq's own tests share: polling for
// a condition with a deadline (never sleeping for it) and running a
// benchmark body over a fixed number of goroutines.
package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/dedupq/dedupq/internal/parallel"
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

// Parallel runs op b.N times over conc goroutines (see parallel.Run) and
// reports msgs/s.
func Parallel(b *testing.B, conc int, op func(ctx context.Context, i int64) error) {
	b.ResetTimer()
	_, err := parallel.Run(context.Background(), conc, int64(b.N), op)
	b.StopTimer()
	if err != nil {
		b.Error(err)
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
