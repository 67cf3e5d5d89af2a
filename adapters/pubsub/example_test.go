package pubsub_test

import (
	"context"
	"fmt"
	"time"

	"github.com/dedupq/dedupq"
	_ "github.com/dedupq/dedupq/adapters/pubsub"
	"github.com/dedupq/dedupq/window"
)

// A publisher on Pub/Sub must declare consumer-side dedup to retry: the
// broker deduplicates nothing, so only the consumers' dedup store absorbs
// resends. Without ConsumerDedupTTL the default retry policy is refused.
func Example() {
	ctx := context.Background()
	url := "pubsub://my-project/orders?emulator=127.0.0.1:8085"

	_, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{})
	if err != nil {
		fmt.Println("without consumer-side dedup:", err)
	}

	pub, err := dedupq.OpenPublisher(ctx, url, dedupq.PublisherOptions{
		Retry:            &window.RetryPolicy{MaxAttempts: 5, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, Multiplier: 2, AttemptTimeout: 10 * time.Second},
		ConsumerDedupTTL: 24 * time.Hour,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close(ctx)
	res, err := pub.Publish(ctx, &dedupq.Message{ID: "order-42", Body: []byte(`{"order":42}`), GroupKey: "customer-7"})
	fmt.Println(res.BackendID, err)
}

// An ordered consumer needs a subscription with message ordering, which
// cannot be turned on later: on an emulator, create=true makes the topic
// and such a subscription once the startup checks pass. A customer's
// orders (one GroupKey) are then handled one at a time, in publish order.
func Example_ordered() {
	ctx := context.Background()
	emu := "?emulator=127.0.0.1:8085&create=true"
	pub, err := dedupq.OpenPublisher(ctx, "pubsub://my-project/orders"+emu, dedupq.PublisherOptions{
		Retry: &window.RetryPolicy{MaxAttempts: 1}, // or declare ConsumerDedupTTL to retry
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pub.Close(ctx)
	con, err := dedupq.OpenConsumer(ctx, "pubsub://my-project/orders-worker"+emu+"&topic=orders&ordering=true&exactly_once=true",
		dedupq.ConsumerOptions{Ordered: true, Concurrency: 8})
	if err != nil {
		// Without ordering=true (or on a subscription made without message
		// ordering) the error matches dedupq.ErrOrderingUnsupported.
		fmt.Println(err)
		return
	}
	defer con.Close(ctx)
	for i := 1; i <= 3; i++ {
		if _, err := pub.Publish(ctx, &dedupq.Message{ID: fmt.Sprintf("order-%d", i), Body: []byte("…"), GroupKey: "customer-7"}); err != nil {
			fmt.Println(err)
			return
		}
	}
	_ = con.Run(ctx, func(_ context.Context, d *dedupq.Delivery) error {
		fmt.Println(d.Message.GroupKey, d.Message.ID) // order-1, order-2, order-3, one at a time
		return nil
	})
}
