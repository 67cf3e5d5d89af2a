// Runnable examples of the in-memory broker: no services.
package mem_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dedupq/dedupq"
	"github.com/dedupq/dedupq/adapters/mem"
	"github.com/dedupq/dedupq/window"
)

// A broker with injected faults, for testing a handler against what real
// brokers do: here every delivery is handed out twice, and only the
// handler's own idempotence (or a dedup.Guard) keeps the effect single.
func ExampleNewBroker() {
	ctx := context.Background()
	broker := mem.NewBroker(mem.Options{
		DedupWindow:   2 * time.Minute,
		AckWait:       30 * time.Second,
		MaxDeliveries: 5,
		Faults:        mem.Faults{DuplicateDelivery: 1},
	})
	pub, err := dedupq.NewPublisher(ctx, broker.Topic("orders"), dedupq.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	if _, err := pub.Publish(ctx, &dedupq.Message{ID: "order-1", Body: []byte("10")}); err != nil {
		log.Fatal(err)
	}

	con, err := dedupq.NewConsumer(ctx, broker.Subscription("orders"), dedupq.ConsumerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	defer con.Close(ctx)
	runCtx, stop := context.WithCancel(ctx)
	deliveries := 0
	err = con.Run(runCtx, func(ctx context.Context, d *dedupq.Delivery) error {
		if deliveries++; deliveries == 2 {
			stop()
		}
		return nil
	})
	s := broker.Stats("orders")
	fmt.Println(err, deliveries, s.Published, s.Deliveries)
	// Output:
	// <nil> 2 1 2
}

// Publishers and consumers reach a process-wide broker by mem:// URL; its
// parameters set the broker's Options, and URLBroker returns it.
func ExampleURLBroker() {
	ctx := context.Background()
	pub, err := dedupq.OpenPublisher(ctx, "mem://example-url-broker?window=1m&max_deliveries=3", dedupq.PublisherOptions{Retry: &window.RetryPolicy{MaxAttempts: 1}})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)
	for range 2 {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: "order-1", Body: []byte("10")}); err != nil {
			log.Fatal(err)
		}
	}
	b := mem.URLBroker("example-url-broker")
	fmt.Println(b.Options().DedupWindow, b.Options().MaxDeliveries, b.Stats("example-url-broker").Stored)

	// A second URL naming the queue with other parameters is refused, not
	// silently given the first one's broker.
	_, err = dedupq.OpenPublisher(ctx, "mem://example-url-broker?window=5m", dedupq.PublisherOptions{})
	var bad *dedupq.ParamError
	fmt.Println(errors.As(err, &bad), bad.Param)
	// Output:
	// 1m0s 3 1
	// true window
}
