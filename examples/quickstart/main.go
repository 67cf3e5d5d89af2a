// Command quickstart shows dedupq end to end with no services: orders go
// through the in-memory broker with faults injected (duplicate publishes,
// duplicate deliveries, lost acks), are consumed through the dedup guard,
// and every order takes effect exactly once. It also shows the startup
// check refusing a retry policy that outlives the broker's window.
//
// The last line is machine-readable:
//
//	published=N delivered=M duplicates_suppressed=K effects=E
//
// and the command exits 1 unless E == N with every order applied once.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

const orders = 200

func main() {
	if err := run(os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run(out *os.File) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	broker := mem.NewBroker(mem.Options{
		DedupWindow:   2 * time.Minute, // as a JetStream stream's default Duplicates
		AckWait:       300 * time.Millisecond,
		MaxDeliveries: 50,
		Backoff:       []time.Duration{20 * time.Millisecond},
		Faults:        mem.Faults{Seed: 7, DuplicatePublish: 0.2, DuplicateDelivery: 0.2, LostAck: 0.2},
	})

	// 1. A retry policy that outlives the window is refused at startup.
	unsafe := window.RetryPolicy{MaxAttempts: 10, InitialBackoff: time.Second, MaxBackoff: 30 * time.Second, Multiplier: 2, AttemptTimeout: 5 * time.Second}
	_, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{Retry: &unsafe})
	if !errors.Is(err, window.ErrUnsafeRetry) {
		return fmt.Errorf("the unsafe policy was not refused: %v", err)
	}
	fmt.Fprintf(out, "startup check refused an unsafe retry policy:\n  %v\n\n", err)

	// 2. The default policy (span 51.5s) fits the 2-minute window.
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{})
	if err != nil {
		return err
	}
	defer pub.Close(context.Background())
	fmt.Fprintf(out, "publisher: retry span %s within %s\n", pub.RetryPolicy().Span(), pub.Window())

	brokerDropped := 0
	for i := range orders {
		m := &dedupq.Message{ID: fmt.Sprintf("order-%03d", i), Body: fmt.Appendf(nil, `{"order":%d,"amount":%d}`, i, 10+i)}
		r, err := pub.Publish(ctx, m)
		if err != nil {
			return err
		}
		if r.Duplicate {
			brokerDropped++
		}
	}
	fmt.Fprintf(out, "published %d orders; the broker's window dropped %d duplicate sends\n", orders, brokerDropped)

	// 3. Consume through the dedup guard.
	guard, err := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: 10 * time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return err
	}
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("orders"), dedupq.ConsumerOptions{
		Concurrency: 8, Dedup: guard, PublisherSpan: pub.RetryPolicy().Span(),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return err
	}
	defer con.Close(ctx)
	fmt.Fprintf(out, "consumer: redelivery %s, dedup TTL %s\n", con.Redelivery(), guard.TTL())

	var mu sync.Mutex
	effects := map[string]int{}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			effects[d.Message.ID]++ // the side effect: charge the order
			return nil
		})
	}()
	// Done when every order is applied and the broker holds nothing more
	// (lost acks come back after their lease and must be settled too).
	for tick := time.NewTicker(10 * time.Millisecond); ; <-tick.C {
		mu.Lock()
		applied := len(effects)
		mu.Unlock()
		if applied == orders && broker.Stats("orders").Stored == 0 {
			tick.Stop()
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("timed out with %d of %d orders applied", applied, orders)
		}
	}
	stop()
	if err := <-done; err != nil {
		return err
	}

	total := 0
	for id, n := range effects {
		if n != 1 {
			return fmt.Errorf("order %s took effect %d times", id, n)
		}
		total += n
	}
	bs, gs := broker.Stats("orders"), guard.Stats()
	fmt.Fprintf(out, "guard: ran %d, suppressed %d completed duplicates, deferred %d in-flight duplicates\n\n", gs.Ran, gs.Suppressed, gs.Deferred)
	fmt.Fprintf(out, "published=%d delivered=%d duplicates_suppressed=%d effects=%d\n", orders, bs.Deliveries, gs.Suppressed, total)
	if total != orders || gs.Suppressed == 0 {
		return fmt.Errorf("effects=%d (want %d), duplicates_suppressed=%d (want > 0)", total, orders, gs.Suppressed)
	}
	return nil
}
