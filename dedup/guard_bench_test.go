// Benchmark of the Guard's own cost per delivery, over memstore: no
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
	mnoop "go.opentelemetry.io/otel/metric/noop"
)

// BenchmarkGuardWrap runs a guarded no-op handler on b.N deliveries of
// fresh keys (claim, run, complete); allocs/op is what the Guard and
// memstore add to each delivery.
func BenchmarkGuardWrap(b *testing.B) {
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour, MeterProvider: mnoop.NewMeterProvider()})
	if err != nil {
		b.Fatal(err)
	}
	h := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })
	ds := make([]*dedupq.Delivery, b.N)
	for i := range ds {
		ds[i] = &dedupq.Delivery{Message: dedupq.Message{ID: "k" + strconv.Itoa(i), Body: []byte("body")}, Attempt: 1, Lease: 30 * time.Second}
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for _, d := range ds {
		if err := h(ctx, d); err != nil {
			b.Fatal(err)
		}
	}
}
