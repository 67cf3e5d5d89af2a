//go:build unix

// Benchmark of the consume path's own cost per delivery on the in-memory
// broker (adapters/mem), with and without a dedup.Guard on memstore, beside
// the driver's raw Receive+Ack loop: ns/op, cpu-ns/op (the process's CPU
// time, which a loaded machine distorts less than the wall time) and
// allocs/op are per message. No services:
//
//	go test -run '^$' -bench ConsumeMem -benchmem -benchtime 50000x -count 5 .
package dedupq_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/driver"
)

func BenchmarkConsumeMem(b *testing.B) {
	const conc = 64
	ctx := context.Background()
	filled := func(b *testing.B) driver.Subscription {
		broker := mem.NewBroker(mem.Options{DedupWindow: time.Hour, MaxDeliveries: 5})
		top := broker.Topic("q")
		body := make([]byte, 1024)
		for i := 0; i < b.N; {
			batch := make([]*driver.Message, 0, top.MaxBatch())
			for ; i < b.N && len(batch) < cap(batch); i++ {
				batch = append(batch, &driver.Message{ID: "m" + strconv.Itoa(i), Body: body})
			}
			if _, err := top.SendBatch(ctx, batch); err != nil {
				b.Fatal(err)
			}
		}
		return broker.Subscription("q")
	}
	b.Run("raw", func(b *testing.B) {
		sub := filled(b)
		b.ReportAllocs()
		b.ResetTimer()
		defer reportCPU(b)()
		for done := 0; done < b.N; {
			ds, err := sub.Receive(ctx, conc)
			if err != nil {
				b.Fatal(err)
			}
			for _, d := range ds {
				if err := sub.Ack(ctx, d); err != nil {
					b.Fatal(err)
				}
				done++
			}
		}
	})
	for _, tc := range []struct {
		name  string
		guard bool
		// work is how long each handler takes. With slow handlers the
		// figure to read is slot-use: the handlers' work against the
		// slots' time, what the receive loop's way of grouping free
		// slots into receives costs them.
		work time.Duration
	}{
		{"consumer", false, 0},
		{"guard", true, 0},
		{"slow-handlers", false, time.Millisecond},
	} {
		guard := tc.guard
		b.Run(tc.name, func(b *testing.B) {
			sub := filled(b)
			// The global (no-op) providers, as in the bench program.
			opts := dedupq.ConsumerOptions{Concurrency: conc}
			if guard {
				g, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
				if err != nil {
					b.Fatal(err)
				}
				opts.Dedup = g
			}
			start := time.Now()
			consumeN(b, sub, opts, tc.work)
			if tc.work > 0 {
				// Sleeps overshoot a little: 100% is out of reach.
				b.ReportMetric(100*float64(time.Duration(b.N)*tc.work)/float64(conc*time.Since(start)), "slot-use-%")
			}
		})
	}
}

// consumeN runs a Consumer with opts on sub until b.N deliveries were
// handled (each taking work) and settled, timing only that, with the
// process's CPU per delivery; it fails b unless every one was acked.
func consumeN(b *testing.B, sub driver.Subscription, opts dedupq.ConsumerOptions, work time.Duration) {
	ctx := context.Background()
	con, err := dedupq.NewConsumer(ctx, sub, opts)
	if err != nil {
		b.Fatal(err)
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var handled atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	cpu := reportCPU(b)
	err = con.Run(runCtx, func(context.Context, *dedupq.Delivery) error {
		if work > 0 {
			time.Sleep(work)
		}
		if handled.Add(1) == int64(b.N) {
			stop() // Run returns once every delivery is settled
		}
		return nil
	})
	b.StopTimer()
	cpu()
	if err != nil {
		b.Fatal(err)
	}
	if s := con.Stats(); s.Acked != uint64(b.N) {
		b.Fatalf("acked %d of %d", s.Acked, b.N)
	}
}

// reportCPU starts counting the process's CPU time; the func it returns
// reports it per op as cpu-ns/op.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op") }
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
