// Benchmarks of the consume path's telemetry cost over a channel-fed
// driver: no broker, so that the portable layer's own cost is what is
// measured. telemetry_consume_bench_test.go has the same on real brokers.
// No services.
package dedupq

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupq/dedupq/driver"
	"github.com/dedupq/dedupq/internal/otelbench"
	"github.com/dedupq/dedupq/window"
)

// benchSub hands out deliveries from a channel and settles for free.
type benchSub struct{ in chan *driver.Delivery }

func (s *benchSub) Receive(ctx context.Context, max int) ([]*driver.Delivery, error) {
	select {
	case d := <-s.in:
		return []*driver.Delivery{d}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (s *benchSub) Ack(context.Context, *driver.Delivery) error                   { return nil }
func (s *benchSub) Nack(context.Context, *driver.Delivery, time.Duration) error   { return nil }
func (s *benchSub) Terminate(context.Context, *driver.Delivery, error) error      { return nil }
func (s *benchSub) Extend(context.Context, *driver.Delivery, time.Duration) error { return nil }
func (s *benchSub) Window(context.Context) (window.Window, error) {
	return window.Window{Backend: "bench"}, nil
}
func (s *benchSub) Redelivery(context.Context) (window.RedeliveryPolicy, error) {
	return window.RedeliveryPolicy{MaxDeliveries: 5, AckWait: time.Minute}, nil
}
func (s *benchSub) IsRetryable(error) bool { return false }
func (s *benchSub) Close() error           { return nil }

// BenchmarkConsumeTelemetry runs b.N deliveries through Consumer.Run;
// ns/op is the cost of one. Each delivery carries a trace context, as one
// from a traced publisher does. otelbench.Variants lists the providers;
// "off" is the baseline the others are a ratio of (run with -count to
// interleave them on a noisy machine).
func BenchmarkConsumeTelemetry(b *testing.B) {
	for _, v := range otelbench.Variants() {
		b.Run(v.Name, func(b *testing.B) {
			benchConsume(b, ConsumerOptions{Concurrency: 4, MeterProvider: v.MP, TracerProvider: v.TP})
		})
	}
}

func benchConsume(b *testing.B, opts ConsumerOptions) {
	ctx := context.Background()
	sub := &benchSub{in: make(chan *driver.Delivery, 256)}
	con, err := NewConsumer(ctx, sub, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer con.Close(ctx)
	n := int64(b.N)
	var handled atomic.Int64
	all := make(chan struct{})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	b.ReportAllocs()
	b.ResetTimer()
	go func() {
		done <- con.Run(runCtx, func(context.Context, *Delivery) error {
			if handled.Add(1) == n {
				close(all)
			}
			return nil
		})
	}()
	for range b.N {
		sub.in <- newBenchDelivery()
	}
	<-all
	b.StopTimer()
	stop()
	<-done
}

// BenchmarkConsumeTelemetryCompare is BenchmarkConsumeTelemetry with the
// variants interleaved (otelbench.Compare): each round hands 2,000
// deliveries to each variant's running consumer. Its name/off metrics are
// the overhead ratios; -benchtime 15x runs 15 rounds.
func BenchmarkConsumeTelemetryCompare(b *testing.B) {
	otelbench.Compare(b, 2000, func(b *testing.B, v otelbench.Variant) otelbench.Runner {
		ctx := context.Background()
		sub := &benchSub{in: make(chan *driver.Delivery, 256)}
		con, err := NewConsumer(ctx, sub, ConsumerOptions{Concurrency: 4, MeterProvider: v.MP, TracerProvider: v.TP})
		if err != nil {
			b.Fatal(err)
		}
		var handled, want atomic.Int64
		reached := make(chan struct{}, 1)
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error)
		go func() {
			done <- con.Run(runCtx, func(context.Context, *Delivery) error {
				if handled.Add(1) == want.Load() {
					reached <- struct{}{}
				}
				return nil
			})
		}()
		return otelbench.Runner{
			Run: func(k int) time.Duration {
				want.Add(int64(k))
				start := time.Now()
				for range k {
					sub.in <- newBenchDelivery()
				}
				<-reached
				return time.Since(start)
			},
			Stop: func() {
				stop()
				<-done
				_ = con.Close(ctx)
			},
		}
	})
}

// newBenchDelivery is a delivery with a trace context and a user
// attribute, as a traced publisher's message arrives.
func newBenchDelivery() *driver.Delivery {
	return &driver.Delivery{Attempt: 1, BackendID: "x", Message: driver.Message{ID: "m", Body: []byte("body"),
		Attributes: map[string]string{"k": "v", driver.AttrTraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}}
}
