// Benchmark of the Guard's own cost per delivery, over memstore: no
// services.
package dedup_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/clock"
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

// BenchmarkGuardWrapSteady is BenchmarkGuardWrap at a steady number of
// records: keys come round again once their completion expired (on the
// store's fake clock), so the memstore map stops growing and what is
// measured is the Guard's path rather than the map's growth.
func BenchmarkGuardWrapSteady(b *testing.B) {
	const keys = 1024
	ttl := time.Hour
	fake := clock.NewFake(time.Unix(0, 0))
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(fake), TTL: ttl, MeterProvider: mnoop.NewMeterProvider()})
	if err != nil {
		b.Fatal(err)
	}
	h := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })
	ds := make([]dedupq.Delivery, keys)
	for i := range ds {
		ds[i] = dedupq.Delivery{Message: dedupq.Message{ID: "k" + strconv.Itoa(i), Body: []byte("body")}, Attempt: 1, Lease: 30 * time.Second}
	}
	step := ttl/keys + time.Second // a key's completion has expired when it comes round
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		fake.Advance(step)
		if err := h(ctx, &ds[i%keys]); err != nil {
			b.Fatal(err)
		}
	}
	if s := g.Stats(); s.Ran != uint64(b.N) {
		b.Fatalf("stats %+v, want %d runs", s, b.N)
	}
}

// BenchmarkGuardWrapConsume is the Guard as a Consumer runs it: 64
// handlers at once, each delivery's context a child of its worker's
// cancellable context (as the Consumer's workers have), 1 KiB bodies as in
// go run ./bench, fresh keys, the global meter provider left as it is.
func BenchmarkGuardWrapConsume(b *testing.B) {
	g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	h := g.Wrap(func(context.Context, *dedupq.Delivery) error { return nil })
	body := make([]byte, 1024)
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(context.Background()))
	defer cancel(nil)
	var next atomic.Int64
	b.SetParallelism(32) // 64 goroutines on 2 cores, as the Consumer's 64 handlers
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx, cancel := context.WithCancelCause(hctx)
		defer cancel(nil)
		for pb.Next() {
			d := &dedupq.Delivery{Message: dedupq.Message{ID: "k" + strconv.FormatInt(next.Add(1), 10), Body: body}, Attempt: 1, Lease: 30 * time.Second}
			if err := h(ctx, d); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
