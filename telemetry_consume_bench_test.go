// Benchmarks of the consume path's telemetry cost on the in-memory broker
// (adapters/mem), where each delivery pays a real receive, lease and ack;
// adapters/jetstream's BenchmarkConsumeTelemetry does the same on embedded
// JetStream. No services:
//
//	go test -run '^$' -bench ConsumeTelemetryMem -benchtime 20000x -count 5 .
package dedupq_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/internal/otelbench"
)

// BenchmarkConsumeTelemetryMem compares the variants (otelbench.Compare)
// on the in-memory broker: each round publishes 1,000 messages per variant
// with a traced publisher (so each carries a trace context), then times a
// new Consumer.Run at concurrency 4 consuming them. Under "guard" a
// dedup.Guard on memstore, with the variant's meter, wraps the handler.
// The name/off metrics are the overhead ratios; -benchtime 15x runs 15
// rounds.
func BenchmarkConsumeTelemetryMem(b *testing.B) {
	for _, guard := range []bool{false, true} {
		name := "mem"
		if guard {
			name = "mem-guard"
		}
		b.Run(name, func(b *testing.B) {
			otelbench.Compare(b, 1000, func(b *testing.B, v otelbench.Variant) otelbench.Runner {
				return memRunner(b, v, guard)
			})
		})
	}
}

func memRunner(b *testing.B, v otelbench.Variant, guard bool) otelbench.Runner {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: 5 * time.Minute, MaxDeliveries: 5})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("q"), dedupq.PublisherOptions{TracerProvider: sdktrace.NewTracerProvider()})
	if err != nil {
		b.Fatal(err)
	}
	opts := dedupq.ConsumerOptions{Concurrency: 4, MeterProvider: v.MP, TracerProvider: v.TP}
	if guard {
		g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: 24 * time.Hour, MeterProvider: v.MP})
		if err != nil {
			b.Fatal(err)
		}
		opts.Dedup = g
	}
	next := 0
	run := func(k int) time.Duration {
		const batch = 100
		msgs := make([]*dedupq.Message, 0, batch)
		for i := range k {
			msgs = append(msgs, &dedupq.Message{ID: "m" + strconv.Itoa(next), Body: []byte("body"), Attributes: map[string]string{"k": "v"}})
			next++
			if len(msgs) == batch || i == k-1 {
				if _, err := pub.PublishBatch(ctx, msgs); err != nil {
					b.Fatal(err)
				}
				msgs = msgs[:0]
			}
		}
		con, err := dedupq.NewConsumer(ctx, broker.Subscription("q"), opts)
		if err != nil {
			b.Fatal(err)
		}
		var handled atomic.Int64
		all := make(chan struct{})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error)
		start := time.Now()
		go func() {
			done <- con.Run(runCtx, func(_ context.Context, d *dedupq.Delivery) error {
				if _, ok := d.Message.Attributes["dedupq-traceparent"]; ok {
					b.Error("the handler saw the trace context")
				}
				if handled.Add(1) == int64(k) {
					close(all)
				}
				return nil
			})
		}()
		<-all
		took := time.Since(start)
		stop()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if err := con.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return took
	}
	return otelbench.Runner{Run: run, Stop: func() { _ = pub.Close(ctx) }}
}
