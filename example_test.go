// Runnable examples over the in-memory broker: no services.
package dedupq_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/dedup"
	"github.com/dedupq/dedupq/dedup/memstore"
	"github.com/dedupq/dedupq/window"
)

// A publisher retries with the same dedup ID, so a resend inside the
// broker's window is reported as a duplicate instead of stored twice.
func ExamplePublisher_Publish() {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: 2 * time.Minute})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{})
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)
	for range 2 {
		r, err := pub.Publish(ctx, &dedupq.Message{ID: "order-42", Body: []byte(`{"amount":10}`)})
		fmt.Println(r.BackendID != "", r.Duplicate, err)
	}
	// Output:
	// true false <nil>
	// true true <nil>
}

// The startup check refuses a retry policy that outlives the window.
func ExampleNewPublisher_unsafeRetryPolicy() {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: 5 * time.Minute})
	retry := window.RetryPolicy{MaxAttempts: 8, InitialBackoff: 5 * time.Second, MaxBackoff: time.Minute, Multiplier: 2, AttemptTimeout: 10 * time.Second}
	_, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{Retry: &retry})
	var unsafe *window.UnsafeRetryError
	if errors.As(err, &unsafe) {
		fmt.Println("span:", window.FormatDuration(unsafe.Span))
		for _, fix := range unsafe.Fixes {
			fmt.Println("fix:", fix)
		}
	}
	// Output:
	// span: 5m35s
	// fix: lower PublisherOptions.Retry.MaxAttempts from 8 to 6
	// fix: cap PublisherOptions.Retry.MaxBackoff at 31s
	// fix: raise Options.DedupWindow (URL parameter window) from 5m to ≥ 6m59s
	// fix: declare consumer-side dedup: set PublisherOptions.ConsumerDedupTTL to ≥ 6m59s, and ConsumerOptions.PublisherSpan to 5m35s on the consumers, whose TTL must also cover their redelivery span
}

// A consumer with a dedup guard runs the handler once per dedup ID, however
// often the message is delivered.
func ExampleConsumer_Run() {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{DedupWindow: time.Minute, AckWait: time.Second, MaxDeliveries: 5})
	pub, _ := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
	for _, id := range []string{"a", "b", "a"} {
		_, _ = pub.Publish(ctx, &dedupq.Message{ID: id, Body: []byte(id)})
	}

	guard, _ := dedup.NewGuard(dedup.GuardOptions{Store: memstore.New(nil), TTL: time.Hour})
	con, err := dedupq.NewConsumer(ctx, broker.Subscription("orders"), dedupq.ConsumerOptions{Dedup: guard})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	seen := make(chan string, 3)
	done := make(chan error)
	go func() {
		done <- con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
			seen <- d.Message.ID
			return nil
		})
	}()
	fmt.Println(<-seen, <-seen)
	stop()
	fmt.Println(<-done, con.Close(context.Background()), len(seen))
	// Output:
	// a b
	// <nil> <nil> 0
}
