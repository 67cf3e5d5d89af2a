// Allocation counts of the Guard's path per delivery, over memstore: no
// services.
package dedup_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/internal/testutil"
	mnoop "go.opentelemetry.io/otel/metric/noop"
)

// TestGuardWrapAllocs pins what a delivery of a fresh key costs the Guard
// and memstore (claim, run, complete): the handler's cancellable context
// (2), the settle context (1), the body's fingerprint (1) and the claim's
// token (1). The settle context's detached parent is not made.
func TestGuardWrapAllocs(t *testing.T) {
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour, MeterProvider: mnoop.NewMeterProvider()})
	if err != nil {
		t.Fatal(err)
	}
	h := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })
	const runs = 200
	ds := make([]dedupq.Delivery, runs+1) // AllocsPerRun runs once more to warm up
	for i := range ds {
		ds[i] = dedupq.Delivery{Message: dedupq.Message{ID: "k" + strconv.Itoa(i), Body: []byte("body")}, Attempt: 1, Lease: 30 * time.Second}
	}
	ctx := context.Background()
	next := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if err := h(ctx, &ds[next]); err != nil {
			t.Fatal(err)
		}
		next++
	})
	if s := g.Stats(); s.Ran != runs+1 {
		t.Fatalf("stats %+v, want %d runs", s, runs+1)
	}
	want := 5.0
	if testutil.RaceEnabled {
		// The race detector drops pooled lease keepers at random, and a
		// dropped one is made again with its bound tick (2); the count
		// still tells the path's own allocations apart, so it is checked.
		want += 2
	}
	if allocs > want {
		t.Errorf("%.2f allocations per guarded delivery, want at most %.0f", allocs, want)
	}
}
