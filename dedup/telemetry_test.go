// Tests of the Guard's metrics: the in-memory store read back with the
// SDK's ManualReader. No services.
package dedup_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/internal/testutil"
)

// slowClaims is a store whose claims take a while, as a remote store's
// round trip does.
type slowClaims struct {
	dedup.Store
	took time.Duration // how long the last claim took, by its own clock
}

func (s *slowClaims) Claim(ctx context.Context, key, fp string, lease time.Duration) (dedup.Claim, error) {
	start := time.Now()
	// Busy, not asleep: the duration is what is measured, no condition
	// is waited for.
	for time.Since(start) < 2*time.Millisecond {
	}
	c, err := s.Store.Claim(ctx, key, fp, lease)
	s.took = time.Since(start)
	return c, err
}

// dedupq.store.duration records how long each store operation took: at
// least what the store itself measured.
func TestStoreDurationCoversTheOperation(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	store := &slowClaims{Store: memstore.New(nil)}
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: store, TTL: time.Hour,
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })(ctx, delivery("k", "a")); err != nil {
		t.Fatal(err)
	}
	sum, count := testutil.HistogramTotals(t, reader, "dedupq.store.duration", func(a attribute.Set) bool {
		op, _ := a.Value("dedupq.store.op")
		return op.AsString() == "claim"
	})
	if count != 1 || sum < store.took.Seconds() {
		t.Errorf("dedupq.store.duration of claims: %d points summing to %gs, want 1 of at least the store's own %gs", count, sum, store.took.Seconds())
	}
}
